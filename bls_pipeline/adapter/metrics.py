"""A flow model's own metrics on Triton's /metrics endpoint (pb_utils.MetricFamily).

    bls_images_total{route}              images answered, by ROUTE
    bls_rejected_images_total{reason,code}  images in failed requests: what failed (a decode
                                         reason, bad_request, too_large, too_many_regions,
                                         flow, or a child's role or name) and the status the
                                         client got (INVALID_ARGUMENT, INTERNAL, UNAVAILABLE)
    bls_stage_seconds_total{stage}       seconds in decode_preprocess and classify (the flow)
    bls_executions_total                 execute() calls (mean stage latency = seconds / executions)
    bls_dropped_images_total{why,stage,code}  images of requests dropped before they finished:
                                         cancelled (the client went), expired (its deadline passed),
                                         no_time (too little left for the next stage), shed (queue
                                         delay over queue_delay_target_ms); stage: admission (before
                                         decoding) or the child model about to be called
    bls_queue_wait_seconds               (gauge) the instance's bound on how long the requests of its
                                         last execute() waited in Triton's queue (runtime/admission.py)
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

Only users' requests are counted: the adapter leaves the watchdog's probes out.

Every series also carries model and instance labels (one series per model instance).
Each Metric.increment is a round trip to the Triton process, so execute() only adds its
counts up here; a thread of this instance sends them at most every `flush_s` (0.25 s)
after the execute() that made them, traffic or not, and at finalize. The endpoint is
never more than about `flush_s` behind, and execute() pays no round trip.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ..contract import RESTARTS_ENV
from ..runtime.trials import SCORE_DIFF_BOUNDS

__all__ = ["FlowMetrics"]

_FAMILIES = {
    "images": ("bls_images_total", "Images answered by the flow model, by route"),
    "rejected": ("bls_rejected_images_total", "Images in rejected requests, by what failed and the status code sent"),
    "seconds": ("bls_stage_seconds_total", "Seconds spent per stage"),
    "executions": ("bls_executions_total", "execute() calls of the flow model"),
    "dropped": ("bls_dropped_images_total", "Images of requests dropped before they finished, by why (cancelled, expired, "
                "no_time, shed), the stage where (admission or the child about to be called) and the status code sent"),
    "child_calls": ("bls_child_calls_total", "Child requests sent, by child model"),
    "child_images": ("bls_child_images_total", "Images sent to child models, by child model"),
    "child_seconds": ("bls_child_seconds_total", "Seconds waiting for child models, by child model"),
    "shadow_calls": ("bls_shadow_calls_total", "Shadow: calls drawn to mirror, by outcome (compared, failed, skipped, unready)"),
    "shadow_rows": ("bls_shadow_rows_total", "Shadow: rows compared"),
    "shadow_agree": ("bls_shadow_top1_agree_total", "Shadow: rows whose top-1 agree"),
    "shadow_overlap": ("bls_shadow_top5_overlap_total", "Shadow: top-5 overlap summed over rows"),
    "shadow_diff": ("bls_shadow_score_diff_total", "Shadow: rows whose stable top-1 probability moved by at most le"),
    "shadow_seconds": ("bls_shadow_seconds_total", "Shadow: seconds of the compared calls, by side"),
}




class FlowMetrics:
    def __init__(self, pb_utils: Any, model: str, instance: str, flush_s: float = 0.25):
        family = pb_utils.MetricFamily
        self._labels = {"model": model, "instance": instance}
        self._families = {key: family(name=name, description=text, kind=family.COUNTER) for key, (name, text) in _FAMILIES.items()}
        self._metrics: dict[tuple, Any] = {}
        self._pending: dict[tuple, float] = {}
        self._flush_s = flush_s
        self._lock = threading.Lock()  # _pending: added to by execute(), taken by the flusher
        self._sending = threading.Lock()  # one flush at a time (the flusher's, finalize's)
        self._due = threading.Event()  # something is pending
        self._closing = threading.Event()
        self._restarts = family(name="bls_server_restarts", kind=family.GAUGE,
                                description="Times bls-serve restarted tritonserver after it died on its own")
        self._restarts_metric = self._restarts.Metric(labels=self._labels)
        self._restarts_metric.set(_restarts())
        self._wait = family(name="bls_queue_wait_seconds", kind=family.GAUGE,
                            description="Upper bound on how long the requests of this instance's last execute() waited in "
                                        "Triton's queue")
        self._wait_metric = self._wait.Metric(labels=self._labels)
        self._wait_s: float | None = None
        self._flusher = threading.Thread(target=self._flush_when_due, name="bls-metrics", daemon=True)
        self._flusher.start()

    def _add(self, family: str, value: float, **labels: str) -> None:
        key = (family, *sorted(labels.items()))
        self._pending[key] = self._pending.get(key, 0.0) + value

    def record(self, timings: Any) -> None:
        with self._lock:
            self._record(timings)
        self._due.set()

    def _record(self, timings: Any) -> None:
        self._add("executions", 1)
        self._add("seconds", timings.decode_preprocess, stage="decode_preprocess")
        self._add("seconds", timings.classify, stage="classify")
        for route, n in timings.routes.items():
            self._add("images", n, route=route)
        for (reason, code), n in timings.rejected.items():
            self._add("rejected", n, reason=reason, code=code)
        for (why, stage, code), n in timings.dropped.items():
            self._add("dropped", n, why=why, stage=stage, code=code)
        if timings.queue_wait_s is not None:
            self._wait_s = timings.queue_wait_s
        for child, stats in timings.children.items():
            self._add("child_calls", stats.calls, child=child)
            self._add("child_images", stats.images, child=child)
            self._add("child_seconds", stats.seconds, child=child)
        for (stable, candidate), st in timings.trials.items():
            pair = {"stable": stable, "candidate": candidate}
            for outcome in ("compared", "failed", "skipped", "unready"):
                self._add("shadow_calls", getattr(st, outcome), outcome=outcome, **pair)
            self._add("shadow_rows", st.rows, **pair)
            self._add("shadow_agree", st.top1_agree, **pair)
            self._add("shadow_overlap", st.top5_overlap, **pair)
            for bound, n in zip(SCORE_DIFF_BOUNDS, st.score_diff):
                self._add("shadow_diff", n, le="+Inf" if bound == float("inf") else f"{bound:g}", **pair)
            self._add("shadow_seconds", st.stable_seconds, side="stable", **pair)
            self._add("shadow_seconds", st.candidate_seconds, side="candidate", **pair)

    def _flush_when_due(self) -> None:
        """The flusher: once something is pending, wait out the rest of flush_s since the last
        flush (so a busy instance sends at most every flush_s), then send it."""
        last = time.monotonic()
        while not self._closing.is_set():
            self._due.wait()
            if self._closing.wait(max(0.0, last + self._flush_s - time.monotonic())):
                return  # close() sends what is left
            last = time.monotonic()
            self.flush()

    def flush(self) -> None:
        with self._sending:
            with self._lock:
                pending, self._pending = self._pending, {}
                wait, self._wait_s = self._wait_s, None
                self._due.clear()
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
        self._due.set()
        self._flusher.join(timeout=5)
        self.flush()


def _restarts() -> int:
    try:
        return max(0, int(os.environ.get(RESTARTS_ENV, "0")))
    except ValueError:
        return 0
