"""Which model of an ordered list answers: the first READY one, looked up again when needed.

Pure: `is_ready` and the clock are the only contact with the server.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["CandidateChooser"]


class CandidateChooser:
    """The first READY model of an ordered preference list.

    The answer is cached; it is looked up again after `recheck_s` (so a preferred model
    that comes back is used again) or at once after `invalidate()` (a call failed
    because the model went away).
    """

    def __init__(self, preference: tuple[str, ...], is_ready: Callable[[str], bool], recheck_s: float,
                 clock: Callable[[], float] = time.monotonic):
        if not preference:
            raise ValueError("at least one model is needed")
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
