"""CandidateChooser: which model of an ordered list answers, and when it looks again."""

from __future__ import annotations

import pytest

from bls_pipeline.runtime.call.routing import CandidateChooser

PREFERENCE = ("trt", "onnx", "cpu")


class Server:
    """The two things the chooser touches: a clock and model readiness."""

    def __init__(self, ready: set[str]):
        self.ready = set(ready)
        self.now = 100.0
        self.ready_checks: list[str] = []

    def is_ready(self, model: str) -> bool:
        self.ready_checks.append(model)
        return model in self.ready

    def clock(self) -> float:
        return self.now


def _chooser(server: Server, recheck_s: float = 5.0) -> CandidateChooser:
    return CandidateChooser(PREFERENCE, server.is_ready, recheck_s, clock=server.clock)


@pytest.mark.parametrize(
    ("ready", "expected"),
    [({"trt", "onnx", "cpu"}, "trt"), ({"onnx", "cpu"}, "onnx"), ({"cpu"}, "cpu"), ({"cpu", "trt"}, "trt")],
)
def test_first_ready_in_preference_order(ready, expected):
    assert _chooser(Server(ready)).choose() == expected


def test_answer_is_cached_until_recheck_interval_passes():
    server = Server({"onnx"})
    chooser = _chooser(server, recheck_s=5.0)
    assert chooser.choose() == "onnx"
    checks = len(server.ready_checks)

    server.ready.add("trt")  # the preferred model comes back
    server.now += 4.9
    assert chooser.choose() == "onnx"
    assert len(server.ready_checks) == checks  # served from the cache, no server contact

    server.now += 0.1  # recheck_s reached
    assert chooser.choose() == "trt"


def test_invalidate_forces_a_new_look():
    server = Server({"trt", "onnx"})
    chooser = _chooser(server, recheck_s=3600.0)
    assert chooser.choose() == "trt"
    server.ready.discard("trt")
    assert chooser.choose() == "trt"  # still cached
    chooser.invalidate()
    assert chooser.choose() == "onnx"


def test_exclude_skips_a_model_even_when_cached():
    server = Server({"trt", "onnx", "cpu"})
    chooser = _chooser(server, recheck_s=3600.0)
    assert chooser.choose() == "trt"
    assert chooser.choose(exclude=("trt",)) == "onnx"
    assert chooser.choose(exclude=("trt", "onnx")) == "cpu"
    assert chooser.choose(exclude=PREFERENCE) is None


def test_none_ready_returns_none_and_looks_again_next_time():
    server = Server(set())
    chooser = _chooser(server, recheck_s=3600.0)
    assert chooser.choose() is None
    assert server.ready_checks == list(PREFERENCE)
    server.ready.add("cpu")
    assert chooser.choose() == "cpu"  # "none" is not cached for recheck_s


def test_needs_at_least_one_model():
    with pytest.raises(ValueError, match="at least one"):
        CandidateChooser((), lambda m: True, 1.0)
