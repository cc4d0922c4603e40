"""Work only for clients still waiting: deadlines, cancellation and shedding.

What the runtime knows of a request's time (Triton 2.51's python backend tells no arrival time):

- its deadline: the client's `timeout` request parameter, counted from when the request may
  have arrived at the latest guess: the flow instance's own upper bound on the queue wait
  (QueueWait below), so a deadline is never thought later than it is;
- whether its client has gone: `request.is_cancelled()` (a gRPC call cancelled, or its
  deadline passed), asked at a stage once CANCEL_CHECK_S has passed since it was last asked
  (each ask is a round trip to the server: about 0.1 ms of the stub's time here, profiled; at
  most 5 ms of work, a fraction of one image's, goes to a client that has gone unseen).

Before decoding and before each child call (in-process children too), the rows of requests
that were cancelled or whose deadline passed are dropped, and a row whose time left cannot
cover the next stage, as measured (Costs), is refused at once: 503 / UNAVAILABLE, saying why.
A call is not grown past what its rows' deadlines allow: the rows with the least time left
are refused until the call's predicted time fits the rest.

For clients that give no deadline, a queue-delay target per flow (`queue_delay_target_ms`):
once the queue wait bound passes it, the instance sheds (Admission): each execute() answers
only as many of its requests, the newest first, as it can finish in a fifth of the target
(50 ms at most), and refuses the rest at once; it stops shedding once an execute() gets no
more than that (the queue drained). The queue stays short, so refusals come back fast, and
what is answered waited less than the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from .results import CANCELLED, UNAVAILABLE, ImageRequest, RequestError, Timings

__all__ = ["Admission", "CANCEL_CHECK_S", "Costs", "QueueWait", "RequestClock"]

CANCEL_CHECK_S = 0.005  # a request's client is asked about again only after this long (each ask ~0.1 ms)
# An execute() that gets at most IDLE_BATCH requests had no queue in front of it: its requests
# are taken to have waited no more than the batcher's delay and a handoff (IDLE_GAP_S).
IDLE_GAP_S, IDLE_BATCH = 0.010, 2
# What an answer needs after the runtime's last look at its deadline: top-k, the response's way
# back through Triton to the client.
RESPONSE_S = 0.010
# While shedding, an execute() takes on what it can finish in a fifth of the target, and at
# most SHED_MAX_S: the instance frees up that often, so a refused request waits about that long.
SHED_SHARE, SHED_MAX_S = 0.2, 0.05
_EWMA = 0.2  # weight of a new measurement


class Costs:
    """Measured seconds per image of each stage (decode, each child, a whole execute()), as
    moving averages: what the next batch of n images is predicted to take."""

    def __init__(self):
        self._per_image: dict[str, float] = {}

    def observe(self, stage: str, seconds: float, images: int) -> None:
        if images <= 0 or seconds < 0:
            return
        value = seconds / images
        old = self._per_image.get(stage)
        self._per_image[stage] = value if old is None else old + _EWMA * (value - old)

    def predict(self, stage: str, images: int) -> float:
        """Seconds for `images` images at `stage`; 0 until the stage was measured once."""
        return self._per_image.get(stage, 0.0) * images

    def per_image(self, stage: str) -> float | None:
        return self._per_image.get(stage)


class SharedTime(Protocol):
    """A time the instances of one model share (adapter/shared_stamp.py): 0 until one wrote it."""

    def read(self) -> float: ...
    def raise_to(self, value: float) -> None: ...


class QueueWait:
    """An upper bound on how long the requests of an execute() waited in Triton's queue:
    right after an execute() that got fewer requests than max_batch_size, the queue was empty
    (the batcher took them all), so every later request came after it (any instance's such
    execute(): the instances share the time of the latest). An execute() of one or two
    requests (IDLE_BATCH) had no queue in front of it, and counts the batcher's delay alone.
    None for max_batch_size: no queue in front (LocalFlow), no wait."""

    def __init__(self, max_batch_size: int | None, max_queue_delay_s: float = 0.0, shared: SharedTime | None = None):
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_s
        self._drained_at: float | None = None  # start of the last execute() that emptied the queue
        # The model's other instances empty the same queue: when any of them last did (the
        # adapter's shared stamp), else this instance's own knowledge alone.
        self._shared = shared

    def started(self, now: float, requests: int) -> float:
        if self.max_batch_size is None:
            return 0.0
        bounds = []
        drained = self._drained_at
        if self._shared is not None:
            anyone = self._shared.read()  # 0: no instance wrote it yet
            if anyone > 0 and (drained is None or anyone > drained):
                drained = anyone
        if drained is not None:
            bounds.append(now - drained)
        if requests <= IDLE_BATCH:
            # One or two requests: no queue stood in front of them. Whether they came just now
            # or waited out two long execute()s cannot be told apart; either way nothing is
            # lined up to shed, and a deadline counted from now errs by that wait at most.
            bounds.append(self.max_queue_delay_s + IDLE_GAP_S)
        wait = max(0.0, min(bounds)) if bounds else 0.0
        if self.max_batch_size <= 0 or requests < self.max_batch_size:
            self._drained_at = now
            if self._shared is not None:
                self._shared.raise_to(now)
        return wait


@dataclass
class RequestClock:
    """One execute()'s requests: each one's deadline (on the runtime's clock; inf: none), when
    its client was last asked whether it has gone, and the requests already failed."""

    requests: Sequence[ImageRequest]
    deadlines: np.ndarray
    clock: Callable[[], float]
    checked: np.ndarray = field(init=False)

    late_cancel: Callable[[float], None] | None = None  # told how much time a cancelled request still seemed to have

    @classmethod
    def start(cls, requests: Sequence[ImageRequest], now: float, wait: float, clock: Callable[[], float],
              slack: float = 0.0, late_cancel: Callable[[float], None] | None = None,
              queued: bool = False) -> "RequestClock":
        """Each deadline counted from the earliest the request can have entered the queue (now
        less the wait bound), less `slack` (how much later than the client's own the runtime's
        estimates have turned out) and the answer's way back (RESPONSE_S)."""
        deadlines = np.array([now - wait + r.timeout_s - slack - RESPONSE_S if r.timeout_s is not None else math.inf
                              for r in requests], dtype=np.float64)
        made = cls(requests, deadlines, clock, late_cancel=late_cancel)
        # queued: as good as asked now (Triton drops a request cancelled while it waited in its
        # queue, so the first ask worth its round trip comes at the next stage); else never yet.
        made.checked = np.full(len(requests), now if queued else -math.inf)
        return made

    def time_left(self, now: float | None = None) -> np.ndarray:
        """Seconds left per request (inf: no deadline)."""
        return self.deadlines - (self.clock() if now is None else now)

    def cancelled(self, r: int, now: float) -> bool:
        """Whether request r's client has gone, asking it no more than every CANCEL_CHECK_S."""
        probe = self.requests[r].cancelled
        if probe is None or now - self.checked[r] < CANCEL_CHECK_S:
            return False
        self.checked[r] = now
        try:
            return bool(probe())
        except Exception:  # noqa: BLE001 - a probe that fails says nothing about the client
            return False


def drop(clock: RequestClock, results: list, timings: Timings, stage: str, now: float, images: Callable[[int], int],
         carried: dict[int, int] | None = None, predicted: Callable[[int], float] | None = None) -> None:
    """Fail the pending requests whose client has gone or whose deadline has passed; then, of
    those `stage` carries (request -> its rows there; None: every pending one, with all its
    images), the ones whose time left cannot cover the stage (predicted(n): its seconds for n
    rows), least time left first, until the rest fit. images(r): request r's images, counted."""
    left = clock.time_left(now)
    alive = []
    for r in range(len(results)):
        if results[r] is not None:
            continue
        if clock.cancelled(r, now):
            if clock.late_cancel is not None and math.isfinite(left[r]):
                clock.late_cancel(left[r])  # its client gave up with this much of our estimate left
            _fail(results, timings, r, images(r), stage, "cancelled", CANCELLED,
                  "the client cancelled the request (or its gRPC deadline passed)")
        elif left[r] <= 0:
            _fail(results, timings, r, images(r), stage, "expired", UNAVAILABLE,
                  f"its deadline (the timeout parameter, {clock.requests[r].timeout_s * 1e3:.0f} ms) passed before {stage}")
        elif carried is None or r in carried:
            alive.append(r)
    if predicted is None or not alive:
        return
    rows = (lambda r: images(r)) if carried is None else carried.__getitem__
    # Most time left first; a call carrying the first k of them must end when the k-th has to.
    order = sorted(alive, key=lambda r: -left[r])
    counts = np.cumsum([rows(r) for r in order])
    keep = 0
    while keep < len(order) and predicted(int(counts[keep])) <= left[order[keep]]:
        keep += 1
    for r in order[keep:]:
        need = predicted(int(counts[keep]))
        _fail(results, timings, r, images(r), stage, "no_time", UNAVAILABLE,
              f"refused: {max(left[r], 0) * 1e3:.0f} ms left of its deadline, and {stage} takes about {need * 1e3:.0f} ms "
              "now; send it again with a longer timeout, or later")


def _fail(results: list, timings: Timings, r: int, images: int, stage: str, why: str, code: str, message: str) -> None:
    results[r] = RequestError(message, why, code)
    timings.reject(results[r], images)
    timings.count(timings.dropped, (why, stage, code), images)


class Admission:
    """One flow instance's door: its queue-wait bound, what an image costs it, and whether it
    is shedding (a queue-delay target passed)."""

    def __init__(self, max_batch_size: int | None, max_queue_delay_s: float, target_s: float, clock: Callable[[], float],
                 shared: SharedTime | None = None):
        self.wait = QueueWait(max_batch_size, max_queue_delay_s, shared)
        self.target_s = target_s
        self.clock = clock
        self.costs = Costs()
        self.shedding = False
        self.slack_s = 0.0  # how much later than the clients' own the deadlines have turned out (late_cancel)
        self._started: float | None = None

    def open(self, requests: Sequence[ImageRequest]) -> tuple[RequestClock, float]:
        """An execute() begins: its requests' clock and the queue-wait bound."""
        now = self.clock()
        self._started = now
        wait = self.wait.started(now, len(requests))
        return RequestClock.start(requests, now, wait, self.clock, self.slack_s, self._late_cancel,
                                  queued=self.wait.max_batch_size is not None), wait

    def _late_cancel(self, left_s: float) -> None:
        """A client gave up while its deadline, as estimated, still had left_s to go (a gRPC
        client's deadline cancels the call): later estimates are made that much earlier, as a
        moving average of what these show (never below 0)."""
        # left_s was counted with the current slack taken off already: the slack it shows is
        # slack + left_s, and the average moves a fifth of the way there.
        self.slack_s = max(0.0, self.slack_s + _EWMA * left_s)

    def admit(self, clock: RequestClock, results: list, timings: Timings, wait: float) -> None:
        """At the door, before decoding: drop the gone and the expired, refuse what cannot
        finish in time, and while shedding keep only what fits in the shedding budget."""
        now = clock.clock()
        images = lambda r: max(1, len(clock.requests[r].images))  # noqa: E731
        late = sum(timings.dropped.get((why, "admission", UNAVAILABLE), 0) for why in ("expired", "no_time"))
        drop(clock, results, timings, "admission", now, images,
             predicted=lambda n: self.costs.predict("execute", n))
        late = sum(timings.dropped.get((why, "admission", UNAVAILABLE), 0) for why in ("expired", "no_time")) - late
        if self.target_s <= 0:
            return
        pending = [r for r in range(len(results)) if results[r] is None]
        per_image = self.costs.per_image("execute")
        budget = max(1, int(min(self.target_s * SHED_SHARE, SHED_MAX_S) / per_image)) if per_image else len(pending)
        total = sum(images(r) for r in pending)
        # The queue is standing: requests waited past the target, or their own deadlines ran out
        # in it (clients with deadlines keep the wait under the target, and still wait too long).
        if not self.shedding and (wait > self.target_s or late):
            self.shedding = True
        elif self.shedding and total <= budget:
            self.shedding = False  # the queue drained
        if not self.shedding:
            return
        taken = 0
        for r in reversed(pending):  # Triton hands them over oldest first: the newest have waited least
            if taken + images(r) <= budget or taken == 0:
                taken += images(r)
                continue
            _fail(results, timings, r, images(r), "admission", "shed", UNAVAILABLE,
                  f"overloaded: requests waited up to {wait * 1e3:.0f} ms in the queue, over this flow's "
                  f"queue_delay_target_ms={self.target_s * 1e3:g}; refused at once: try again later")

    def close(self, images: int) -> None:
        """The execute() is over: what its admitted images cost."""
        now = self.clock()
        if self._started is not None and images:
            self.costs.observe("execute", now - self._started, images)
