"""Work only for clients still waiting: deadlines, cancellation and shedding.

What the runtime knows of a request's time (Triton 2.51's python backend tells no arrival time,
and a gRPC deadline does not reach the model: the `grpc-timeout` header is not forwarded):

- how long requests waited in Triton's queue: Triton's own measurement (its statistics
  extension: each model's queue time and count), which bls-serve reads every POLL_S and the
  instances share (adapter/queue_waits.py): the mean wait of the requests that left the queue
  in the latest window, and the lowest such mean over the last interval (QueueReading). Where
  nobody measures it (a server started without bls-serve), it is unknown, and the runtime
  refuses nothing on it;
- its deadline: the client's `timeout` request parameter, counted from when it arrived as
  Triton measured the queue's wait (Triton itself refuses one whose timeout passes while it
  is queued: allow_timeout_override);
- whether its client has gone: `request.is_cancelled()` (a gRPC call cancelled, or its
  deadline passed), asked at a stage once CANCEL_CHECK_S has passed since it was last asked
  (each ask is a round trip to the server: about 0.1 ms of the stub's time here, profiled; at
  most 5 ms of work, a fraction of one image's, goes to a client that has gone unseen).

Before decoding and before each child call (in-process children too), the rows of requests
that were cancelled or whose deadline passed are dropped, and a row whose time left cannot
cover the next stage, as measured (Costs), is refused at once: 503 / UNAVAILABLE, saying why.
A call is not grown past what its rows' deadlines allow: the rows with the least time left
are refused until the call's predicted time fits the rest.

For clients that give no deadline, a queue-delay target per flow (`queue_delay_target_ms`),
as CoDel does for packets: an instance starts shedding only on a standing queue, that is when
both

- Triton measured every window's mean wait over the last interval above the target, and
- the execute() came full (as many requests as Triton's batcher hands one: its largest
  preferred_batch_size, else max_batch_size; the queue held at least that many),

never on one slow request or one slow execute(). While it sheds, an execute() answers only
the newest of its requests that it can finish within the target, counting the wait Triton
measured last (at least one), and refuses the rest at once; it stops once an execute()
comes short of full (the queue drained). Whatever it keeps is answered about `target` after
it arrived. Most refusals under overload are Triton's own, cheaper and sooner: its queue
holds max_queue_size requests and refuses the next on arrival.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .results import CANCELLED, UNAVAILABLE, ImageRequest, RequestError, Timings

__all__ = ["Admission", "CANCEL_CHECK_S", "Costs", "QueueReading", "RequestClock"]

CANCEL_CHECK_S = 0.005  # a request's client is asked about again only after this long (each ask ~0.1 ms)
# A reading of Triton's queue older than this says nothing of the queue now (bls-serve writes
# one every POLL_S: it stopped, or the model is new).
STALE_S = 1.0
# What an answer needs after the runtime's last look at its deadline: top-k, the response's way
# back through Triton to the client.
RESPONSE_S = 0.010
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


@dataclass(frozen=True)
class QueueReading:
    """What Triton measured of a model's queue (bls-serve's reading of its statistics): when
    (`at`, on the monotonic clock every process shares), the mean wait of the requests that
    left the queue in the latest window (`wait_s`, over `requests` of them), and the lowest
    window mean over the last `interval_s` (`standing_s`: the queue stood that long at least)."""

    at: float
    wait_s: float
    standing_s: float
    requests: int
    interval_s: float

    def fresh(self, now: float) -> bool:
        return self.requests > 0 and 0.0 <= now - self.at <= STALE_S


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
        """Each deadline counted from when the request entered the queue, as Triton measured the
        queue's wait (`wait`; 0 where nobody measured it), less `slack` (how much later than the
        client's own the runtime's estimates have turned out) and the answer's way back
        (RESPONSE_S)."""
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
    """One flow instance's door: what Triton measured of its queue, what an image costs it,
    and whether it is shedding (a standing queue past the queue-delay target)."""

    def __init__(self, batch_cap: int | None, target_s: float, clock: Callable[[], float],
                 queue: Callable[[], QueueReading | None] | None = None):
        self.batch_cap = batch_cap  # the most requests an execute() takes from the queue; None: no queue (LocalFlow)
        self.target_s = target_s
        self.clock = clock
        self.queue = queue or (lambda: None)  # Triton's measurement of the queue; None: not measured
        self.costs = Costs()
        self.shedding = False
        self._stood: QueueReading | None = None  # the reading that showed the queue standing, when shedding began
        self.slack_s = 0.0  # how much later than the clients' own the deadlines have turned out (late_cancel)
        self._started: float | None = None

    def open(self, requests: Sequence[ImageRequest]) -> tuple[RequestClock, QueueReading | None]:
        """An execute() begins: its requests' clock, and Triton's latest fresh reading of the
        queue (None: none measured, or too old to say anything of the queue now)."""
        now = self.clock()
        self._started = now
        reading = self.queue() if self.batch_cap is not None else None
        if reading is not None and not reading.fresh(now):
            reading = None
        wait = reading.wait_s if reading is not None else 0.0
        return RequestClock.start(requests, now, wait, self.clock, self.slack_s, self._late_cancel,
                                  queued=self.batch_cap is not None), reading

    def _late_cancel(self, left_s: float) -> None:
        """A client gave up while its deadline, as estimated, still had left_s to go (a gRPC
        client's deadline cancels the call): later estimates are made that much earlier, as a
        moving average of what these show (never below 0)."""
        # left_s was counted with the current slack taken off already: the slack it shows is
        # slack + left_s, and the average moves a fifth of the way there.
        self.slack_s = max(0.0, self.slack_s + _EWMA * left_s)

    def standing(self, reading: QueueReading | None, requests: int) -> bool:
        """A standing queue (CoDel): Triton measured every window's mean wait over the last
        interval above the target, and this execute() came full. Unknown: not standing."""
        if self.target_s <= 0 or reading is None or not self.batch_cap:
            return False
        return reading.standing_s > self.target_s and requests >= self.batch_cap

    def admit(self, clock: RequestClock, results: list, timings: Timings, reading: QueueReading | None) -> None:
        """At the door, before decoding: drop the gone and the expired, refuse what cannot
        finish in time, and while shedding keep only what finishes within the target."""
        now = clock.clock()
        images = lambda r: max(1, len(clock.requests[r].images))  # noqa: E731
        drop(clock, results, timings, "admission", now, images,
             predicted=lambda n: self.costs.predict("execute", n))
        full = self.batch_cap and len(clock.requests) >= self.batch_cap
        if reading is None or not full:
            self.shedding = False  # unmeasured, or the queue drained: nothing to shed on
        elif not self.shedding:
            self.shedding = self.standing(reading, len(clock.requests))
            self._stood = reading
        if not self.shedding:
            return
        stood = self._stood
        pending = [r for r in range(len(results)) if results[r] is None]
        budget_s = self.target_s - reading.wait_s  # what is left of the target after the wait Triton measured
        taken = 0
        for r in reversed(pending):  # Triton hands them over oldest first: the newest have waited least
            if taken == 0 or self.costs.predict("execute", taken + images(r)) <= budget_s:
                taken += images(r)
                continue
            _fail(results, timings, r, images(r), "admission", "shed", UNAVAILABLE,
                  f"overloaded: this flow's queue stands: requests waited {stood.standing_s * 1e3:.0f} ms or more on "
                  f"average for {stood.interval_s:g} s (Triton's statistics), over its queue_delay_target_ms="
                  f"{self.target_s * 1e3:g}, and execute()s come full ({len(clock.requests)} requests taken at once, "
                  f"the most Triton hands one); with the latest wait, {reading.wait_s * 1e3:.0f} ms, this "
                  f"execute() answers the {taken} newest it can finish within the target: refused at once, try again later")

    def close(self, images: int) -> None:
        """The execute() is over: what its admitted images cost."""
        now = self.clock()
        if self._started is not None and images:
            self.costs.observe("execute", now - self._started, images)
