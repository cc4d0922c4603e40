"""One number the instances of a flow model share: when one of them last emptied Triton's
queue (runtime/admission.py's QueueWait). Each instance is its own python stub process; the
number lives in a small file in /dev/shm that every instance maps, keyed by the server's
pid (the stubs' parent) and the model's name, and is removed by each instance as it goes
(bls-serve also removes what a killed server left, at its stop)."""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

__all__ = ["SharedStamp", "STAMP_PREFIX"]

STAMP_PREFIX = "bls_queue_"
_DOUBLE = struct.Struct("d")


class SharedStamp:
    """A monotonic-clock time shared by the instances of one model: read() the latest any of
    them wrote, raise() to a later one (an aligned 8-byte write: readers never see half)."""

    def __init__(self, model: str, server_pid: int | None = None, folder: Path = Path("/dev/shm")):
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)
        self.path = Path(folder) / f"{STAMP_PREFIX}{server_pid if server_pid is not None else os.getppid()}_{safe}"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < _DOUBLE.size:
                os.ftruncate(fd, _DOUBLE.size)
            self._map = mmap.mmap(fd, _DOUBLE.size)
        finally:
            os.close(fd)

    def read(self) -> float:
        return _DOUBLE.unpack_from(self._map, 0)[0]

    def raise_to(self, value: float) -> None:
        if value > self.read():
            _DOUBLE.pack_into(self._map, 0, value)

    def close(self) -> None:
        self._map.close()
        self.path.unlink(missing_ok=True)
