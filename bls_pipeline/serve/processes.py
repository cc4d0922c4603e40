"""A running tritonserver's python stubs, found in its process group by the model instance
each one serves (the watchdog, the launcher's stop, bls-footprint and the soak test look at
them), and the reaping of what a killed or crashed tritonserver leaves.

A stub is tritonserver's child. On Triton 2.51 only the unload of the model copy it serves
reaps it: a stub that died (killed, OOM) while its copy is loaded stays a zombie, with no
command line left to name its instance. When tritonserver itself dies, its stubs go to the
nearest child subreaper: bls-serve (become_subreaper), else init. A bls-serve that was itself
killed leaves its tritonserver to die with it (die_with_parent) and the stubs to exit once
they see their parent gone; a stub that cannot (stuck on a region its dead parent held) is
an orphan, found by the next bls-serve on the same repository by the region prefix its
owner gave it (orphan_stubs) and ended (end_orphans)."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from ..adapter.queue_waits import WAIT_PREFIX, wait_file_server
from .workarounds import STUB_ARGV

__all__ = ["SHM_PREFIX", "Stubs", "become_subreaper", "destruction_began", "die_with_parent", "end_orphans",
           "is_subreaper", "model_of", "orphan_stubs", "reap_group", "shm_prefix", "stubs"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 1, 36, 37  # prctl(2), Linux

_STUB = b"triton_python_backend_stub"
_STUB_COMM = _STUB.decode()[:15]  # the kernel keeps 15 characters of a process's name
# The python backend's default region prefix; bls-serve's own (shm_prefix) adds "bls<its pid>_<token>_".
SHM_PREFIX = "triton_python_backend_shm_region_"
_OWNED = re.compile(rf"{re.escape(SHM_PREFIX)}bls(?P<owner>\d+)_(?P<repository>[0-9a-f]{{6}})_[0-9a-f]+_")


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
        if argv[0].endswith(_STUB) and len(argv) > STUB_ARGV.instance:
            live[int(proc.name)] = argv[STUB_ARGV.instance].decode()
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


def shm_prefix(token: str, repository: str) -> str:
    """The python backend's region prefix for the tritonserver this process starts: its pid
    and its repository's mark in it, so that the next bls-serve on that repository knows the
    regions (and the stubs) of one that died, and leaves alone those of others."""
    return f"{SHM_PREFIX}bls{os.getpid()}_{_mark(repository)}_{token}_"


def _mark(repository: str) -> str:
    return hashlib.sha1(str(repository).encode()).hexdigest()[:6]


@dataclass(frozen=True)
class Orphan:
    pid: int
    region: str  # its shared-memory region's name (under /dev/shm)
    model_path: str


def orphan_stubs(repository: Path | None) -> list[Orphan]:
    """Python stubs a dead bls-serve left behind: their region carries the prefix shm_prefix
    gave them, the bls-serve it names is gone, and so is the tritonserver that started them;
    only those serving a model of `repository` (None: any), so that a bls-serve never ends
    another's."""
    root = str(Path(repository).resolve()) if repository is not None else None
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "comm").read_text().strip() != _STUB_COMM:
                continue
            argv = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0")]
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if len(argv) <= STUB_ARGV.instance:
            continue
        owned = _OWNED.match(argv[STUB_ARGV.shm_region])
        parent = argv[STUB_ARGV.parent_pid]
        if (owned is None or _alive(int(owned.group("owner"))) or (parent.isdigit() and ppid == int(parent))
                or (root is not None and (owned["repository"] != _mark(root)
                                          or not argv[STUB_ARGV.model_path].startswith(root + os.sep)))):
            continue
        found.append(Orphan(int(proc.name), argv[STUB_ARGV.shm_region], argv[STUB_ARGV.model_path]))
    return found


def end_orphans(repository: Path | str) -> list[Orphan]:
    """SIGKILL the orphan stubs of `repository` and remove their regions, the regions left by
    a bls-serve on it that died (its stubs gone: nothing maps them), and the queue-wait files
    of any tritonserver no longer running; the stubs ended."""
    orphans = orphan_stubs(Path(repository))
    for orphan in orphans:
        try:
            os.kill(orphan.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        (Path("/dev/shm") / orphan.region).unlink(missing_ok=True)
        log.warning("ended an orphan python stub of a bls-serve that died (pid %d, %s, region %s)", orphan.pid,
                    orphan.model_path, orphan.region)
    mark = _mark(str(Path(repository).resolve()))
    left = [p for p in Path("/dev/shm").glob(f"{SHM_PREFIX}bls*") if (m := _OWNED.match(p.name))
            and m["repository"] == mark and not _alive(int(m["owner"]))]
    for region in left:
        region.unlink(missing_ok=True)
    if left:
        log.warning("removed %d shared-memory region(s) a bls-serve that died on this repository left", len(left))
    waits = [p for p in Path("/dev/shm").glob(f"{WAIT_PREFIX}*")
             if (server := wait_file_server(p.name)) is not None and not _alive(server)]
    for path in waits:
        path.unlink(missing_ok=True)
    if waits:
        log.warning("removed %d queue-wait file(s) of tritonservers no longer running", len(waits))
    return orphans



def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return (Path(f"/proc/{pid}/stat").is_file()
            and (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"))


_LIBC_PRCTL = None
try:
    _LIBC_PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    pass


def die_with_parent(parent: int):
    """A preexec_fn for subprocess: the child gets SIGKILL when the thread that started it
    ends (a bls-serve killed with SIGKILL: its tritonserver goes too). Resolved before the
    fork, so the child only makes one call; one whose parent died before that call exits."""

    def preexec() -> None:
        if _LIBC_PRCTL is not None:
            _LIBC_PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _prctl(option: int, arg: int) -> int:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        return -1
