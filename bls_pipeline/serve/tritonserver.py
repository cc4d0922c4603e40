"""`bls-tritonserver`: the tritonserver that bls-serve starts, as a plain command that takes
tritonserver's own flags and nothing else.

For tools that start tritonserver themselves, Model Analyzer's local launch mode above all
(`triton_server_path`). In an NGC container that is the `tritonserver` on PATH; elsewhere the
nvidia-pytriton wheel's, whose python backend needs the stub for this Python beside it. It
is copied once per user and Python into the temporary folder and reused by every later
start, and the process execs tritonserver: the caller's pid, signals and exit status are
tritonserver's own.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from .server import embedded_command

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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        command, env = embedded_command(_workdir())
    except RuntimeError as exc:  # no tritonserver here: say what to install
        print(f"bls-tritonserver: error: {exc}", file=sys.stderr)
        return 2
    os.execve(command[0], [*command, *args], env)
    return 0  # not reached: execve replaced this process


if __name__ == "__main__":
    sys.exit(main())
