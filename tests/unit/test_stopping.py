"""The stop path (serve/stopping.py), case by case, with no server: Triton's answers, the
stubs in its group, its in-flight snapshots, the clock and the process are stand-ins the
test sets, as TritonServer.stop hands in the real ones."""

from __future__ import annotations

import signal
import subprocess

import pytest

from bls_pipeline.serve import stopping
from bls_pipeline.serve.in_flight import Snapshot
from bls_pipeline.serve.processes import Stubs

# 14: a config stub
BEFORE = {11: "classify_bls_0_0", 12: "classify_bls_0_1", 13: "resnet50_onnx_0_0", 14: "resnet50_onnx"}
STAGES = [("classify_bls",), ("resnet50_onnx",)]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Triton:
    """A tritonserver as the stop sees it; `on_unload` and `tick` script what happens."""

    def __init__(self, clock: Clock, states: dict[str, str], stubs: dict[int, str]):
        self.clock, self.states_now, self.live, self.dead = clock, dict(states), dict(stubs), set()
        self.unloaded: list[str] = []
        self.pending, self.answered, self.ticks = 0.0, {}, {}
        self.answers = True  # False: every call fails as a server that hangs
        self.code = None
        self.tick = lambda triton: None  # called on each look: the scripted course of events

    def _ask(self):
        self.tick(self)
        if not self.answers:
            raise OSError("timed out")

    def states(self):
        self._ask()
        return dict(self.states_now)

    def unload(self, model):
        self._ask()
        self.unloaded.append(model)
        self.states_now[model] = "UNLOADING"

    def stubs(self):
        self._ask()
        return Stubs(dict(self.live), frozenset(self.dead))

    def snapshot(self):
        self._ask()
        return Snapshot(self.clock(), self.pending, dict(self.answered), dict(self.ticks))

    def exit_code(self):
        return self.code


def destroy_when_unloading(model: str, pid: int):
    """Triton begins to destroy `model` (its stub `pid` exits) 0.5 s after its unload."""
    began = {}

    def tick(triton):
        if model in triton.unloaded:
            began.setdefault(model, triton.clock())
            if triton.clock() - began[model] >= 0.5:
                triton.live.pop(pid, None)
                triton.states_now[model] = "UNAVAILABLE"
    return tick


def chain(*ticks):
    def tick(triton):
        for t in ticks:
            t(triton)
    return tick


@pytest.fixture
def clock():
    return Clock()


def _drain(triton, clock, limit=20.0, **kwargs):
    return stopping.drain(STAGES, triton, clock() + limit, limit_s=limit, clock=clock, sleep=clock.sleep, **kwargs)


# ---- when a stage is done with its requests -------------------------------------------------------

def test_a_model_is_done_with_its_requests_once_one_of_its_stubs_exited():
    states = {"classify_bls": "UNLOADING", "resnet50_onnx": "READY"}
    now = Stubs({11: "classify_bls_0_0", 12: "classify_bls_0_1", 13: "resnet50_onnx_0_0"}, frozenset())
    assert not stopping.done_with_requests(("classify_bls",), BEFORE, states, now)
    now = Stubs({12: "classify_bls_0_1", 13: "resnet50_onnx_0_0"}, frozenset())  # its first instance destroyed
    assert stopping.done_with_requests(("classify_bls",), BEFORE, states, now)
    assert not stopping.done_with_requests(("classify_bls", "resnet50_onnx"), BEFORE, states, now)


def test_an_unloaded_model_is_done():
    now = Stubs({13: "resnet50_onnx_0_0"}, frozenset())
    assert (stopping.done_with_requests(("classify_bls", "ensemble_resnet50"), BEFORE, {"classify_bls": "UNAVAILABLE"},
                                        now))


def test_a_dead_stub_is_no_sign_of_destruction():
    now = Stubs({12: "classify_bls_0_1"}, frozenset({11}))  # 11 killed: a zombie
    assert not stopping.done_with_requests(("classify_bls",), BEFORE, {"classify_bls": "UNLOADING"}, now)


def test_with_two_copies_of_a_model_it_waits_for_the_unload():
    """A copy still finishing after a reload has stubs of the same names: one of them exiting
    says nothing of the copy being unloaded."""
    before = {11: "classify_bls_0_0", 12: "classify_bls_0_1", 21: "classify_bls_0_0", 22: "classify_bls_0_1"}
    now = Stubs({11: "classify_bls_0_0", 12: "classify_bls_0_1"}, frozenset())  # the old copy went
    assert not stopping.done_with_requests(("classify_bls",), before, {"classify_bls": "UNLOADING"}, now)
    assert stopping.done_with_requests(("classify_bls",), before, {"classify_bls": "UNAVAILABLE"}, now)


