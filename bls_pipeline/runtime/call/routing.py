"""Which model answers a call: the first READY candidate of an ordered list, its newest READY
version, a canary drawn instead of it, a shadow mirroring it; and how long a call waits for
a model it saw go away. What one flow-model instance knows across its execute()s.

Pure: `is_ready`, the clock and the sleep are the only contact with the server.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Callable

from ..load.settings import RuntimeSettings, Settings
from .trials import Shadow, Trial

__all__ = ["CandidateChooser", "Router"]

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 0.1  # between looks for a model to come back, while a call waits for one


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


class Router:
    """A flow-model instance's view of its children's readiness, kept across execute()s.

    is_ready(model) or is_ready(model, version) asks the server. versions_of(model): its
    version folders, newest first; given, each call names the newest READY version, so a
    ROUTE can say which answered; None: is_ready(model) and the version Triton picks.
    """

    def __init__(self, settings: Settings, options: RuntimeSettings, is_ready: Callable[..., bool],
                 versions_of: Callable[[str], tuple[str, ...]] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.settings, self.options = settings, options
        self._is_ready = is_ready
        self._versions_of = versions_of
        self.clock, self.sleep = clock, sleep
        # Shadow and canary (trials.py). A version on trial is called as the stable one only
        # when no other version is READY.
        trials = [t for t in (options.shadow, options.canary) if t is not None]
        self._on_trial = {(t.model, t.version) for t in trials if t.version}
        self.shadow = Shadow(options.shadow, options.shadow_max_in_flight) if options.shadow else None
        self.canary = options.canary if options.canary and options.canary.share > 0 else None
        self.rng = random.Random()
        # Where mirrored calls go: None sends them through the execute()'s own transport, when
        # the stable answer is back (LocalFlow); the adapter gives them one of their own, used
        # on the shadow's thread while the real call is in flight.
        self.mirror_send = None
        self._serving: dict[str, str] = {}  # model -> the version its last READY check found
        self._lost: dict[str, float] = {}  # model -> when a call found it unable to take it
        self._choosers: dict[tuple[str, ...], CandidateChooser] = {}

    def close(self) -> None:
        if self.shadow is not None:
            self.shadow.close()

    def ready(self, model: str) -> bool:
        """is_ready, with a readiness check that fails (the server shutting down) read as not
        READY. With pinned versions: whether any version is, the newest one noted."""
        try:
            versions = self._versions_of(model) if self._versions_of is not None else ()
            if not versions:  # not pinned, or its folder is not beside this one (S3)
                return bool(self._is_ready(model))
            # A version on trial answers only when no other is READY (its promotion under way).
            ordered = ([v for v in versions if (model, v) not in self._on_trial]
                       + [v for v in versions if (model, v) in self._on_trial])
            version = next((v for v in ordered if self._is_ready(model, v)), None)
            if version is not None:
                self._serving[model] = version
            return version is not None
        except Exception as exc:  # noqa: BLE001 - e.g. pb_utils.TritonModelException while the server stops
            log.warning("could not ask whether %s is READY (%s): taking it as not", model, exc)
            return False

    def trial_ready(self, trial: Trial) -> bool:
        try:
            return bool(self._is_ready(trial.model, trial.version) if trial.version else self._is_ready(trial.model))
        except Exception:  # noqa: BLE001 - as ready(): a failed readiness check is "not READY"
            return False

    def serving_version(self, model: str) -> str:
        """The version of `model` its last READY check found ("" without pinned versions)."""
        return self._serving.get(model, "") if self._versions_of is not None else ""

    def chooser(self, candidates: tuple[str, ...]) -> CandidateChooser:
        chooser = self._choosers.get(candidates)
        if chooser is None:
            chooser = self._choosers[candidates] = CandidateChooser(candidates, self.ready,
                                                                    self.options.route_recheck_s)
        return chooser

    def still_ready(self, candidates: tuple[str, ...], tried: tuple[str, ...], model: str) -> bool:
        """After `model` failed: is it still the first READY one (a real failure), or did it go away?"""
        chooser = self.chooser(candidates)
        chooser.invalidate()
        return chooser.choose(exclude=tried) == model

    def role(self, candidates: tuple[str, ...]) -> str:
        """What the flow calls these candidates for: the setting that names them, else their names."""
        return self.settings.role_of(candidates) or ",".join(candidates)

    def canary_for(self, model: str) -> Trial | None:
        """The canary to send a call of `model` to instead: drawn at canary_share, READY."""
        canary = self.canary
        if canary is None or canary.stable != model or self.rng.random() >= canary.share:
            return None
        return canary if self.trial_ready(canary) else None

    def shadow_for(self, model: str) -> Shadow | None:
        """The shadow to mirror a call of `model` to, or None (not drawn, not READY, or no slot free)."""
        shadow = self.shadow
        if shadow is None or shadow.trial.stable != model:
            return None
        return shadow if shadow.wanted(lambda: self.trial_ready(shadow.trial)) else None

    # ---- a model that went away -------------------------------------------------------------
    def lost(self, model: str) -> None:
        self._lost[model] = self.clock()

    def answered(self, model: str) -> None:
        self._lost.pop(model, None)

    def retry_until(self, candidates: tuple[str, ...], failed: bool) -> float | None:
        """Until when a call on `candidates` waits for one to answer: child_retry_s after its own
        failure, or after the latest loss of one of them (a call that finds none READY while the
        watchdog reloads a model that just lost its stub); None: it does not wait."""
        bound = self.options.child_retry_s
        if bound <= 0:
            return None
        if failed:
            return self.clock() + bound
        losses = [self._lost[m] for m in candidates if m in self._lost]
        until = max(losses) + bound if losses else None
        return until if until is not None and until > self.clock() else None

    def now(self) -> float:
        return self.clock()

    def pause(self) -> None:
        self.sleep(RETRY_PAUSE_S)
