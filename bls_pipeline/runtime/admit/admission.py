"""Work only for clients still waiting: deadlines, cancellation, and optional stages skipped
when their time is short.

What the runtime knows of a request's time (Triton 2.51's python backend tells no arrival time,
and a gRPC deadline does not reach the model: the `grpc-timeout` header is not forwarded):

- how long requests waited in a model's queue: Triton's own measurement (its statistics
  extension: each model's queue time and count), which bls-serve reads every POLL_S and the
  instances share (adapter/queue_waits.py): the mean wait of the requests that left the queue
  in the latest window (QueueReading). Where nobody measures it (a server started without
  bls-serve), it is unknown, and counted as none;
- its deadline: the client's `timeout` request parameter, counted from when it arrived as
  Triton measured the queue's wait (Triton itself refuses one whose timeout passes while it
  is queued: allow_timeout_override);
- whether its client has gone: `request.is_cancelled()` (a gRPC call cancelled, or its
  deadline passed), asked at a stage once CANCEL_CHECK_S has passed since it was last asked
  (each ask is a round trip to the server: about 0.1 ms of the stub's time here, profiled; at
  most 5 ms of work, a fraction of one image's, goes to a client that has gone unseen).

Before decoding and before each child call (in-process children too), the rows of requests
that were cancelled or whose deadline passed are dropped; before a child call, a row whose
time left cannot cover it, as measured (Costs, and the child's queue as Triton measured it),
is refused at once: 503 / UNAVAILABLE, saying why. A call is not grown past what its rows'
deadlines allow: the rows with the least time left are refused until the call's predicted
time fits the rest.

A flow marks a call's rows `optional` where it has an answer for them already (the cascade's
second opinion). Under overload (`overload: degrade`, the default) those rows are skipped
rather than refused when the call would end after their *aim*: their deadline, or for a
request that sent none, `latency_target_ms` after it arrived. Skipped rows keep the answer they
had, marked degraded with the reason (answer.py). A request without a deadline is never
refused for time: a client that waits for its answer gets one. The queue in front of the flow
is bounded by Triton (max_queue_size), which refuses the request that would overflow it on
arrival, before any stub sees it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..results import CANCELLED, UNAVAILABLE, ImageRequest, RequestError, Timings

__all__ = ["Admission", "CANCEL_CHECK_S", "Costs", "GONE_CHECK_S", "QueueReading", "RequestClock", "Skipped"]

CANCEL_CHECK_S = 0.005  # a request's client is asked about again only after this long (each ask ~0.1 ms)
# An answer is asked whether its client is still there (bls_requests_total GONE) only for a
# request in the server this long: a client rarely gives up sooner, and the ask costs a round
# trip on every answer.
GONE_CHECK_S = 0.05
# A reading of Triton's queue older than this says nothing of the queue now (bls-serve writes
# one every POLL_S: it stopped, the model is new, or nothing left its queue for that long).
STALE_S = 1.0
# What an answer needs after the runtime's last look at its deadline: top-k, the response's way
# back through Triton to the client.
RESPONSE_S = 0.010
_EWMA = 0.2  # weight of a new measurement


class Costs:
    """Measured seconds of each stage (decode, each child's own work, a whole execute()) against
    the images it had, as moving averages: what the next batch of n images is predicted to take.

    A batch costs something whatever its size (a call's round trip, an execute()'s own
    overhead) and something per image: where the sizes measured vary, the prediction is that
    line (a least-squares fit over the moving averages); where they do not, it is the time per
    image. Taking a fixed cost for a per-image one would make small batches look dear, and a
    door that refuses on it would make its batches smaller still.

    A measurement not renewed for over HALF_LIFE_S counts for less (halved every HALF_LIFE_S
    after that): a stage skipped because it was measured slow (an optional one under
    overload) is tried again soon after, and measured anew, rather than skipped on an old
    figure for ever. One measured more often than that is taken as measured."""

    HALF_LIFE_S = 1.0

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        # stage -> moving averages of (n, t, n*n, n*t) over its measurements, and when last measured
        self._moments: dict[str, tuple[np.ndarray, float]] = {}

    def observe(self, stage: str, seconds: float, images: int) -> None:
        if images <= 0 or seconds < 0:
            return
        sample = np.array([images, seconds, images * images, images * seconds], dtype=np.float64)
        old = self._aged(stage)
        self._moments[stage] = (sample if old is None else old + _EWMA * (sample - old), self._clock())

    def predict(self, stage: str, images: int) -> float:
        """Seconds for `images` images at `stage`; 0 until the stage was measured once."""
        moments = self._aged(stage)
        if moments is None or images <= 0:
            return 0.0
        n, t, nn, nt = moments
        per_image = t / n
        spread = nn - n * n
        if spread < 0.25:  # (about) one batch size measured: no fixed part to tell apart
            return per_image * images
        slope = min(max((nt - n * t) / spread, 0.0), t / n)  # per image; at most the whole time per image
        return (t - slope * n) + slope * images

    def per_image(self, stage: str) -> float | None:
        """The stage's seconds per image as measured (over the sizes measured), less as the
        measurement ages; None: never measured."""
        moments = self._aged(stage)
        return None if moments is None else float(moments[1] / moments[0])

    def _aged(self, stage: str) -> np.ndarray | None:
        """The stage's moving averages, its times counting less as the measurement ages."""
        found = self._moments.get(stage)
        if found is None:
            return None
        moments, at = found
        fade = 0.5 ** (max(0.0, self._clock() - at - self.HALF_LIFE_S) / self.HALF_LIFE_S)
        return moments * np.array([1.0, fade, 1.0, fade])


@dataclass(frozen=True)
class QueueReading:
    """What Triton measured of a model's queue (bls-serve's reading of its statistics): when
    (`at`, on the monotonic clock every process shares), and the mean wait of the requests that
    left the queue in the latest window (`wait_s`, over `requests` of them)."""

    at: float
    wait_s: float
    requests: int

    def fresh(self, now: float) -> bool:
        return self.requests > 0 and 0.0 <= now - self.at <= STALE_S


@dataclass
class RequestClock:
    """One execute()'s requests: each one's deadline (on the runtime's clock; inf: none), its
    aim (the deadline, or for a request without one its arrival plus the flow's latency target;
    inf: neither), when its client was last asked whether it has gone."""

    requests: Sequence[ImageRequest]
    deadlines: np.ndarray
    clock: Callable[[], float]
    aims: np.ndarray = field(init=False)
    checked: np.ndarray = field(init=False)
    arrived: float = field(init=False)  # when they entered the queue, as measured (the execute()'s start less the wait)


    @classmethod
    def start(cls, requests: Sequence[ImageRequest], now: float, wait: float, clock: Callable[[], float],
              queued: bool = False, target_s: float = 0.0) -> "RequestClock":
        """Each deadline counted from when the request entered the queue, as Triton measured the
        queue's wait (`wait`; 0 where nobody measured it), less the answer's way back
        (RESPONSE_S). A request without one aims at `target_s` after its arrival (0: none). A
        client that gives up sooner than its deadline says is seen as gone (cancelled)."""
        arrived = now - wait
        deadlines = np.array([arrived + r.timeout_s - RESPONSE_S if r.timeout_s is not None else math.inf
                              for r in requests], dtype=np.float64)
        made = cls(requests, deadlines, clock)
        made.arrived = arrived
        aim = arrived + target_s - RESPONSE_S if target_s > 0 else math.inf
        made.aims = np.where(np.isfinite(deadlines), deadlines, aim)
        # queued: as good as asked now (Triton drops a request cancelled while it waited in its
        # queue, so the first ask worth its round trip comes at the next stage); else never yet.
        made.checked = np.full(len(requests), now if queued else -math.inf)
        return made

    def time_left(self, now: float | None = None) -> np.ndarray:
        """Seconds left per request (inf: no deadline)."""
        return self.deadlines - (self.clock() if now is None else now)

    def aim_left(self, now: float | None = None) -> np.ndarray:
        """Seconds left per request until its aim (inf: none)."""
        return self.aims - (self.clock() if now is None else now)

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


@dataclass(frozen=True)
class Skipped:
    """Rows of a batch an optional stage left out, and why (what a degraded answer says)."""

    rows: np.ndarray  # rows of the batch the call was on (images, or regions)
    stage: str  # the model the call was for
    why: str  # the metric's label: "late" (it would end after their aim) or "busy" (the child refused the call)
    reasons: np.ndarray  # per row, the sentence its answer carries (object array of str)


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
            _fail(results, timings, r, images(r), stage, "cancelled", CANCELLED,
                  "the client cancelled the request (or its gRPC deadline passed)")
        elif left[r] <= 0:
            _fail(results, timings, r, images(r), stage, "expired", UNAVAILABLE,
                  f"its deadline (the timeout parameter, {clock.requests[r].timeout_s * 1e3:.0f} ms) passed before "
                  f"{stage}")
        elif carried is None or r in carried:
            alive.append(r)
    if predicted is None or not alive:
        return
    rows = (lambda r: images(r)) if carried is None else carried.__getitem__
    order, counts, keep = _fits(alive, left, rows, predicted, 0, math.inf)
    for r in order[keep:]:
        need = predicted(int(counts[keep]))
        _fail(results, timings, r, images(r), stage, "no_time", UNAVAILABLE,
              f"refused: {max(left[r], 0) * 1e3:.0f} ms left of its deadline, and {stage} takes about {need * 1e3:.0f} "
              "ms now; send it again with a longer timeout, or later")


def late(clock: RequestClock, now: float, carried: dict[int, int], base: int, bound_s: float,
         predicted: Callable[[int], float]) -> list[int]:
    """Of the requests `carried` (request -> its optional rows in a call), those whose rows the
    call cannot carry and still end by their aim: the call carries `base` rows it must send
    anyway and ends by `bound_s` from now at the latest; predicted(n): its seconds for n rows.
    Most time left first: a call carrying the first k of them must end when the k-th aims to."""
    left = np.minimum(clock.aim_left(now), bound_s)
    alive = list(carried)
    order, _, keep = _fits(alive, left, carried.__getitem__, predicted, base, bound_s)
    return order[keep:]


def _fits(alive: list[int], left: np.ndarray, rows: Callable[[int], int], predicted: Callable[[int], float],
          base: int, bound_s: float) -> tuple[list[int], np.ndarray, int]:
    """`alive`, most time left first; the rows a call carrying the first k of them carries
    (beside `base`), for each k; and how many of them one call can carry and end before the
    last of them has to (and within bound_s)."""
    order = sorted(alive, key=lambda r: -left[r])
    counts = base + np.cumsum([rows(r) for r in order])
    keep = 0
    while keep < len(order) and predicted(int(counts[keep])) <= min(left[order[keep]], bound_s):
        keep += 1
    return order, counts, keep


def _fail(results: list, timings: Timings, r: int, images: int, stage: str, why: str, code: str, message: str) -> None:
    results[r] = RequestError(message, why, code)
    timings.reject(results[r], images)
    timings.count(timings.dropped, (why, stage, code), images)


class Admission:
    """One flow instance's door: what Triton measured of its queue, what an image costs it,
    its latency target for requests that send no deadline."""

    def __init__(self, queued: bool, target_s: float, clock: Callable[[], float],
                 queues: Callable[[str], QueueReading | None] | None = None, model: str = ""):
        self.queued = queued  # Triton keeps a queue in front of it (False: LocalFlow)
        self.target_s = target_s
        self.clock = clock
        self.model = model
        self.queues = queues or (lambda _name: None)  # Triton's measurement of a model's queue; None: not measured
        self.costs = Costs(clock)

    def reading(self, model: str, now: float | None = None) -> QueueReading | None:
        """Triton's latest fresh reading of `model`'s queue, or None (unmeasured, or too old to
        say anything of the queue now)."""
        got = self.queues(model)
        return got if got is not None and got.fresh(self.clock() if now is None else now) else None

    def queue_wait(self, model: str) -> float:
        """The wait a request to `model` meets now, as Triton last measured it (0: unknown)."""
        got = self.reading(model)
        return got.wait_s if got is not None else 0.0

    def open(self, requests: Sequence[ImageRequest]) -> tuple[RequestClock, QueueReading | None]:
        """An execute() begins: its requests' clock, and Triton's latest fresh reading of the
        flow's own queue (None: none measured)."""
        now = self.clock()
        reading = self.reading(self.model, now) if self.queued else None
        wait = reading.wait_s if reading is not None else 0.0
        return RequestClock.start(requests, now, wait, self.clock,
                                  queued=self.queued, target_s=self.target_s), reading

    def admit(self, clock: RequestClock, results: list, timings: Timings) -> None:
        """At the door, before decoding: drop the gone and the expired. What cannot finish in
        time is refused before the stage it cannot finish (a child call), on that stage's own
        measure: a whole execute()'s time is no measure of one request's (measured past
        capacity, refusing on it shrank the execute()s it refused from)."""
        images = lambda r: max(1, len(clock.requests[r].images))  # noqa: E731
        drop(clock, results, timings, "admission", clock.clock(), images)
