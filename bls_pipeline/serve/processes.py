"""A running tritonserver's python stubs, found in its process group by the model instance
each one serves (the watchdog, the launcher's stop, bls-footprint and the soak test look at
them), and the reaping of what a killed or crashed tritonserver leaves.

A stub is tritonserver's child. On Triton 2.51 only the unload of the model copy it serves
reaps it: a stub that died (killed, OOM) while its copy is loaded stays a zombie, with no
command line left to name its instance. When tritonserver itself dies, its stubs go to the
nearest child subreaper: bls-serve (become_subreaper), else init."""

from __future__ import annotations

import ctypes
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Stubs", "become_subreaper", "destruction_began", "is_subreaper", "model_of", "reap_group", "stub_instances", "stubs"]

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37  # prctl(2), Linux

_STUB = b"triton_python_backend_stub"
_STUB_COMM = _STUB.decode()[:15]  # the kernel keeps 15 characters of a process's name
_INSTANCE_ARG = 8  # the stub's argv: ..., then the model instance name ("classify_bls_0_1")


@dataclass(frozen=True)
class Stubs:
    live: dict[int, str]  # pid -> model instance ("classify_bls_0_1")
    dead: frozenset[int]  # pids of stubs that died and that Triton has not reaped (zombies)
    # pids of stubs exiting: their memory, argv included, is gone, and they are not zombies yet
    dying: frozenset[int] = frozenset()


def stubs(pgid: int) -> Stubs:
    """The python stubs in process group `pgid` (tritonserver's pid: the launcher starts it
    as a group leader), live and dead."""
    live, dead, dying = {}, set(), set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            comm, rest = (proc / "stat").read_text().rsplit(")", 1)
            state, ppid, group = rest.split()[:3]
            if int(group) != pgid or int(ppid) != pgid:  # tritonserver's own children only
                continue
            is_stub = comm.split("(", 1)[1] == _STUB_COMM
            if state == "Z":
                if is_stub:
                    dead.add(int(proc.name))
                continue
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if argv[0].endswith(_STUB) and len(argv) > _INSTANCE_ARG:
            live[int(proc.name)] = argv[_INSTANCE_ARG].decode()
        elif is_stub and argv == [b""]:
            dying.add(int(proc.name))
    return Stubs(live, frozenset(dead), frozenset(dying))


def model_of(instance: str) -> str | None:
    """The model of a model instance name ("classify_bls_0_1" -> "classify_bls"); None for
    another name (the stub that completes a model's config at load is named by its model)."""
    m = re.fullmatch(r"(.+)_\d+_\d+", instance)
    return m.group(1) if m else None


def destruction_began(model: str, before: dict[int, str], now: Stubs) -> bool:
    """Triton began to destroy `model`: one of the stubs it had `before` (pid -> instance) has
    exited by `now`. Only where those stubs were one copy's (no instance name twice): a copy
    still finishing after a reload, or one a dead stub left stuck, has stubs of the same
    names, and one of theirs exiting says nothing of this copy."""
    mine = [pid for pid, instance in before.items() if model_of(instance) == model]
    one_copy = len({before[pid] for pid in mine}) == len(mine) > 0
    return one_copy and any(pid not in now.live and pid not in now.dead for pid in mine)


def stub_instances(pgid: int) -> dict[int, str]:
    """pid -> model instance of every live (not zombie) python stub in process group `pgid`."""
    return stubs(pgid).live


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux): the python stubs of
    a tritonserver that died or was killed become its children, for reap_group, instead of
    init's (which reaps them when it gets to it, and not at all when this process is a
    container's PID 1). False where the kernel refuses."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0


def is_subreaper() -> bool:
    flag = ctypes.c_int(0)
    return _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.addressof(flag)) == 0 and flag.value == 1


def reap_group(pgid: int, timeout_s: float) -> list[int]:
    """Reap the processes of group `pgid` that are this process's children (a killed
    tritonserver's stubs, once this process is their subreaper) until none is left; the
    pids still there after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        members = _group(pgid)
        for pid, ppid in members.items():
            if ppid == os.getpid():
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        if not members or time.monotonic() > deadline:
            return sorted(members)
        time.sleep(0.02)


def _group(pgid: int) -> dict[int, int]:
    """pid -> parent pid of every process in group `pgid`."""
    members = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid, group = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1:3]
            except (OSError, IndexError, ValueError):
                continue
            if int(group) == pgid:
                members[int(proc.name)] = int(ppid)
    return members


def _prctl(option: int, arg: int) -> int:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        return -1