# ---- the drain ---------------------------------------------------------------------------------------

def test_the_drain_unloads_callers_first_and_each_stage_once_the_one_before_is_being_destroyed(clock):
    triton = Triton(clock, {"classify_bls": "READY", "resnet50_onnx": "READY"},
                    {11: "classify_bls_0_0", 13: "resnet50_onnx_0_0"})
    seen = {}  # model -> the live stubs when its unload was first seen

    def record(t):
        if t.unloaded:
            seen.setdefault(t.unloaded[-1], set(t.live))
    triton.tick = chain(destroy_when_unloading("classify_bls", 11), destroy_when_unloading("resnet50_onnx", 13), record)
    result = _drain(triton, clock)
    assert result == stopping.Drain(True)
    assert list(seen) == ["classify_bls", "resnet50_onnx"]
    assert 11 not in seen["resnet50_onnx"]  # resnet50 unloaded once classify_bls's stub had exited
    assert clock() < 2.0


def test_a_drain_past_its_limit_says_which_models_were_busy(clock, caplog):
    triton = Triton(clock, {"classify_bls": "READY", "resnet50_onnx": "READY"},
                    {11: "classify_bls_0_0", 13: "resnet50_onnx_0_0"})
    triton.pending = 3.0  # requests queued: never quiet, never destroyed
    result = _drain(triton, clock, limit=5.0)
    assert not result.drained and not result.unanswered
    assert result.reason == "models still busy after 5 s of draining: classify_bls UNLOADING"
    assert 5.0 < clock() < 5.5 and "stopping anyway" in caplog.text


def test_a_model_quiet_and_not_being_destroyed_is_held_and_the_drain_goes_on(clock, caplog):
    triton = Triton(clock, {"classify_bls": "READY", "resnet50_onnx": "READY"},
                    {11: "classify_bls_0_0", 13: "resnet50_onnx_0_0"})
    triton.tick = destroy_when_unloading("resnet50_onnx", 13)  # classify_bls is never destroyed: held
    result = _drain(triton, clock)
    assert result == stopping.Drain(True, held=("classify_bls",))
    assert triton.unloaded == ["classify_bls", "resnet50_onnx"]
    assert clock() < 5.0 and "classify_bls still unloading with nothing in flight" in caplog.text


def test_a_model_whose_destruction_began_is_waited_for_not_held(clock):
    """Two instances destroyed one after the other, the second 3 s after the first (a busy
    machine): longer than QUIET_S, but the first stub's exit shows its destruction began."""
    triton = Triton(clock, {"classify_bls": "READY", "resnet50_onnx": "READY"},
                    {11: "classify_bls_0_0", 12: "classify_bls_0_1", 13: "resnet50_onnx_0_0"})

    def slow(t):
        if "classify_bls" in t.unloaded and t.clock() >= 1.0:
            t.live.pop(11, None)
        if "classify_bls" in t.unloaded and t.clock() >= 4.0:
            t.live.pop(12, None)
            t.states_now["classify_bls"] = "UNAVAILABLE"
    triton.tick = chain(slow, destroy_when_unloading("resnet50_onnx", 13))
    result = _drain(triton, clock)
    assert result == stopping.Drain(True)


def test_a_tritonserver_that_stops_answering_is_not_drained_past_unanswered_s(clock, caplog):
    triton = Triton(clock, {"classify_bls": "READY", "resnet50_onnx": "READY"}, {11: "classify_bls_0_0"})

    def freeze(t):
        if t.unloaded:
            t.answers = False
    triton.tick = freeze
    result = _drain(triton, clock, unanswered_s=5.0)
    assert not result.drained and result.unanswered
    assert result.reason.startswith("tritonserver did not answer for 5 s while draining (timed out)")
    assert 5.0 <= clock() < 6.0


def test_a_tritonserver_that_exits_mid_drain_ends_the_drain_at_once(clock):
    triton = Triton(clock, {"classify_bls": "READY", "resnet50_onnx": "READY"}, {11: "classify_bls_0_0"})

    def crash(t):
        if t.unloaded:
            t.code, t.answers = -signal.SIGSEGV, False
    triton.tick = crash
    result = _drain(triton, clock)
    assert result == stopping.Drain(False, reason="tritonserver exited with code -11 while draining")
    assert clock() < 1.0


