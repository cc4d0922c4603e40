"""A running tritonserver's python stubs, found in its process group by the model instance
each one serves (the watchdog, bls-footprint and the soak test look at them)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["stub_instances"]

_STUB = b"triton_python_backend_stub"
_INSTANCE_ARG = 8  # the stub's argv: ..., then the model instance name ("classify_bls_0_1")


def stub_instances(pgid: int) -> dict[int, str]:
    """pid -> model instance of every live (not zombie) python stub in process group `pgid`
    (tritonserver's pid: the launcher starts it as a group leader)."""
    stubs = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if argv[0].endswith(_STUB) and len(argv) > _INSTANCE_ARG:
            stubs[int(proc.name)] = argv[_INSTANCE_ARG].decode()
    return stubs
