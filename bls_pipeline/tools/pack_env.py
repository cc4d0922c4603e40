"""bls-pack-env: a copy of the model repository that a stock Triton serves with no pip install.

The python models import bls_pipeline, numpy, pillow and onnxruntime; a stock tritonserver
(an NGC container started with `-v $PWD/models:/models`, KServe's Triton runtime) has none
of them. This packs them into one execution environment for the target's Python, puts it
in every python model's folder and points the model's config at it (the python backend's
EXECUTION_ENV_PATH, relative to `$$TRITON_MODEL_DIRECTORY`: the only form that works when
Triton copies the folder from S3). The committed repository stays as it is: the output is
a copy.

The environment is a tarball (links and modes survive S3; the backend extracts it) of a
venv-shaped folder: `pyvenv.cfg` naming the target's Python, `bin/python3` pointing at it,
`lib/python3.X/site-packages` holding the packages, and `bin/activate`, which the backend
sources before it starts the stub: the stub's embedded Python finds `python3` first on PATH
in the environment and so takes its site-packages, with the standard library of the Python
that `pyvenv.cfg` names. That Python must be the build whose libpython the stub runs: the
target's for a stock Triton (NGC: /usr/bin/python3.12), this one for the tritonserver on this
machine (`--this-python`). Another build of the same version may keep a module elsewhere
(Debian's python3.11 builds `_struct` into its executable, a default source build such as
pyenv's keeps it in lib-dynload), and the stub fails to import it.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..base.modelconfig import parse_config
from ..serve.paths import checkout

__all__ = ["EXECUTION_ENV_PARAMETER", "PACKAGES", "PackReport", "main", "pack", "this_python"]

log = logging.getLogger(__name__)

EXECUTION_ENV_PARAMETER = "EXECUTION_ENV_PATH"
# What the python models import inside the stub, besides bls_pipeline itself (copied as it
# is: pure Python). tritonclient brings model_config_pb2; no torch (resnet50_torch needs it:
# --extra torch, several GB).
PACKAGES = ("numpy", "pillow", "tqdm", "onnxruntime", "protobuf", "tritonclient")
# NGC tritonserver 25.01 and later (Ubuntu 24.04): Python 3.12 at /usr/bin.
DEFAULT_PYTHON = "3.12"
DEFAULT_PYTHON_HOME = "/usr/bin"
# Wheels for glibc 2.28 and later (each tag named: pip does not infer the older ones).
DEFAULT_PLATFORM = "manylinux_2_28_x86_64,manylinux_2_17_x86_64,manylinux2014_x86_64"

_ACTIVATE = """\
# Sourced by Triton's python backend before it starts a stub (bash): this environment's
# bin first on PATH, so the stub's embedded Python finds pyvenv.cfg and its site-packages.
_bls_env="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$_bls_env/bin:$PATH"
export PYTHONNOUSERSITE=1
unset PYTHONHOME PYTHONPATH
unset _bls_env
"""


class PackError(RuntimeError):
    """What to fix for the environment to be packed."""


@dataclass(frozen=True)
class PackReport:
    output: Path
    tarball: str  # its file name, in each python model's folder
    models: tuple[str, ...]  # the python models whose config now names it
    bytes: int
    needs_more: dict[str, str]  # model -> what it imports that the environment lacks


def this_python() -> tuple[str, str]:
    """(version, home) of this Python, the target of the tritonserver on this machine
    (bls-tritonserver, bls-serve): its python stub runs this Python's libpython, so the
    environment must name this build's executable, whose folder holds its standard library."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    home = Path(sys._base_executable).resolve().parent  # a venv's: the Python it was made from
    if not (home / f"python{version}").exists():
        raise PackError(f"this Python ({sys._base_executable}) has no python{version} beside it in {home}: "
                        f"give --python-version {version} and --python-home with the folder that has it")
    return version, str(home)


