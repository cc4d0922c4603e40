"""Shadow and canary: a candidate model, or another version of a model, tried on live
traffic beside the stable one before it answers anyone.

Both are flow-model parameters naming a pair `stable=candidate` (a candidate is `model` or
`model@version`) and a share:

    shadow: "resnet50_onnx=resnet50_onnx@2"   shadow_share: "1.0"
        That share of the classify() calls answered by the stable model are mirrored to the
        candidate, on the same rows and inputs, on a background thread. The mirrored call's
        result never reaches an answer, its failure never fails a request, and no answer
        waits for it: the wait bound is zero. At most `shadow_max_in_flight` mirrored calls
        are in flight per flow-model instance; a call past that is not mirrored (counted
        as skipped), so a slow candidate costs no memory without bound.
    canary: "resnet50_onnx=resnet50_onnx@2"   canary_share: "0.1"
        That share of the calls the stable model would answer go to the candidate instead,
        all rows of the call; so, in expectation, that share of rows. ROUTE names the
        candidate (`resnet50_onnx@2:direct`). A canary call that fails, for any reason, is
        sent to the stable model, like any candidate.

A version named as a candidate is not called as the stable one: while version 2 is on
trial, the flow's stable calls go to the newest other READY version, and to version 2 only
when no other is READY (a promotion that retired version 1 before this flow copy was
replaced), rather than failing.

Per pair, the shadow counts: calls compared, failed and skipped, rows, rows whose top-1
agree, the top-5 overlap summed over rows (|both top-5s| / 5), the rows whose stable top-1
probability moved by at most each of SCORE_DIFF_BOUNDS, and the seconds of each side. A
call drawn while the candidate is not READY is not mirrored (counted as unready).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

__all__ = ["PairStats", "SCORE_DIFF_BOUNDS", "Shadow", "Trial", "compare"]

log = logging.getLogger(__name__)

# Upper bounds of the score-difference histogram (cumulative, Prometheus-style; +Inf last).
SCORE_DIFF_BOUNDS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, float("inf"))


@dataclass(frozen=True)
class Trial:
    """A candidate tried beside a stable model, on `share` of its calls."""

    stable: str
    model: str
    version: str  # "": whichever version Triton picks (its newest READY)
    share: float

    @property
    def candidate(self) -> str:
        """The candidate as ROUTE and the metrics name it: model, or model@version."""
        return f"{self.model}@{self.version}" if self.version else self.model


def compare(stable: np.ndarray, candidate: np.ndarray) -> tuple[int, float, list[int]]:
    """Two classifiers' probabilities for the same rows: (rows whose top-1 agree, the top-5
    overlap summed over rows, rows whose stable top-1 probability moved by at most each
    SCORE_DIFF_BOUNDS)."""
    k = min(5, stable.shape[1])
    top1_s, top1_c = stable.argmax(axis=1), candidate.argmax(axis=1)
    top_s = np.argpartition(-stable, k - 1, axis=1)[:, :k]
    top_c = np.argpartition(-candidate, k - 1, axis=1)[:, :k]
    overlap = sum(len(np.intersect1d(a, b)) for a, b in zip(top_s, top_c)) / k
    rows = np.arange(len(stable))
    diff = np.abs(stable[rows, top1_s] - candidate[rows, top1_s])
    return int((top1_s == top1_c).sum()), float(overlap), [int((diff <= b).sum()) for b in SCORE_DIFF_BOUNDS]


@dataclass
class PairStats:
    """What the shadow saw for one (stable, candidate) pair since the last drain."""

    compared: int = 0  # mirrored calls compared with the stable answer
    failed: int = 0  # mirrored calls that failed (or whose stable call failed)
    skipped: int = 0  # calls not mirrored: shadow_max_in_flight reached
    unready: int = 0  # calls not mirrored: the candidate was not READY
    rows: int = 0
    top1_agree: int = 0
    top5_overlap: float = 0.0
    score_diff: list[int] = field(default_factory=lambda: [0] * len(SCORE_DIFF_BOUNDS))
    stable_seconds: float = 0.0
    candidate_seconds: float = 0.0


class Shadow:
    """Runs mirrored calls off the answer's path and keeps their statistics.

    The mirrored calls run one at a time on one background thread, through a transport of
    their own (the flow instance's stays with execute())."""

    def __init__(self, trial: Trial, max_in_flight: int, seed: int | None = None):
        self.trial = trial
        self._max = max_in_flight
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._in_flight = 0
        self._stats = PairStats()
        self._pair: tuple[str, str] = (trial.stable, trial.candidate)
        self._rng = random.Random(seed)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def wanted(self, ready: Callable[[], bool]) -> bool:
        """Whether this call is mirrored: drawn at shadow_share, the candidate READY, a slot free."""
        if self._rng.random() >= self.trial.share:
            return False
        if not ready():
            with self._lock:
                self._stats.unready += 1
            return False
        with self._lock:
            if self._in_flight >= self._max:
                self._stats.skipped += 1
                return False
            self._in_flight += 1
            return True

    def mirror(self, run_call: Callable[[], object], to_probs: Callable[[object], np.ndarray],
               background: bool) -> "Mirrored":
        """The mirrored call (run_call: sends it, returns its parts or an exception), started
        now on the background thread; the returned handle takes the stable answer once the
        real call is back. background=False (LocalFlow): it runs when the stable answer is
        handed over, in the caller's thread, so a test sees its statistics at once."""
        handle = Mirrored()
        if not background:
            handle.then(lambda: self._finish(handle, run_call, to_probs))
            return handle
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shadow")
        self._pool.submit(self._finish, handle, run_call, to_probs)
        return handle

    def _finish(self, handle: "Mirrored", run_call, to_probs) -> None:
        try:
            t0 = time.perf_counter()
            parts = run_call()
            seconds = time.perf_counter() - t0
            candidate = None if isinstance(parts, BaseException) else to_probs(parts)
            if candidate is None:
                log.info("shadow %s failed: %s", self.trial.candidate, parts)
            stable, stable_seconds = handle.wait()
            self._record(stable, candidate, stable_seconds, seconds)
        except Exception as exc:  # noqa: BLE001 - a shadow never fails anything
            log.warning("shadow %s: %s", self.trial.candidate, exc)
            self._record(None, None, 0.0, 0.0)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _record(self, stable, candidate, stable_seconds: float, seconds: float) -> None:
        with self._lock:
            s = self._stats
            if stable is None or candidate is None or stable.shape != candidate.shape:
                s.failed += 1
                return
            agree, overlap, within = compare(stable, candidate)
            s.compared += 1
            s.rows += len(stable)
            s.top1_agree += agree
            s.top5_overlap += overlap
            s.score_diff = [a + b for a, b in zip(s.score_diff, within)]
            s.stable_seconds += stable_seconds
            s.candidate_seconds += seconds

    def drain(self) -> dict[tuple[str, str], PairStats]:
        """The statistics gathered since the last drain, by (stable, candidate); reset."""
        with self._lock:
            stats, self._stats = self._stats, PairStats()
        empty = stats == PairStats()
        return {} if empty else {self._pair: stats}


class Mirrored:
    """The stable side of one mirrored call, handed over by the thread that made it."""

    _WAIT_S = 60.0  # the stable call is always answered or failed well before this

    def __init__(self):
        self._done = threading.Event()
        self._stable: np.ndarray | None = None
        self._seconds = 0.0
        self._then: Callable[[], None] | None = None

    @property
    def done(self) -> bool:
        """Whether the stable answer (or its failure) was handed over."""
        return self._done.is_set()

    def then(self, job: Callable[[], None]) -> None:
        """Run `job` in the thread that hands the stable answer over, once it has."""
        self._then = job

    def stable(self, probs: np.ndarray | None, seconds: float) -> None:
        """The stable call's probabilities for the same rows (None: it failed)."""
        self._stable, self._seconds = probs, seconds
        self._done.set()
        if self._then is not None:
            self._then()

    def wait(self) -> tuple[np.ndarray | None, float]:
        self._done.wait(self._WAIT_S)
        return self._stable, self._seconds
