"""The tritonserver that bls-serve starts: one on PATH (an NGC container), else the binary in
the nvidia-pytriton wheel, with its python backend and the stub for this Python copied into a
work folder, and the environment the stubs need to import this Python's packages.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Binary", "available_backends", "embedded_command", "find_binary", "has_gpu"]


@dataclass(frozen=True)
class Binary:
    executable: Path
    backend_dir: Path | None  # None: the binary's own default (/opt/tritonserver/backends)
    env: dict[str, str]
    is_embedded: bool


def find_binary(workdir: Path, python: Path | None = None) -> Binary:
    env = dict(os.environ)
    # The python stub embeds libpython with an isolated config (PYTHONPATH is ignored) and
    # finds its prefix from the first `python3` on PATH: put this interpreter's bin first,
    # so models import the same bls_pipeline, numpy and torch (a venv's included).
    if python is not None:
        _check_same_version(Path(python))
    env["PATH"] = os.pathsep.join([str(Path(python or sys.executable).parent), env.get("PATH", "")])
    # glibc malloc gives every busy thread its own arena, and Triton runs many threads:
    # cap them (set MALLOC_ARENA_MAX yourself to override). The soak test reports the
    # resident memory this leaves (tests/integration/test_metrics_and_soak.py).
    env.setdefault("MALLOC_ARENA_MAX", "2")
    libdir = sysconfig.get_config_var("LIBDIR") or ""

    on_path = shutil.which("tritonserver")
    if on_path:
        return Binary(Path(on_path), None, env, is_embedded=False)

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "no tritonserver found: none on PATH and the nvidia-pytriton wheel is not installed. "
            "Install it with: pip install 'bls-pipeline[embedded]' (or run inside an NGC tritonserver container)"
        )
    root = Path(spec.submodule_search_locations[0]) / "tritonserver"
    libs = root.parent.parent / "nvidia_pytriton.libs"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise RuntimeError(f"nvidia-pytriton ships no python backend stub for Python {version}")
    # The backend folder must hold the stub for *this* Python next to libtriton_python.so
    # (a workdir that has them already keeps them: a running tritonserver may have them mapped).
    backends = workdir / "backends"
    if not (backends / "python" / "triton_python_backend_stub").is_file():
        shutil.copytree(root / "backends" / "python", backends / "python")
        shutil.copy2(stub, backends / "python" / "triton_python_backend_stub")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, str(libs), env.get("LD_LIBRARY_PATH", "")) if p)
    return Binary(root / "bin" / "tritonserver", backends, env, is_embedded=True)


def embedded_command(workdir: Path) -> tuple[list[str], dict[str, str]]:
    """The tritonserver that bls-serve starts, as a plain command: the executable with the
    flags it needs before any of yours (the embedded one's python backend, copied into
    `workdir` with the stub for this Python, once) and its environment (this Python first on
    PATH, so the models import this environment). For tools that start tritonserver
    themselves: bls-tritonserver, Model Analyzer's local launch mode."""
    binary = find_binary(workdir)
    backend = [] if binary.backend_dir is None else [f"--backend-directory={binary.backend_dir}"]
    return [str(binary.executable), *backend], binary.env


def _check_same_version(python: Path) -> None:
    """The stub is built for this Python's version: another Python must be the same."""
    want = f"{sys.version_info.major}.{sys.version_info.minor}"
    try:
        got = subprocess.run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError as exc:
        raise RuntimeError(f"cannot run the models' Python {python}: {exc}") from None
    if got != want:
        raise RuntimeError(f"the models' Python {python} is {got or 'not a Python'}; the stub here runs Python {want}")


def available_backends(binary: Binary) -> set[str]:
    backend_dir = binary.backend_dir or Path("/opt/tritonserver/backends")
    if not backend_dir.is_dir():
        return {"python"}
    return {p.name for p in backend_dir.iterdir() if p.is_dir()}


def has_gpu() -> bool:
    return Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()
