"""What one execute() adds to the flow's bls_* series (adapter/metrics.py `series`, the pure
part of FlowMetrics): requests by the code their client got, failed requests and every
image of them by reason and code, whatever reason and code the runtime recorded."""

from __future__ import annotations

from types import SimpleNamespace

from bls_pipeline.adapter.metrics import OutcomeSummary, series, zero_series
from bls_pipeline.runtime.results import RequestError, Timings


def _value(counts: dict, family: str, **labels: str) -> float:
    return counts.get((family, *sorted(labels.items())), 0.0)


def test_a_failed_request_counts_once_and_every_image_it_carried():
    timings = Timings()
    timings.reject(RequestError("IMAGE[1]: not a decodable image", "unsupported_format"), 3)  # 3 images, one bad
    counts = series(timings, answered=2)
    assert _value(counts, "requests", code="OK") == 2
    assert _value(counts, "requests", code="INVALID_ARGUMENT") == 1
    assert _value(counts, "rejected_requests", reason="unsupported_format", code="INVALID_ARGUMENT") == 1
    assert _value(counts, "rejected", reason="unsupported_format", code="INVALID_ARGUMENT") == 3


def test_each_code_is_counted_apart():
    timings = Timings()
    timings.reject(RequestError("broken", "resnet50_onnx", "INTERNAL"), 2)
    timings.reject(RequestError("broken", "resnet50_onnx", "INTERNAL"), 1)
    timings.reject(RequestError("no classifier is ready", "classifiers", "UNAVAILABLE"), 4)
    counts = series(timings, answered=0)
    assert _value(counts, "requests", code="INTERNAL") == 2
    assert _value(counts, "requests", code="UNAVAILABLE") == 1
    assert _value(counts, "rejected", reason="resnet50_onnx", code="INTERNAL") == 3
    assert ("requests", ("code", "OK")) not in counts  # nothing answered: nothing added


def test_any_reason_and_code_recorded_through_reject_reaches_the_series():
    """A failure the runtime records with a reason and a code of its own (a cancelled request,
    say) needs no change here."""
    timings = Timings()
    timings.reject(SimpleNamespace(reason="cancelled", code="CANCELLED"), 2)
    counts = series(timings, answered=1)
    assert _value(counts, "requests", code="CANCELLED") == 1
    assert _value(counts, "rejected_requests", reason="cancelled", code="CANCELLED") == 1
    assert _value(counts, "rejected", reason="cancelled", code="CANCELLED") == 2


def test_an_answer_whose_client_had_gone_is_counted_apart_from_ok():
    counts = series(Timings(), answered=5, gone=2)
    assert _value(counts, "requests", code="OK") == 3 and _value(counts, "requests", code="GONE") == 2


def test_degraded_images_are_counted_by_the_stage_skipped_and_why():
    timings = Timings()
    timings.count(timings.degraded, ("resnet50_onnx", "late"), 3)
    timings.count(timings.degraded, ("resnet50_onnx", "busy"))
    counts = series(timings, answered=4)
    assert _value(counts, "degraded", stage="resnet50_onnx", why="late") == 3
    assert _value(counts, "degraded", stage="resnet50_onnx", why="busy") == 1


def test_every_series_an_alert_reads_exists_at_zero_from_the_load():
    """A series that appears at its first count shows no increase in Prometheus: each code, and
    each way a request is dropped or an image degraded at the door and at each child, start at 0."""
    keys = set(zero_series(("efficientnet_lite0_int8", "resnet50_onnx")))
    for code in ("OK", "GONE", "INVALID_ARGUMENT", "INTERNAL", "UNAVAILABLE", "CANCELLED"):
        assert ("requests", ("code", code)) in keys
    for stage in ("admission", "efficientnet_lite0_int8", "resnet50_onnx"):
        assert ("dropped", ("code", "UNAVAILABLE"), ("stage", stage), ("why", "expired")) in keys
        assert ("dropped", ("code", "CANCELLED"), ("stage", stage), ("why", "cancelled")) in keys
    assert ("degraded", ("stage", "resnet50_onnx"), ("why", "late")) in keys
    assert ("degraded", ("stage", "admission"), ("why", "late")) not in keys  # the door degrades nothing
    # Every key is one series() makes: the same families and labels.
    timings = Timings()
    timings.count(timings.degraded, ("resnet50_onnx", "busy"))
    timings.count(timings.dropped, ("no_time", "admission", "UNAVAILABLE"))
    timings.reject(RequestError("x", "no_time", "UNAVAILABLE"), 1)
    assert set(series(timings, answered=1)) <= keys


def _execute(answered: int = 0, **failed: tuple[str, int]) -> dict:
    """One execute()'s series: `answered` answered, and requests failed as reason=(code, n)."""
    timings = Timings()
    for reason, (code, n) in failed.items():
        for _ in range(n):
            timings.reject(RequestError("refused", reason, code), 1)
    return series(timings, answered)


def test_one_line_a_minute_sums_the_refusals_and_cancellations_by_reason():
    summary = OutcomeSummary("classify_bls_0_1", period_s=60.0, now=1000.0)
    summary.add(_execute(answered=300, shed=("UNAVAILABLE", 30), no_time=("UNAVAILABLE", 5)))
    summary.add(_execute(answered=70, cancelled=("CANCELLED", 4), classifiers=("UNAVAILABLE", 2),
                         unsupported_format=("INVALID_ARGUMENT", 1)))
    assert summary.line(1059.9) is None  # not a minute yet
    assert summary.line(1060.1) == ("classify_bls_0_1: in the last 60 s, of 412 requests, 37 refused with UNAVAILABLE "
                                    "(shed 30, no_time 5, classifiers 2) and 4 cancelled by their clients")
    assert summary.line(1121.0) is None  # a new minute: nothing since


def test_a_minute_with_no_refusal_or_cancellation_says_nothing():
    summary = OutcomeSummary("classify_bls_0_0", now=0.0)
    summary.add(_execute(answered=500, unsupported_format=("INVALID_ARGUMENT", 3), resnet50_onnx=("INTERNAL", 1)))
    assert summary.line(61.0) is None
    summary.add(_execute(cancelled=("CANCELLED", 1)))  # the next minute counts afresh
    assert summary.line(122.0) == "classify_bls_0_0: in the last 61 s, of 1 requests, 1 cancelled by their clients"


def test_the_last_part_of_a_minute_is_said_when_the_instance_stops():
    summary = OutcomeSummary("classify_bls_0_0", now=0.0)
    summary.add(_execute(answered=2, shed=("UNAVAILABLE", 1)))
    assert summary.line(10.0) is None
    assert (summary.line(10.0, final=True)
            == "classify_bls_0_0: in the last 10 s, of 3 requests, 1 refused with UNAVAILABLE (shed 1)")
