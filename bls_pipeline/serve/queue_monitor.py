"""Triton's measure of each model's queue, read every POLL_S and handed to the flows.

Triton's statistics extension counts, per model, how many requests left its queue and how
long they waited there in all (`inference_stats.queue`: each request's wait, from its arrival
to the start of its execute(), reported once it is answered). The difference between two
readings is what the requests of that window waited on average: a measured wait, not a
bound. QueueWindows turns the readings into admission.QueueReading; QueueMonitor polls
tritonserver and writes them where the flows read them (adapter/queue_waits.py). One GET of
every model's statistics per poll, on a kept-alive connection."""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from typing import Callable

from ..adapter.queue_waits import QueueWaitWriter
from ..base.statistics import summed
from ..runtime.admit.admission import QueueReading

__all__ = ["POLL_S", "QueueMonitor", "QueueWindows"]

log = logging.getLogger(__name__)

POLL_S = 0.1  # one window


class QueueWindows:
    """Cumulative (count, wait ns) per model in, QueueReading out: the mean wait of the
    requests that left the queue since the last reading. A window in which no request left
    the queue says nothing of it (an execute() still running): the last reading stands, and
    grows stale (QueueReading.fresh)."""

    def __init__(self):
        self._last: dict[str, tuple[int, int]] = {}

    def add(self, model: str, now: float, count: int, wait_ns: int) -> QueueReading | None:
        last = self._last.get(model)
        self._last[model] = (count, wait_ns)
        if last is None or count <= last[0]:  # first reading, nobody left the queue, or loaded anew
            return None
        return QueueReading(at=now, wait_s=(wait_ns - last[1]) / 1e9 / (count - last[0]), requests=count - last[0])


def queue_totals(stats: dict) -> dict[str, tuple[int, int]]:
    """{model: (requests that left its queue, their wait in ns)} from Triton's statistics
    (/v2/models/stats), its versions added up."""
    ns = summed(stats, "queue", "ns")
    return {model: (count, ns[model]) for model, count in summed(stats, "queue").items()}


class QueueMonitor:
    """A thread that reads tritonserver's statistics every POLL_S and writes each model's
    QueueReading for its flows; stop() ends it and removes what it wrote."""

    def __init__(self, http_url: str, server_pid: int, clock: Callable[[], float] = time.monotonic,
                 poll_s: float = POLL_S):
        self.http_url, self.clock, self.poll_s = http_url, clock, poll_s
        self.windows = QueueWindows()
        self.writer = QueueWaitWriter(server_pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bls-queue-monitor", daemon=True)
        self._conn: http.client.HTTPConnection | None = None

    def start(self) -> None:
        self._thread.start()

    def halt(self) -> None:
        """Poll no more (stop() then waits for a poll under way, each bounded by its timeout)."""
        self._stop.set()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)
        if self._conn is not None:
            self._conn.close()
        self.writer.close()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            stats = self._stats()
            if stats is None:
                continue
            now = self.clock()
            for model, (count, ns) in queue_totals(stats).items():
                reading = self.windows.add(model, now, count, ns)
                if reading is not None:
                    self.writer.write(model, reading)

    def _stats(self) -> dict | None:
        """Every model's statistics, or None while tritonserver does not answer (starting,
        stopping): then nothing is written, and the flows' readings grow stale."""
        try:
            if self._conn is None:
                host, _, port = self.http_url.rpartition(":")
                self._conn = http.client.HTTPConnection(host, int(port), timeout=2)
            self._conn.request("GET", "/v2/models/stats")
            response = self._conn.getresponse()
            body = response.read()
            return json.loads(body) if response.status == 200 else None
        except (OSError, http.client.HTTPException, ValueError):
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            return None
