"""An engine held only while it answers: what a standby model runs.

A fallback behind a READY candidate (efficientnet_lite0_onnx behind efficientnet_lite0_int8)
answers nothing until that candidate goes away, yet a loaded onnxruntime session holds its
weights, and after one batch its arena too. A standby engine opens once at load, so that
its file is checked against the config there (a mismatch still fails the load), then lets
go of it. The first call opens it again (a tenth to a third of a second for the shipped
classifiers on 2 cores), and once no call came for `release_after_s` it lets go again.

Pure: `open_engine` builds the engine (OnnxModel, OpenVinoModel); the clock is injected.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
import time
from typing import Any, Callable

import numpy as np

__all__ = ["StandbyEngine", "give_memory_back"]

log = logging.getLogger(__name__)


def give_memory_back() -> None:
    """Return freed heap pages to the system (glibc keeps them for reuse otherwise, and a
    released session would still show as the process's private memory)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator decides
        pass


class StandbyEngine:
    """`run` as the engine's, opening it when it is closed; `release_if_idle` closes it."""

    def __init__(self, name: str, open_engine: Callable[[], Any], release_after_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.release_after_s = release_after_s
        self._open_engine = open_engine
        self._clock = clock
        self._lock = threading.Lock()  # execute() and the releasing thread
        self._engine = open_engine()  # the load's check: the file against the config
        self.inputs, self.outputs = self._engine.inputs, self._engine.outputs
        self._last_call = float("-inf")
        self.opened = 0  # times opened for a call
        self._release()
        log.info("%s is on standby: its engine was checked and released; the first call opens it again", name)

    @property
    def is_open(self) -> bool:
        return self._engine is not None

    def run(self, feeds: dict[str, np.ndarray], outputs=None) -> dict[str, np.ndarray]:
        with self._lock:
            if self._engine is None:
                started = time.perf_counter()
                self._engine = self._open_engine()
                self.opened += 1
                log.warning("%s takes calls: its engine opened in %.2f s (standby; released again after %g s "
                            "without a call)", self.name, time.perf_counter() - started, self.release_after_s)
            try:
                return self._engine.run(feeds, outputs)
            finally:
                self._last_call = self._clock()

    def release_if_idle(self) -> bool:
        """Close the engine when no call came for release_after_s; True when it did."""
        with self._lock:
            if self._engine is None or self._clock() - self._last_call < self.release_after_s:
                return False
            self._release()
        log.info("%s is on standby again: no call for %g s, its engine was released", self.name, self.release_after_s)
        return True

    def _release(self) -> None:
        self._engine = None
        give_memory_back()
