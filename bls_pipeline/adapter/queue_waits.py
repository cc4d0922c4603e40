"""What Triton measured of each model's queue, shared by bls-serve (the writer: it reads
Triton's statistics, serve/queue_monitor.py) with every flow instance (the readers: each a
python stub process, runtime/admit/admission.py decides on it). One small file per model in
/dev/shm, keyed by the server's pid (the stubs' parent) and the model's name; bls-serve
makes them and removes them at its stop. A server started without bls-serve has none: its
flows then know no queue wait, and refuse nothing on one.

Layout: a sequence number, then the reading's three numbers. The writer makes the sequence
odd while it writes and even after; a reader that sees it odd or changed reads again
(a seqlock: one writer, readers never block it)."""

from __future__ import annotations

import mmap
import os
import struct
import time
from pathlib import Path

from ..runtime.admit.admission import QueueReading

__all__ = ["QueueWaitReader", "QueueWaitWriter", "QueueWaits", "WAIT_PREFIX", "wait_file_server"]

WAIT_PREFIX = "bls_wait_"
_SEQ = struct.Struct("<Q")
_READING = struct.Struct("<ddd")  # at, wait_s, requests
_SIZE = _SEQ.size + _READING.size
_LOOK_AGAIN_S = 1.0  # a reader whose file is not there yet looks for it again after this long


def wait_path(model: str, server_pid: int, folder: Path) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)
    return Path(folder) / f"{WAIT_PREFIX}{server_pid}_{safe}"


def wait_file_server(name: str) -> int | None:
    """The tritonserver pid a queue-wait file's name (wait_path's) carries; None: not one."""
    server, sep, _ = name.removeprefix(WAIT_PREFIX).partition("_") if name.startswith(WAIT_PREFIX) else ("", "", "")
    return int(server) if sep and server.isdigit() else None


class QueueWaitWriter:
    """bls-serve's side: write() a model's latest reading (its file made on first use),
    close() removes every file it made."""

    def __init__(self, server_pid: int, folder: Path = Path("/dev/shm")):
        self.server_pid, self.folder = server_pid, Path(folder)
        self._maps: dict[str, tuple[Path, mmap.mmap]] = {}

    def write(self, model: str, reading: QueueReading) -> None:
        if model not in self._maps:
            path = wait_path(model, self.server_pid, self.folder)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                os.ftruncate(fd, _SIZE)
                self._maps[model] = (path, mmap.mmap(fd, _SIZE))
            finally:
                os.close(fd)
        buf = self._maps[model][1]
        seq = _SEQ.unpack_from(buf, 0)[0]
        _SEQ.pack_into(buf, 0, seq + 1 if seq % 2 == 0 else seq + 2)  # odd: being written
        _READING.pack_into(buf, _SEQ.size, reading.at, reading.wait_s, float(reading.requests))
        _SEQ.pack_into(buf, 0, _SEQ.unpack_from(buf, 0)[0] + 1)  # even: whole

    def close(self) -> None:
        for path, buf in self._maps.values():
            buf.close()
            path.unlink(missing_ok=True)
        self._maps.clear()


class QueueWaitReader:
    """A flow instance's side: read() its model's latest reading, or None while bls-serve has
    written none (or runs nowhere)."""

    def __init__(self, model: str, server_pid: int | None = None, folder: Path = Path("/dev/shm"),
                 clock=time.monotonic):
        self.path = wait_path(model, server_pid if server_pid is not None else os.getppid(), folder)
        self.clock = clock
        self._map: mmap.mmap | None = None
        self._looked = -float("inf")

    def read(self) -> QueueReading | None:
        if self._map is None and not self._open():
            return None
        for _ in range(4):
            before = _SEQ.unpack_from(self._map, 0)[0]
            if before % 2:
                continue
            values = _READING.unpack_from(self._map, _SEQ.size)
            if _SEQ.unpack_from(self._map, 0)[0] == before:
                if before == 0:
                    return None  # made, never written
                at, wait_s, requests = values
                return QueueReading(at, wait_s, int(requests))
        return None  # being written each time: no reading this once

    def _open(self) -> bool:
        now = self.clock()
        if now - self._looked < _LOOK_AGAIN_S:
            return False
        self._looked = now
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            if os.fstat(fd).st_size < _SIZE:
                return False
            self._map = mmap.mmap(fd, _SIZE, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        return True

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


class QueueWaits:
    """A flow instance's readers, one per model it asks about (its own queue, its children's),
    made on first use: read(model) is that model's latest reading, or None."""

    def __init__(self, server_pid: int | None = None, folder: Path = Path("/dev/shm"), clock=time.monotonic):
        self._server_pid, self._folder, self._clock = server_pid, Path(folder), clock
        self._readers: dict[str, QueueWaitReader] = {}

    def read(self, model: str) -> QueueReading | None:
        reader = self._readers.get(model)
        if reader is None:
            reader = self._readers[model] = QueueWaitReader(model, self._server_pid, self._folder, self._clock)
        return reader.read()

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
