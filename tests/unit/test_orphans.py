"""What a bls-serve killed outright leaves, and the next one on the same repository ends: a
python stub whose tritonserver and bls-serve are gone (found by the region prefix bls-serve
gave it, in the stub's argv as Triton 2.51 lays it out), and the regions of stubs that ended.
A stand-in stub here: this Python, under the stub's name, with the stub's argv."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bls_pipeline.serve import processes
from bls_pipeline.adapter.queue_waits import WAIT_PREFIX
from bls_pipeline.serve.processes import SHM_PREFIX


def _dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


@pytest.fixture
def repo(tmp_path) -> Path:
    model = tmp_path / "models" / "classify_bls" / "1"
    model.mkdir(parents=True)
    (model / "model.py").write_text("import time\ntime.sleep(300)\n")
    return tmp_path / "models"


def _stand_in(tmp_path: Path, repo: Path, owner: int, parent: int,
              other_repo: bool = False) -> tuple[subprocess.Popen, Path]:
    link = tmp_path / "triton_python_backend_stub"  # its name is its comm, as a real stub's
    if not link.exists():
        link.symlink_to(sys.executable)
    mark = processes._mark(str(repo.resolve() if not other_repo else repo.parent / "elsewhere"))
    region = Path("/dev/shm") / f"{SHM_PREFIX}bls{owner}_{mark}_abcdef_{os.getpid()}-{parent}"
    region.write_bytes(b"\0" * 64)
    proc = subprocess.Popen([str(link), str(repo.resolve() / "classify_bls" / "1" / "model.py"), region.name, "1048576",
                             "1048576", str(parent), "/opt/tritonserver", "0", "classify_bls_0_0", ""])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}/comm").read_text().strip() != "triton_python_b":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return proc, region


def test_a_stub_whose_bls_serve_and_tritonserver_died_is_an_orphan_and_is_ended(tmp_path, repo, caplog):
    dead = _dead_pid()
    proc, region = _stand_in(tmp_path, repo, owner=dead, parent=dead)
    try:
        assert [o.pid for o in processes.orphan_stubs(repo)] == [proc.pid]
        assert [o.pid for o in processes.end_orphans(repo)] == [proc.pid]
        assert proc.wait(timeout=10) == -signal.SIGKILL and not region.exists()
        assert "ended an orphan python stub of a bls-serve that died" in caplog.text
    finally:
        proc.kill()
        proc.wait()
        region.unlink(missing_ok=True)


def test_a_stub_of_a_live_bls_serve_or_of_another_repository_is_left_alone(tmp_path, repo):
    dead = _dead_pid()
    alive, alive_region = _stand_in(tmp_path, repo, owner=os.getpid(), parent=dead)  # its bls-serve lives
    other, other_region = _stand_in(tmp_path, repo, owner=dead, parent=dead, other_repo=True)
    try:
        assert processes.orphan_stubs(repo) == []  # the other's model path is in this repository, its region is not
        assert [o.pid for o in processes.orphan_stubs(None)] == [other.pid]
        processes.end_orphans(repo)
        assert alive.poll() is None and other.poll() is None and alive_region.exists() and other_region.exists()
    finally:
        for proc, region in ((alive, alive_region), (other, other_region)):
            proc.kill()
            proc.wait()
            region.unlink(missing_ok=True)


def _dead_owners_file_removed(repo: Path, name) -> None:
    """end_orphans removes /dev/shm/name(pid) of a pid no longer running and keeps this live
    process's."""
    gone, live = (Path("/dev/shm") / name(pid) for pid in (_dead_pid(), os.getpid()))
    for path in (gone, live):
        path.write_bytes(b"\0")
    try:
        processes.end_orphans(repo)
        assert not gone.exists() and live.exists()
    finally:
        gone.unlink(missing_ok=True)
        live.unlink(missing_ok=True)


def test_regions_a_dead_bls_serve_left_on_this_repository_are_removed(tmp_path, repo):
    mark = processes._mark(str(repo.resolve()))
    _dead_owners_file_removed(repo, lambda pid: f"{SHM_PREFIX}bls{pid}_{mark}_abcdef_{os.getpid()}-{pid}")


def test_die_with_parent_asks_for_sigkill_when_the_parent_thread_ends(tmp_path):
    """The child of a thread that ends gets SIGKILL (what a bls-serve killed does to its tritonserver)."""
    import threading

    started = []

    def start():
        started.append(subprocess.Popen(["sleep", "30"], preexec_fn=processes.die_with_parent(os.getpid())))
    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    assert started[0].wait(timeout=10) == -signal.SIGKILL


def test_queue_wait_files_of_a_tritonserver_no_longer_running_are_removed(repo):
    _dead_owners_file_removed(repo, lambda pid: f"{WAIT_PREFIX}{pid}_classify_bls")
