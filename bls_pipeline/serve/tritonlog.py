"""tritonserver's log, passed on line by line by bls-serve (to the log file, else its own
stderr) and read on the way for what Triton 2.51 says nowhere else:

- a load that failed while a copy of the model serves ("failed to load 'M' version N: ..."):
  Triton keeps that copy READY and its repository index shows no reason (workarounds.py,
  "the silent failed reload"); a later "successfully loaded 'M'" clears it;
- a fatal signal ("Signal (11) received."), after which a 2.51 server may hang in its
  handler: the cause bls-serve names when it kills a server that stopped answering.

LogWatch is pure (lines in, what they said out); LogPump is the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Callable

from .workarounds import LOAD_FAILED, LOADED, TRITON_FATAL

__all__ = ["LoadFailure", "LogPump", "LogWatch"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadFailure:
    model: str
    version: str
    why: str
    at: float  # time.monotonic()


@dataclass
class LogWatch:
    """What tritonserver's log lines said: each model's last failed load (until it loads),
    how many loads failed per model, and the last fatal signal."""
    failing: dict[str, LoadFailure] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    fatal: str | None = None
    on_failure: Callable[[LoadFailure], None] = lambda failure: None

    def read(self, line: str, now: float) -> None:
        found = LOAD_FAILED.search(line)
        if found:
            failure = LoadFailure(found["model"], found["version"], found["why"].replace('\\"', '"'), now)
            self.failing[failure.model] = failure
            self.failures[failure.model] = self.failures.get(failure.model, 0) + 1
            self.on_failure(failure)
            return
        found = LOADED.search(line)
        if found:
            self.failing.pop(found["model"], None)
            return
        found = TRITON_FATAL.search(line)
        if found and found["signal"] not in ("2", "15"):  # SIGINT, SIGTERM: a stop
            self.fatal = line.strip()


class LogPump(threading.Thread):
    """Copies tritonserver's output (`source`, its stdout and stderr) to `sink` as it comes,
    a line at a time, and hands each line to `watch`. Ends at the output's end (every
    process holding the pipe gone)."""

    def __init__(self, source: IO[bytes], sink: IO[bytes], watch: LogWatch,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(name="bls-tritonserver-log", daemon=True)
        self._source, self._sink, self.watch, self._clock = source, sink, watch, clock

    def run(self) -> None:
        try:
            for raw in iter(self._source.readline, b""):
                try:
                    self._sink.write(raw)
                    self._sink.flush()
                except (OSError, ValueError):  # the sink closed (a stop) or broken: the reading goes on
                    pass
                try:
                    self.watch.read(raw.decode(errors="replace"), self._clock())
                except Exception as exc:  # noqa: BLE001 - a line that breaks the watch is only not read
                    log.debug("tritonserver log line not read: %s", exc)
        finally:
            self._source.close()
