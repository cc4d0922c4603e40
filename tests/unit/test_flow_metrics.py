"""What one execute() adds to the flow's bls_* series (adapter/metrics.py `series`, the pure
part of FlowMetrics): requests by the code their client got, failed requests and every
image of them by reason and code, whatever reason and code the runtime recorded."""

from __future__ import annotations

from types import SimpleNamespace

from bls_pipeline.adapter.metrics import series
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