def test_a_slow_answer_is_asked_again_not_taken_for_a_hang(clock):
    triton = Triton(clock, {"classify_bls": "READY", "resnet50_onnx": "READY"},
                    {11: "classify_bls_0_0", 13: "resnet50_onnx_0_0"})
    hiccup = destroy_when_unloading("classify_bls", 11), destroy_when_unloading("resnet50_onnx", 13)

    def tick(t):
        t.answers = not (1.0 <= t.clock() < 3.0)  # two seconds without an answer, then it answers again
        for h in hiccup:
            h(t)
    triton.tick = tick
    assert _drain(triton, clock, unanswered_s=5.0) == stopping.Drain(True)


# ---- after the drain ------------------------------------------------------------------------------

def test_dead_stubs_after_a_drain_are_stuck_copies_named_by_their_instance(caplog):
    assert stopping.stuck_copies([], lambda pid: None, 20) == ()
    names = stopping.stuck_copies([31, 32], {31: "resnet50_onnx_0_0"}.get, 20)
    assert names == ("pid 32", "resnet50_onnx_0_0")
    assert "Triton 2.51 never unloads such a copy" in caplog.text


class Process:
    """A tritonserver after SIGTERM: exits `exits_after` seconds later (None: never)."""

    def __init__(self, clock: Clock, exits_after: float | None):
        self.clock, self.exits_after, self.signals, self.pid = clock, exits_after, [], 4242
        self.termed_at = None

    def send_signal(self, sig):
        self.signals.append(sig)
        self.termed_at = self.clock()

    def wait(self, timeout=None):
        if self.exits_after is not None and self.clock() + timeout >= self.termed_at + self.exits_after:
            self.clock.now = max(self.clock(), self.termed_at + self.exits_after)
            return 0
        self.clock.sleep(timeout)
        raise subprocess.TimeoutExpired("tritonserver", timeout)


class Stirs:
    def __init__(self, clock, model=None, at=None):
        self.clock, self.model, self.at = clock, model, at

    def stirred(self):
        return {self.model} if self.model and self.clock() >= self.at else set()


def test_sigterm_and_it_exits_within_the_stops_time(clock):
    proc = Process(clock, exits_after=3.0)
    assert stopping.terminate(proc, (), Stirs(clock), deadline=25.0, clock=clock) == stopping.Terminated(True)
    assert proc.signals == [signal.SIGTERM] and clock() == 3.0


def test_a_tritonserver_that_ignores_sigterm_is_left_to_the_caller_at_the_deadline(clock):
    proc = Process(clock, exits_after=None)
    assert stopping.terminate(proc, (), Stirs(clock), deadline=25.0, clock=clock) == stopping.Terminated(False)
    assert clock() == 25.0


def test_with_a_held_model_it_gets_the_grace_not_its_exit_timeout(clock, caplog):
    proc = Process(clock, exits_after=20.0)  # Triton would wait out its exit timeout on the held model
    ended = stopping.terminate(proc, ("classify_bls",), Stirs(clock), deadline=25.0, clock=clock, grace_s=1.0)
    assert ended == stopping.Terminated(False, killed_for=("classify_bls",))
    assert 1.0 < clock() < 1.5 and "not waiting out its exit timeout for classify_bls" in caplog.text


def test_a_held_model_whose_stub_stirs_was_only_slow_and_tritonserver_may_finish(clock, caplog):
    caplog.set_level("INFO")
    proc = Process(clock, exits_after=3.0)
    ended = stopping.terminate(proc, ("classify_bls",), Stirs(clock, "classify_bls", at=0.5), deadline=25.0,
                               clock=clock, grace_s=1.0)
    assert ended == stopping.Terminated(True) and clock() == 3.0
    assert "classify_bls only slow to unload, not held" in caplog.text


def test_after_a_failed_load_it_gets_a_short_grace_then_is_killed_for_it(clock, caplog):
    """Triton 2.51 keeps a failed copy's model object live and waits its exit timeout for it."""
    proc = Process(clock, exits_after=20.0)
    ended = stopping.terminate(proc, (), Stirs(clock), deadline=25.0, clock=clock, leaked=("resnet50_onnx",),
                               leaked_grace_s=3.0)
    assert ended == stopping.Terminated(False, killed_for=("resnet50_onnx",)) and clock() == 3.0
    assert "the live model object Triton 2.51 keeps after a failed load of resnet50_onnx" in caplog.text
    quick = Process(Clock(), exits_after=1.0)
    assert stopping.terminate(quick, (), Stirs(quick.clock), deadline=25.0, clock=quick.clock,
                              leaked=("resnet50_onnx",)) == stopping.Terminated(True)