def _python_models(repo: Path, only: tuple[str, ...] | None) -> list[str]:
    names = []
    for config_path in sorted(repo.glob("*/config.pbtxt")):
        name = config_path.parent.name
        if only is not None and name not in only:
            continue
        if parse_config(config_path.parent).backend == "python":
            names.append(name)
    return names


def _imports_torch(model_dir: Path) -> bool:
    for source in model_dir.glob("*/*.py"):
        if re.search(r"^\s*(import torch|from torch|from bls_pipeline\.adapter import torch_model)", source.read_text(),
                     re.M):
            return True
    return False


def _pip_install(site: Path, python_version: str, platform: str, packages: list[str], constraints: Path | None) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
           "--target", str(site), "--python-version", python_version, "--implementation", "cp",
           *[f"--platform={tag.strip()}" for tag in platform.split(",")], "--only-binary=:all:", *packages]
    if constraints is not None:
        cmd += ["--constraint", str(constraints)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PackError(f"pip could not install {', '.join(packages)} for Python {python_version} on {platform}:\n"
                        f"{proc.stderr.strip()[-2000:]}")


def _venv_layout(root: Path, python_version: str, python_home: str) -> Path:
    """Everything of the environment but its packages, in `root`; returns its site-packages."""
    site = root / "lib" / f"python{python_version}" / "site-packages"
    site.mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "bin" / "activate").write_text(_ACTIVATE)
    for name in ("python3", f"python{python_version}"):
        (root / "bin" / name).symlink_to(f"{python_home.rstrip('/')}/python{python_version}")
    (root / "pyvenv.cfg").write_text(f"home = {python_home}\ninclude-system-site-packages = false\nversion = "
                                     f"{python_version}\n")
    return site


