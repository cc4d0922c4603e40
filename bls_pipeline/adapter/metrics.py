"""A flow model's own metrics on Triton's /metrics endpoint (pb_utils.MetricFamily).

    bls_requests_total{code}             requests finished, by the status their client got: OK
                                         (answered), GONE (answered, but its client had gone
                                         meanwhile: it cancelled, or its gRPC deadline passed;
                                         the work was wasted) or the failure's code
                                         (INVALID_ARGUMENT, INTERNAL, UNAVAILABLE, CANCELLED);
                                         every code starts at 0
    bls_rejected_requests_total{reason,code}  failed requests: what failed (a decode reason,
                                         bad_request, too_large, too_many_regions, flow, or a
                                         child's role or name) and the status the client got
    bls_rejected_images_total{reason,code}  the images of those requests, every one (a request
                                         of 3 images with one bad adds 3)
    bls_images_total{route}              images answered, by ROUTE
    bls_stage_seconds_total{stage}       seconds in decode_preprocess and classify (the flow)
    bls_executions_total                 execute() calls (mean stage latency = seconds / executions)
    bls_dropped_images_total{why,stage,code}  images of requests dropped before they finished:
                                         cancelled (the client went), expired (its deadline passed),
                                         no_time (too little left for the next stage); stage:
                                         admission (before decoding) or the child model about to
                                         be called
    bls_degraded_images_total{stage,why} images answered degraded: an optional stage (the child
                                         model `stage`) skipped under overload, why: late (it would
                                         have answered after the request's deadline or the flow's
                                         latency_target_ms) or busy (it refused the call)
    bls_queue_wait_seconds               (gauge) the mean wait in Triton's queue, as Triton measured it,
                                         of the requests that left it in the latest window before this
                                         instance's last execute() (runtime/admit/admission.py); 0 where
                                         nobody measures it (no bls-serve)
    bls_child_calls_total{child}         child requests sent, by child model
    bls_child_images_total{child}        images in them
    bls_child_seconds_total{child}       seconds waiting for them (concurrent calls overlap)
    bls_shadow_calls_total{stable,candidate,outcome}   calls drawn: compared, failed, skipped
                                                       (no slot free), unready (candidate not READY)
    bls_shadow_rows_total{stable,candidate}            rows compared
    bls_shadow_top1_agree_total{stable,candidate}      rows whose top-1 agree (/ rows: agreement)
    bls_shadow_top5_overlap_total{stable,candidate}    top-5 overlap summed over rows (/ rows: mean)
    bls_shadow_score_diff_total{stable,candidate,le}   rows whose stable top-1 probability moved
                                                       by at most le (cumulative, as a histogram)
    bls_shadow_seconds_total{stable,candidate,side}    seconds of the compared calls, each side
    bls_server_restarts                  (gauge) how often bls-serve restarted this server after
                                         it died on its own (its BLS_SERVER_RESTARTS), at load

Only users' requests are counted: the adapter leaves the watchdog's probes out. Triton's
own nv_inference_request_success counts a request the flow failed as a success (the python
backend sends the error as the response), so the failures are counted here
(docs/reliability.md, "Alerting"). Every failure the runtime records through
Timings.reject() is counted, whatever its reason and code; series() is the pure part.

While requests are refused (503: no_time, expired, a child overloaded or not READY)
or cancelled by their clients, each instance logs one line a minute saying how many, of how
many, and why (OutcomeSummary: none for a minute with neither), at WARNING, so the server
log shows overload at its default verbosity without a line per request.

Every series also carries model and instance labels (one series per model instance).
Each Metric.increment is a round trip to the Triton process, so execute() only adds its
counts up here; a thread of this instance sends what is pending every `flush_s` (0.25 s),
traffic or not, and at finalize. The endpoint is never more than about `flush_s` behind,
and execute() pays no round trip and wakes no thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Sequence

from ..contract import RESTARTS_ENV
from ..runtime.results import CANCELLED, CODES, UNAVAILABLE, Timings
from ..runtime.call.trials import SCORE_DIFF_BOUNDS

__all__ = ["FlowMetrics", "OutcomeSummary", "series", "zero_series"]

log = logging.getLogger(__name__)

ANSWERED = "OK"  # bls_requests_total's code of a request answered
GONE = "GONE"  # ... answered after its client had gone

_FAMILIES = {
    "requests": ("bls_requests_total", "Users' requests the flow model finished, by the status code sent: OK "
                 "(answered), GONE (answered after its client had gone: wasted) or the code of the failure "
                 "(watchdog probes not counted)"),
    "rejected_requests": ("bls_rejected_requests_total", "Users' requests the flow model failed, by what failed "
                          "(reason) and the status code sent"),
    "rejected": ("bls_rejected_images_total", "Images in users' requests the flow model failed, every image of each "
                 "(the good ones too), by what failed (reason) and the status code sent"),
    "images": ("bls_images_total", "Images answered by the flow model, by route"),
    "seconds": ("bls_stage_seconds_total", "Seconds spent per stage"),
    "executions": ("bls_executions_total", "execute() calls of the flow model"),
    "dropped": ("bls_dropped_images_total",
                "Images of requests dropped before they finished, by why (cancelled, expired, no_time), the stage "
                "where (admission or the child about to be called) and the status code sent"),
    "degraded": ("bls_degraded_images_total",
                 "Images answered degraded: the optional stage (child model) skipped under overload, and why (late: it "
                 "would have answered too late; busy: it refused the call)"),
    "child_calls": ("bls_child_calls_total", "Child requests sent, by child model"),
    "child_images": ("bls_child_images_total", "Images sent to child models, by child model"),
    "child_seconds": ("bls_child_seconds_total", "Seconds waiting for child models, by child model"),
    "shadow_calls": ("bls_shadow_calls_total",
                     "Shadow: calls drawn to mirror, by outcome (compared, failed, skipped, unready)"),
    "shadow_rows": ("bls_shadow_rows_total", "Shadow: rows compared"),
    "shadow_agree": ("bls_shadow_top1_agree_total", "Shadow: rows whose top-1 agree"),
    "shadow_overlap": ("bls_shadow_top5_overlap_total", "Shadow: top-5 overlap summed over rows"),
    "shadow_diff": ("bls_shadow_score_diff_total", "Shadow: rows whose stable top-1 probability moved by at most le"),
    "shadow_seconds": ("bls_shadow_seconds_total", "Shadow: seconds of the compared calls, by side"),
}


Key = tuple  # (family, *sorted (label, value) pairs)


def series(timings: Timings, answered: int, gone: int = 0) -> dict[Key, float]:
    """What one execute() adds to each series: `timings` of its users' requests, `answered`
    of which were answered (the others failed, each through Timings.reject), `gone` of those
    after their client had gone."""
    out: dict[Key, float] = {}

    def add(family: str, value: float, **labels: str) -> None:
        key = (family, *sorted(labels.items()))
        out[key] = out.get(key, 0.0) + value

    add("executions", 1)
    add("seconds", timings.decode_preprocess, stage="decode_preprocess")
    add("seconds", timings.classify, stage="classify")
    if answered - gone:
        add("requests", answered - gone, code=ANSWERED)
    if gone:
        add("requests", gone, code=GONE)
    for (reason, code), n in timings.rejected_requests.items():
        add("requests", n, code=code)
        add("rejected_requests", n, reason=reason, code=code)
    for (reason, code), n in timings.rejected.items():
        add("rejected", n, reason=reason, code=code)
    for route, n in timings.routes.items():
        add("images", n, route=route)
    for (why, stage, code), n in timings.dropped.items():
        add("dropped", n, why=why, stage=stage, code=code)
    for (stage, why), n in timings.degraded.items():
        add("degraded", n, stage=stage, why=why)
    for child, stats in timings.children.items():
        add("child_calls", stats.calls, child=child)
        add("child_images", stats.images, child=child)
        add("child_seconds", stats.seconds, child=child)
    for (stable, candidate), st in timings.trials.items():
        pair = {"stable": stable, "candidate": candidate}
        for outcome in ("compared", "failed", "skipped", "unready"):
            add("shadow_calls", getattr(st, outcome), outcome=outcome, **pair)
        add("shadow_rows", st.rows, **pair)
        add("shadow_agree", st.top1_agree, **pair)
        add("shadow_overlap", st.top5_overlap, **pair)
        for bound, n in zip(SCORE_DIFF_BOUNDS, st.score_diff):
            add("shadow_diff", n, le="+Inf" if bound == float("inf") else f"{bound:g}", **pair)
        add("shadow_seconds", st.stable_seconds, side="stable", **pair)
        add("shadow_seconds", st.candidate_seconds, side="candidate", **pair)
    return out


class OutcomeSummary:
    """The requests one instance refused (UNAVAILABLE: 503 / gRPC UNAVAILABLE) and those its
    clients cancelled, summed over `period_s`: at the end of a period with any, one line
    saying so; none for a period with none. Pure: series() counts in, the time given."""

    def __init__(self, instance: str, period_s: float = 60.0, now: float = 0.0):
        self.instance, self.period_s = instance, period_s
        self._start = now
        self._requests = 0.0
        self._refused: dict[str, float] = {}  # reason -> requests
        self._cancelled = 0.0

    def add(self, counts: dict[Key, float]) -> None:
        for (family, *labels), value in counts.items():
            if family == "requests":
                self._requests += value
            elif family == "rejected_requests":
                tags = dict(labels)
                if tags["code"] == UNAVAILABLE:
                    self._refused[tags["reason"]] = self._refused.get(tags["reason"], 0.0) + value
                elif tags["code"] == CANCELLED:
                    self._cancelled += value

    def line(self, now: float, final: bool = False) -> str | None:
        """At a period's end (or, `final`, the instance's): its line (None if nothing was
        refused or cancelled), and a new period."""
        if now - self._start < self.period_s and not final:
            return None
        parts = []
        refused = sum(self._refused.values())
        if refused:
            why = ", ".join(f"{reason} {n:.0f}"
                            for reason, n in sorted(self._refused.items(), key=lambda kv: (-kv[1], kv[0])))
            parts.append(f"{refused:.0f} refused with UNAVAILABLE ({why})")
        if self._cancelled:
            parts.append(f"{self._cancelled:.0f} cancelled by their clients")
        text = (f"{self.instance}: in the last {now - self._start:.0f} s, of {self._requests:.0f} requests, "
                + " and ".join(parts)) if parts else None
        self._start, self._requests, self._refused, self._cancelled = now, 0.0, {}, 0.0
        return text


def zero_series(stages: Sequence[str]) -> list[Key]:
    """The series that exist at 0 from a flow model's load on, so that a rate or increase()
    over them sees the first count (a series that appears at 1 shows no increase): every
    request code; and, for the door and each child model (`stages`), every way a request can
    be dropped or an image degraded there, and its calls."""
    keys: list[Key] = [("executions",)]
    keys += [("seconds", ("stage", stage)) for stage in ("decode_preprocess", "classify")]
    keys += [("requests", ("code", code)) for code in (ANSWERED, GONE, *CODES)]
    for why, code in (("cancelled", CANCELLED), ("expired", UNAVAILABLE), ("no_time", UNAVAILABLE)):
        keys += [("rejected_requests", ("code", code), ("reason", why)), ("rejected", ("code", code), ("reason", why))]
        keys += [("dropped", ("code", code), ("stage", stage), ("why", why)) for stage in ("admission", *stages)]
    for stage in stages:
        keys += [("degraded", ("stage", stage), ("why", why)) for why in ("late", "busy")]
        keys += [(family, ("child", stage)) for family in ("child_calls", "child_images", "child_seconds")]
    return keys


class FlowMetrics:
    def __init__(self, pb_utils: Any, model: str, instance: str, flush_s: float = 0.25, stages: Sequence[str] = ()):
        family = pb_utils.MetricFamily
        self._labels = {"model": model, "instance": instance}
        self._families = {key: family(name=name, description=text, kind=family.COUNTER)
                          for key, (name, text) in _FAMILIES.items()}
        self._metrics: dict[tuple, Any] = {}
        self._pending: dict[tuple, float] = {}
        self._flush_s = flush_s
        self._lock = threading.Lock()  # _pending: added to by execute(), taken by the flusher
        self._sending = threading.Lock()  # one flush at a time (the flusher's, finalize's)
        self._closing = threading.Event()
        self._restarts = family(name="bls_server_restarts", kind=family.GAUGE,
                                description="Times bls-serve restarted tritonserver after it died on its own")
        self._restarts_metric = self._restarts.Metric(labels=self._labels)
        self._restarts_metric.set(_restarts())
        self._wait = family(name="bls_queue_wait_seconds", kind=family.GAUGE,
                            description="Mean wait in Triton's queue, as Triton measured it, of the requests that left "
                                        "it in the latest window before this instance's last execute()")
        self._wait_metric = self._wait.Metric(labels=self._labels)
        self._wait_s: float | None = None
        self._summary = OutcomeSummary(instance, now=time.monotonic())
        for key in zero_series(stages):  # at 0 from the load on (zero_series)
            family, *labels = key
            self._metrics[key] = self._families[family].Metric(labels={**self._labels, **dict(labels)})
        self._flusher = threading.Thread(target=self._flush_every, name="bls-metrics", daemon=True)
        self._flusher.start()

    def record(self, timings: Timings, answered: int, gone: int = 0) -> None:
        """Add one execute()'s counts (series()); the flusher sends them."""
        counts = series(timings, answered, gone)
        with self._lock:
            for key, value in counts.items():
                self._pending[key] = self._pending.get(key, 0.0) + value
            self._summary.add(counts)
            if timings.queue_wait_s is not None:
                self._wait_s = timings.queue_wait_s

    def _flush_every(self) -> None:
        """The flusher: every flush_s, send what is pending. It is not woken by execute(): a
        thread woken there competed for the GIL with the execute() that woke it (under load
        here, the execute()'s metrics part took 2.5 ms at p90 and up to 8.5 ms; 0.06 ms and
        0.2 ms since)."""
        while not self._closing.wait(self._flush_s):
            if self._pending or self._wait_s is not None:
                self.flush()
            with self._lock:
                line = self._summary.line(time.monotonic())
            if line:
                log.warning("%s", line)

    def flush(self) -> None:
        with self._sending:
            with self._lock:
                pending, self._pending = self._pending, {}
                wait, self._wait_s = self._wait_s, None
            if wait is not None:
                self._wait_metric.set(wait)
            for key, value in pending.items():
                if key not in self._metrics:
                    family, *labels = key
                    self._metrics[key] = self._families[family].Metric(labels={**self._labels, **dict(labels)})
                self._metrics[key].increment(value)

    def close(self) -> None:
        """Stop the flusher and send what is pending (finalize)."""
        self._closing.set()
        self._flusher.join(timeout=5)
        self.flush()
        line = self._summary.line(time.monotonic(), final=True)
        if line:
            log.warning("%s", line)


def _restarts() -> int:
    try:
        return max(0, int(os.environ.get(RESTARTS_ENV, "0")))
    except ValueError:
        return 0
