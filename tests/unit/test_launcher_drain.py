"""When the drain moves on from a stage: its models unloaded, or being destroyed (one of the
stubs a model had before the drain exited). No server here: the launcher's view of Triton's
model states and of the processes is set by the test."""

from __future__ import annotations

import pytest

from bls_pipeline.serve import server
from bls_pipeline.serve.processes import Stubs


class Seen:
    def __init__(self, monkeypatch, states: dict[str, str]):
        self.states, self.now = states, Stubs({}, frozenset())
        admin = type("Admin", (), {"states": lambda _: self.states})()
        monkeypatch.setattr(server.TritonServer, "admin", property(lambda _: admin))
        monkeypatch.setattr(server, "stubs", lambda pgid: self.now)


@pytest.fixture
def launcher(tmp_path):
    return server.TritonServer(server.ServerOptions(tmp_path))


BEFORE = {11: "classify_bls_0_0", 12: "classify_bls_0_1", 13: "resnet50_onnx_0_0", 14: "resnet50_onnx"}  # 14: a config stub


def test_a_model_is_done_with_its_requests_once_one_of_its_stubs_exited(launcher, monkeypatch):
    seen = Seen(monkeypatch, {"classify_bls": "UNLOADING", "resnet50_onnx": "READY"})
    seen.now = Stubs({11: "classify_bls_0_0", 12: "classify_bls_0_1", 13: "resnet50_onnx_0_0"}, frozenset())
    assert not launcher._done_with_requests(("classify_bls",), BEFORE)
    seen.now = Stubs({12: "classify_bls_0_1", 13: "resnet50_onnx_0_0"}, frozenset())  # its first instance destroyed
    assert launcher._done_with_requests(("classify_bls",), BEFORE)
    assert not launcher._done_with_requests(("classify_bls", "resnet50_onnx"), BEFORE)


def test_an_unloaded_model_is_done(launcher, monkeypatch):
    seen = Seen(monkeypatch, {"classify_bls": "UNAVAILABLE"})
    seen.now = Stubs({13: "resnet50_onnx_0_0"}, frozenset())
    assert launcher._done_with_requests(("classify_bls", "ensemble_resnet50"), BEFORE)  # the ensemble had no stub


def test_a_dead_stub_is_no_sign_of_destruction(launcher, monkeypatch):
    seen = Seen(monkeypatch, {"classify_bls": "UNLOADING"})
    seen.now = Stubs({12: "classify_bls_0_1"}, frozenset({11}))  # 11 killed: a zombie
    assert not launcher._done_with_requests(("classify_bls",), BEFORE)


def test_with_two_copies_of_a_model_it_waits_for_the_unload(launcher, monkeypatch):
    """A copy still finishing after a reload has stubs of the same names: one of them exiting
    says nothing of the copy being unloaded."""
    before = {11: "classify_bls_0_0", 12: "classify_bls_0_1", 21: "classify_bls_0_0", 22: "classify_bls_0_1"}
    seen = Seen(monkeypatch, {"classify_bls": "UNLOADING"})
    seen.now = Stubs({11: "classify_bls_0_0", 12: "classify_bls_0_1"}, frozenset())  # the old copy went
    assert not launcher._done_with_requests(("classify_bls",), before)
    seen.states = {"classify_bls": "UNAVAILABLE"}
    assert launcher._done_with_requests(("classify_bls",), before)
