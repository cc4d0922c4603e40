"""Where the branches are decided: which classifier answers, which images get a second look.

Pure functions and one small stateful chooser; no Triton imports.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

__all__ = ["ClassifierChooser", "route_label", "low_confidence"]

# Branch names as they appear in ROUTE ("<classifier>:<branch>").
DIRECT = "direct"  # the main classifier answered alone
FLIP_TTA = "flip_tta"  # main classifier, low confidence: flipped second pass averaged in
CONFIDENT = "confident"  # cascade: the cheap classifier was sure enough
ESCALATED = "escalated"  # cascade: the cheap one was unsure, the main classifier decided
DEGRADED = "degraded"  # cascade: unsure, but no main classifier was ready; the cheap answer stands


def route_label(classifier: str, branch: str) -> str:
    return f"{classifier}:{branch}"


def low_confidence(probs: np.ndarray, threshold: float) -> np.ndarray:
    """Boolean mask of rows whose top-1 probability is under `threshold` (0 disables)."""
    if threshold <= 0:
        return np.zeros(len(probs), dtype=bool)
    return probs.max(axis=1) < threshold


class ClassifierChooser:
    """The first READY model of an ordered preference list.

    The answer is cached; it is looked up again after `recheck_s` (so a preferred model
    that comes back is used again) or at once after `invalidate()` (a call failed
    because the model went away). `is_ready` is the only contact with the server.
    """

    def __init__(self, preference: tuple[str, ...], is_ready: Callable[[str], bool], recheck_s: float,
                 clock: Callable[[], float] = time.monotonic):
        if not preference:
            raise ValueError("at least one classifier is needed")
        self.preference = preference
        self._is_ready = is_ready
        self._recheck_s = recheck_s
        self._clock = clock
        self._current: str | None = None
        self._checked_at = float("-inf")

    def choose(self, exclude: tuple[str, ...] = ()) -> str | None:
        now = self._clock()
        stale = now - self._checked_at >= self._recheck_s
        if self._current is None or stale or self._current in exclude:
            self._current = next((m for m in self.preference if m not in exclude and self._is_ready(m)), None)
            self._checked_at = now
        return self._current

    def invalidate(self) -> None:
        self._current = None