def _build_env(root: Path, python_version: str, python_home: str, platform: str, extra: list[str],
               constraints: Path | None) -> None:
    site = _venv_layout(root, python_version, python_home)
    _pip_install(site, python_version, platform, [*PACKAGES, *extra], constraints)
    package = Path(__file__).resolve().parents[1]  # bls_pipeline, pure Python: copied as it is
    shutil.copytree(package, site / "bls_pipeline", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _tar(root: Path, target: Path, progress: bool) -> None:
    from tqdm import tqdm

    files = sorted(p for p in root.rglob("*"))
    with tarfile.open(target, "w:gz", compresslevel=3) as tar:
        for path in tqdm(files, desc=f"packing {target.name}", unit="file", disable=not progress):
            tar.add(path, arcname=path.relative_to(root).as_posix(), recursive=False)


def _point_config_at(config_path: Path, value: str) -> None:
    text = config_path.read_text()
    if re.search(rf'key:\s*"{EXECUTION_ENV_PARAMETER}"', text):
        raise PackError(f"{config_path} already sets {EXECUTION_ENV_PARAMETER}: pack from a repository without it")
    text = text.rstrip("\n") + ("\n# Packed by bls-pack-env: the python dependencies, for a Triton with none "
                                "installed.\n"
                                f'parameters {{ key: "{EXECUTION_ENV_PARAMETER}", value: {{ string_value: "{value}" }} '
                                f'}}\n')
    config_path.write_text(text)


def pack(repo: Path, output: Path, *, python_version: str = DEFAULT_PYTHON, python_home: str = DEFAULT_PYTHON_HOME,
         platform: str = DEFAULT_PLATFORM, models: tuple[str, ...] | None = None, extra: tuple[str, ...] = (),
         constraints: Path | None = None, progress: bool = True) -> PackReport:
    """Copy `repo` to `output` and give its python models (or `models` of them) the packed
    environment. `constraints`: a pip constraints file (default: the checkout's requirements.lock)."""
    repo, output = Path(repo), Path(output)
    if not repo.is_dir() or not any(repo.glob("*/config.pbtxt")):
        raise PackError(f"no model repository at {repo}: give a folder of model folders")
    if output.exists():
        raise PackError(f"{output} exists: give a new folder (the packed copy of {repo} goes there)")
    if not re.fullmatch(r"3\.\d+", python_version):
        raise PackError(f"--python-version {python_version!r}: write the target's major.minor, e.g. 3.12")
    if constraints is None and checkout() is not None and (checkout() / "requirements.lock").is_file():
        constraints = checkout() / "requirements.lock"
    names = _python_models(repo, models)
    if models is not None and set(models) - set(names):
        raise PackError(f"not python models of {repo}: {', '.join(sorted(set(models) - set(names)))}")
    tarball = f"bls-env-py{python_version}.tar.gz"
    shutil.copytree(repo, output, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    try:
        with tempfile.TemporaryDirectory(prefix="bls-pack-") as tmp:
            log.info("installing %s for Python %s (%s)", ", ".join([*PACKAGES, *extra]), python_version, platform)
            _build_env(Path(tmp) / "env", python_version, python_home, platform, list(extra), constraints)
            packed = Path(tmp) / tarball
            _tar(Path(tmp) / "env", packed, progress)
            size = packed.stat().st_size
            for name in names:
                target = output / name / tarball
                try:
                    os.link(packed, target)  # one copy on disk; bls-publish uploads each
                except OSError:
                    shutil.copy2(packed, target)
                _point_config_at(output / name / "config.pbtxt", f"$$TRITON_MODEL_DIRECTORY/{tarball}")
    except BaseException:
        shutil.rmtree(output, ignore_errors=True)
        raise
    needs_more = {n: "torch (pack with --extra torch)" for n in names if "torch" not in extra
                  and _imports_torch(output / n)}
    return PackReport(output, tarball, tuple(names), size, needs_more)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bls-pack-env", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                description="Copy a model repository with the python models' dependencies packed in "
                                            "(EXECUTION_ENV_PATH), for a stock Triton with no pip install.")
    p.add_argument("repository", type=Path, help="the model repository (e.g. models)")
    p.add_argument("output", type=Path, help="a new folder for the packed copy")
    p.add_argument("--python-version",
                   help="the Python of the target's python backend stub (NGC 25.01 and later: 3.12; 24.xx: 3.10) "
                        f"(default: {DEFAULT_PYTHON})")
    p.add_argument("--python-home", help="the folder of that Python's executable on the target, the build the stub "
                                         f"runs (default: {DEFAULT_PYTHON_HOME})")
    p.add_argument("--this-python", action="store_true",
                   help="for the tritonserver on this machine (bls-tritonserver, bls-serve), whose stub runs this "
                        "Python: its version and home, instead of --python-version and --python-home")
    p.add_argument("--platform", default=DEFAULT_PLATFORM,
                   help="the target's wheel platforms, comma-separated (aarch64: manylinux_2_28_aarch64)")
    p.add_argument("--models", help="comma-separated python models to pack for (default: all)")
    p.add_argument("--extra", action="append", default=[], help="another package to pack (repeatable): e.g. torch")
    p.add_argument("--constraints", type=Path, help="pip constraints (default: the checkout's requirements.lock)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.this_python and (args.python_version or args.python_home):
            raise PackError("--this-python is this Python's version and home: give it or --python-version and "
                            "--python-home, not both")
        version, home = this_python() if args.this_python else (args.python_version or DEFAULT_PYTHON,
                                                                 args.python_home or DEFAULT_PYTHON_HOME)
        report = pack(args.repository, args.output, python_version=version, python_home=home,
                      platform=args.platform, models=tuple(args.models.split(",")) if args.models else None,
                      extra=tuple(args.extra), constraints=args.constraints)
    except PackError as exc:
        print(f"bls-pack-env: error: {exc}", file=sys.stderr)
        return 2
    print(f"packed {report.tarball} ({report.bytes / 1e6:.0f} MB) into {report.output} for {', '.join(report.models)}: "
          f"Python {version} at {home}")
    for name, what in report.needs_more.items():
        print(f"  WARNING: {name} imports {what}: it will not load from this copy on a stock Triton")
    return 0


if __name__ == "__main__":
    sys.exit(main())
