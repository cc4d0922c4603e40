"""`bls-tritonserver`: the tritonserver that bls-serve starts, as a plain command that takes
tritonserver's own flags and nothing else.

For tools that start tritonserver themselves, Model Analyzer's local launch mode above all
(`triton_server_path`). In an NGC container that is the `tritonserver` on PATH; elsewhere the
nvidia-pytriton wheel's, whose python backend needs the stub for this Python beside it. It
is copied once per user and Python into the temporary folder and reused by every later
start, and the process execs tritonserver: the caller's pid, signals and exit status are
tritonserver's own.

Before it execs, it checks the models named with --load-model in a local --model-repository
as bls-serve does (serve/repository.py): one that is not there, or cannot load (an engine
not built, a config.pbtxt that does not read), is named with its cause and the command that
builds it, and it exits 2. tritonserver would exit 1 on it, and a tool that started it would
say only that it could not connect.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from . import repository
from ..base.messages import first_line
from .binary import embedded_command

__all__ = ["main"]


def _workdir() -> Path:
    """One folder per user, Python and nvidia-pytriton release, made whole before it is
    used: two starts at once each make their own and the first renamed into place wins."""
    try:
        release = metadata.version("nvidia-pytriton")
    except metadata.PackageNotFoundError:  # an NGC container: its tritonserver needs no copy
        release = ""
    key = hashlib.sha1(f"{sys.executable} {release}".encode()).hexdigest()[:10]
    home = Path(tempfile.gettempdir()) / f"bls-tritonserver-{os.getuid()}-{key}"
    if not home.is_dir():
        fresh = Path(tempfile.mkdtemp(prefix=f".{home.name}.", dir=home.parent))
        embedded_command(fresh)
        try:
            fresh.rename(home)
        except OSError:
            shutil.rmtree(fresh, ignore_errors=True)
    return home


def _flag_values(args: list[str], flag: str) -> list[str]:
    """The values of `--flag=V` and `--flag V` in tritonserver's arguments, in order."""
    values = []
    for i, arg in enumerate(args):
        if arg.startswith(f"{flag}="):
            values.append(arg.split("=", 1)[1])
        elif arg == flag and i + 1 < len(args):
            values.append(args[i + 1])
    return values


def load_problems(args: list[str], command: list[str]) -> dict[str, str]:
    """{model: why it cannot load} for the models `args` name with --load-model in a local
    --model-repository ("*" and remote repositories are left to tritonserver)."""
    repos = [Path(r) for r in _flag_values(args, "--model-repository") + _flag_values(args, "--model-store")]
    names = tuple(dict.fromkeys(n for n in _flag_values(args, "--load-model") if n != "*"))
    if len(repos) != 1 or not repos[0].is_dir() or not names:
        return {}
    root = repos[0]
    problems = {n: f"no folder {n} in the model repository {root}" for n in names if not (root / n).is_dir()}
    present = tuple(n for n in names if n not in problems)
    backend_dir = next(iter(_flag_values(command, "--backend-directory")), "/opt/tritonserver/backends")
    backends = {p.name for p in Path(backend_dir).iterdir() if p.is_dir()} if Path(backend_dir).is_dir() else set()
    if present and backends:
        plan = repository.plan_loading(root, backends, only=present)
        problems.update({n: first_line(why) for n, why in {**plan.broken, **plan.skipped}.items() if n in present})
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        command, env = embedded_command(_workdir())
    except RuntimeError as exc:  # no tritonserver here: say what to install
        print(f"bls-tritonserver: error: {exc}", file=sys.stderr)
        return 2
    problems = load_problems(args, command)
    for model, why in problems.items():
        print(f"bls-tritonserver: error: --load-model={model} cannot load: {why}", file=sys.stderr)
    if problems:
        return 2
    os.execve(command[0], [*command, *args], env)
    return 0  # not reached: execve replaced this process


if __name__ == "__main__":
    sys.exit(main())
