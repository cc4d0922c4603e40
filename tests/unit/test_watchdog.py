"""The watchdog's own parts: which model a dead-stub error names, its probe request, and how
it tells a dead stub from the processes (a real zombie in a stand-in process group)."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as tc

from bls_pipeline.base.modelconfig import parse_config
from bls_pipeline.serve import watchdog
from bls_pipeline.serve.processes import Stubs, model_of, stubs
from bls_pipeline.serve.watchdog import ProbeBackoff, Watchdog, _probe_inputs, dead_stub_model, instance_names

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_dead_stub_model_from_triton_messages():
    assert dead_stub_model("Stub process 'resnet50_onnx_0_0' is not healthy.") == "resnet50_onnx"
    assert (dead_stub_model("classifier x failed: Stub process 'classify_bls_failover_0_12' is not healthy.")
            == "classify_bls_failover")
    assert dead_stub_model("Request for unknown model: 'resnet50_onnx' has no available versions") is None
    assert dead_stub_model("IMAGE[0]: not a decodable image") is None


def test_probe_for_an_image_model_is_one_small_jpeg():
    (image,) = _probe_inputs(tc, parse_config(MODELS / "classify_bls"))  # optional TOPK left out
    assert image.name() == "IMAGE" and image.shape() == [1, 1] and image.datatype() == "BYTES"


def test_probe_for_a_classifier_is_one_zero_tensor():
    (tensor,) = _probe_inputs(tc, parse_config(MODELS / "resnet50_onnx"))
    assert tensor.name() == "input" and tensor.shape() == [1, 3, 224, 224] and tensor.datatype() == "FP32"
    assert np.frombuffer(tensor._get_binary_data(), np.float32).max() == 0


def test_instance_names_follow_the_config():
    assert (instance_names("classify_bls", parse_config(MODELS / "classify_bls"))
            == {"classify_bls_0_0", "classify_bls_0_1"})
    assert instance_names("resnet50_onnx", parse_config(MODELS / "resnet50_onnx")) == {"resnet50_onnx_0_0"}


class Processes:
    """What the watchdog reads from /proc, set by the test, and which models Triton says are READY."""

    def __init__(self, monkeypatch, dog: Watchdog, ready: set[str]):
        self.now = Stubs({}, frozenset())
        monkeypatch.setattr(watchdog, "stubs", lambda pgid: self.now)
        dog._is_ready = lambda model: model in ready

    def set(self, live: dict[int, str], dead: tuple[int, ...] = (), dying: tuple[int, ...] = ()) -> None:
        self.now = Stubs(live, frozenset(dead), frozenset(dying))


@pytest.fixture
def dog(monkeypatch):
    configs = {m: parse_config(MODELS / m) for m in ("classify_bls", "resnet50_onnx")}
    dog = Watchdog("127.0.0.1:1", configs, reload=lambda m: None, pgid=None)
    dog._pgid = 12345  # the stand-in processes below, looked at from here on
    yield dog
    dog._client.close()


START = {11: "classify_bls_0_0", 12: "classify_bls_0_1", 13: "resnet50_onnx_0_0"}


def test_a_stub_that_became_a_zombie_is_dead_until_a_fresh_copy_serves_its_instance(dog, monkeypatch):
    procs = Processes(monkeypatch, dog, ready={"classify_bls", "resnet50_onnx"})
    procs.set(START)
    assert dog._dead_stubs() == []
    procs.set({11: "classify_bls_0_0", 12: "classify_bls_0_1"}, dead=(13,))  # resnet50_onnx's only stub killed
    assert dog._dead_stubs() == ["resnet50_onnx"] and dog.instance_of(13) == "resnet50_onnx_0_0"
    # reloaded; old copy stuck
    procs.set({11: "classify_bls_0_0", 12: "classify_bls_0_1", 14: "resnet50_onnx_0_0"}, dead=(13,))
    assert dog._dead_stubs() == []
    assert dog.instance_of(13) == "resnet50_onnx_0_0"  # kept while a zombie: the stop names it


def test_a_stub_seen_while_it_exits_is_still_named_once_a_zombie(dog, monkeypatch):
    """Killed, a stub first exits (its argv already gone, not a zombie yet): a look then must
    not forget which instance it served, or the stop could not name the copy it leaves stuck
    (seen once in a test run on a loaded machine: "pid 17115")."""
    procs = Processes(monkeypatch, dog, ready={"classify_bls", "resnet50_onnx"})
    procs.set(START)
    dog._dead_stubs()
    procs.set({11: "classify_bls_0_0", 12: "classify_bls_0_1"}, dying=(13,))
    dog._dead_stubs()
    procs.set({11: "classify_bls_0_0", 12: "classify_bls_0_1"}, dead=(13,))
    assert dog._dead_stubs() == ["resnet50_onnx"] and dog.instance_of(13) == "resnet50_onnx_0_0"


def test_one_dead_stub_of_a_two_instance_model(dog, monkeypatch):
    procs = Processes(monkeypatch, dog, ready={"classify_bls", "resnet50_onnx"})
    procs.set(START)
    dog._dead_stubs()
    procs.set({12: "classify_bls_0_1", 13: "resnet50_onnx_0_0"}, dead=(11,))
    assert dog._dead_stubs() == ["classify_bls"]


def test_stubs_of_an_unloaded_model_are_not_dead(dog, monkeypatch):
    """Unloaded through the repository API: its stubs are reaped and Triton does not call it
    READY; they are forgotten, so loading it again later is no death either."""
    procs = Processes(monkeypatch, dog, ready={"classify_bls"})
    procs.set(START)
    dog._dead_stubs()
    procs.set({11: "classify_bls_0_0", 12: "classify_bls_0_1"})
    assert dog._dead_stubs() == [] and dog.instance_of(13) is None


def test_a_stub_that_is_gone_while_its_model_is_ready_is_dead(dog, monkeypatch):
    procs = Processes(monkeypatch, dog, ready={"classify_bls", "resnet50_onnx"})
    procs.set(START)
    dog._dead_stubs()
    procs.set({11: "classify_bls_0_0", 12: "classify_bls_0_1"})
    assert dog._dead_stubs() == ["resnet50_onnx"]


def test_a_reload_swapping_copies_is_no_death(dog, monkeypatch):
    """The old copy's stubs go once the fresh copy's, of the same instances, serve."""
    procs = Processes(monkeypatch, dog, ready={"classify_bls", "resnet50_onnx"})
    procs.set(START)
    dog._dead_stubs()
    procs.set({11: "classify_bls_0_0", 12: "classify_bls_0_1", 13: "resnet50_onnx_0_0", 14: "resnet50_onnx_0_0"})
    dog._dead_stubs()
    procs.set({11: "classify_bls_0_0", 12: "classify_bls_0_1", 14: "resnet50_onnx_0_0"})
    assert dog._dead_stubs() == []


def test_a_zombie_never_seen_alive_is_the_instance_with_no_live_stub(dog, monkeypatch):
    procs = Processes(monkeypatch, dog, ready={"classify_bls", "resnet50_onnx"})
    procs.set({11: "classify_bls_0_0", 12: "classify_bls_0_1"}, dead=(99,))  # died between two looks
    assert dog._dead_stubs() == ["resnet50_onnx"] and dog.instance_of(99) is None


def test_the_live_stubs_of_a_group_with_none_are_none():
    assert stubs(os.getpgrp()).live == {}  # pytest's own group runs no stub


def test_stubs_reads_live_and_dead_stubs_of_a_real_group(tmp_path):
    """A stand-in tritonserver (a group leader) starts two processes named and called as
    python stubs are, then kills one without reaping it: a zombie, as Triton 2.51 leaves a
    killed stub until the copy it served unloads."""
    stub = tmp_path / "triton_python_backend_stub"
    stub.symlink_to(sys.executable)
    leader = (
        "import os, signal, subprocess, sys, time\n"
        f"stub = {str(stub)!r}\n"
        "kids = [subprocess.Popen([stub, '-c', 'import time; time.sleep(60)', 'model.py', 'shm', '1', '1', '0', name])"
        " for name in ('m_0_0', 'm_0_1')]\n"
        "print(kids[0].pid, kids[1].pid, flush=True)\n"
        "sys.stdin.readline()\n"
        "os.kill(kids[0].pid, signal.SIGKILL)\n"  # not waited for: it stays a zombie
        "print('killed', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", leader], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        first, second = map(int, proc.stdout.readline().split())
        deadline = time.monotonic() + 30
        while stubs(proc.pid).live != {first: "m_0_0", second: "m_0_1"}:  # until both have exec'd
            assert time.monotonic() < deadline, stubs(proc.pid)
            time.sleep(0.05)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "killed\n"
        deadline = time.monotonic() + 30
        while stubs(proc.pid) != Stubs({second: "m_0_1"}, frozenset({first})):
            assert time.monotonic() < deadline, stubs(proc.pid)
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_model_of_an_instance():
    assert model_of("classify_bls_failover_0_12") == "classify_bls_failover"
    assert model_of("resnet50_onnx") is None  # the stub that completes a config at load is named by its model


def test_a_probe_that_waits_does_not_hold_up_the_looks(monkeypatch):
    """A flow's probe can wait up to its timeout while the flow retries a dead child; the looks
    at the processes go on meanwhile, so the dead stub is reloaded at once, not after the probe
    (a test on a loaded machine saw user requests time out behind such a probe)."""
    configs = {m: parse_config(MODELS / m) for m in ("classify_bls", "resnet50_onnx")}
    reloaded, probing, release = [], threading.Event(), threading.Event()

    def reload(model):  # a fresh copy serves the instance; the old stub stays a zombie
        reloaded.append(model)
        procs.set({11: "classify_bls_0_0", 12: "classify_bls_0_1", 14: "resnet50_onnx_0_0"}, dead=(13,))

    dog = Watchdog("127.0.0.1:1", configs, reload=reload, interval_s=0.05, pgid=None)
    dog._pgid = 12345
    procs = Processes(monkeypatch, dog, ready={"classify_bls", "resnet50_onnx"})
    procs.set(START)

    def stuck_probe(model, inputs):
        probing.set()
        release.wait(10)

    dog._probe = stuck_probe
    dog.start()
    try:
        assert probing.wait(5)
        procs.set({11: "classify_bls_0_0", 12: "classify_bls_0_1"}, dead=(13,))  # resnet50_onnx's stub killed
        deadline = time.monotonic() + 5
        while not reloaded and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reloaded == ["resnet50_onnx"] and not release.is_set()  # while the probe still waits
    finally:
        release.set()
        dog.stop()


def test_models_ready_later_are_watched_from_the_next_round(dog):
    """The watchdog asks which python models are READY before each round: one loaded later
    through the repository API is probed, and its instances' stubs watched, from then on."""
    configs = {m: parse_config(MODELS / m) for m in ("classify_bls", "resnet50_onnx", "image_quality")}
    now = {"classify_bls": configs["classify_bls"]}
    dog._models = lambda: dict(now)
    dog._watch(dog._models())
    assert list(dog._probes) == ["classify_bls"]
    now.update(image_quality=configs["image_quality"])
    dog._watch(dog._models())
    assert list(dog._probes) == ["classify_bls", "image_quality"]
    assert dog._instances["image_quality"] == {"image_quality_0_0"}


def test_a_probes_outcome_is_kept_but_overload_and_timeouts_say_nothing(dog, monkeypatch):
    from tritonclient.utils import InferenceServerException

    answers = iter([None, InferenceServerException("[StatusCode.INTERNAL] no classifier can answer"),
                    InferenceServerException("[503] Exceeds maximum queue size"), TimeoutError("timed out")])

    def infer(model, inputs, **kwargs):
        assert kwargs["request_id"] == "bls_probe" and kwargs["parameters"] == {"bls_probe": True}
        answer = next(answers)
        if answer is not None:
            raise answer

    monkeypatch.setattr(dog._client, "infer", infer)
    dog._probe("classify_bls", [])
    assert dog.outcomes["classify_bls"].ok
    dog._probe("classify_bls", [])
    assert not dog.outcomes["classify_bls"].ok and "no classifier can answer" in dog.outcomes["classify_bls"].message
    for _ in range(2):  # refused for overload, timed out: the last outcome stands
        dog._probe("classify_bls", [])
        assert not dog.outcomes["classify_bls"].ok and "no classifier" in dog.outcomes["classify_bls"].message


# ---- a model that stays broken: probes back off, one log line per change ----------------------

def test_a_broken_models_probes_back_off_to_the_cap_and_log_once():
    """Probed every 2 s, a model left broken logged a line each probe (84 in 5 minutes with no
    traffic); now 2, 4, 8, 16, 30, 30 s apart, with one line when it breaks and one when it answers."""
    backoff = ProbeBackoff(interval_s=2.0, max_s=30.0)
    now, probes, lines = 0.0, [], []
    while now <= 300.0:
        if backoff.due("m", now):
            probes.append(now)
            lines.append(backoff.failed("m", "[StatusCode.INTERNAL] Expected [-1,3,224,224], got [1,3,200,200]\nmore",
                                        now))
        now += 2.0  # the watchdog's rounds
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[:5] == [2.0, 4.0, 8.0, 16.0, 30.0] and set(gaps[4:]) == {30.0}
    assert len(probes) == 14  # in 5 minutes, not 150
    said = [ln for ln in lines if ln]
    assert (said
            == ["watchdog: the probe of m failed: [StatusCode.INTERNAL] Expected [-1,3,224,224], got [1,3,200,200]; "
                "probing it again in 2 s, then twice as long each time, up to every 30 s, until it answers"])
    assert backoff.answered("m", 301.0) == "watchdog: m answers its probe again, after 301 s and 14 failed probe(s)"
    assert backoff.answered("m", 303.0) is None and backoff.due("m", 303.0)  # answering: every round, nothing logged
    assert backoff.failed("m", "broken again", 304.0).startswith("watchdog: the probe of m failed: broken again;")


def test_a_model_that_answers_is_probed_every_round_and_never_logged():
    backoff = ProbeBackoff(2.0, 30.0)
    assert all(backoff.due("m", t) and backoff.answered("m", t) is None for t in range(0, 20, 2))


def test_probe_soon_probes_a_broken_model_at_the_next_round_and_restarts_its_backoff():
    backoff = ProbeBackoff(2.0, 30.0)
    for t in (0.0, 2.0, 6.0, 14.0, 30.0):
        backoff.failed("m", "x", t)
    assert not backoff.due("m", 31.0)
    backoff.probe_soon()
    assert backoff.due("m", 31.0)
    assert backoff.failed("m", "x", 31.0) is None  # still broken: no new line
    assert not backoff.due("m", 32.0) and backoff.due("m", 33.0)  # interval_s again, then doubling


def test_the_watchdog_skips_a_broken_model_until_due_and_a_change_in_the_ready_models_probes_it(dog, monkeypatch,
                                                                                                caplog):
    from tritonclient.utils import InferenceServerException

    sent, clock = [], [100.0]

    def infer(model, inputs, **kwargs):
        sent.append((clock[0], model))
        if model == "classify_bls":
            raise InferenceServerException("[StatusCode.INTERNAL] resnet50_onnx returned output with shape (1, 10)")

    class Rounds:
        """The probes' loop's waits: each one 2 s on the clock, then a halt after `left` rounds."""
        left = 0

        def wait(self, seconds):
            self.left -= 1
            clock[0] += 2.0
            return self.left < 0

        def is_set(self):
            return False

    monkeypatch.setattr(dog._client, "infer", infer)
    monkeypatch.setattr(watchdog.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(dog, "_look", lambda: None)
    dog._halt = Rounds()
    dog._halt.left = 5
    with caplog.at_level("INFO", logger=watchdog.__name__):
        dog._probe_rounds()  # rounds at 102, 104, ... 110
    assert [t for t, m in sent if m == "resnet50_onnx"] == [102, 104, 106, 108, 110]
    assert [t for t, m in sent if m == "classify_bls"] == [102, 104, 108]  # then 2 s, 4 s later; next due at 116
    assert [r.getMessage() for r in caplog.records] == [
        "watchdog: the probe of classify_bls failed: [StatusCode.INTERNAL] resnet50_onnx returned output with shape "
        "(1, 10); probing it again in 2 s, then twice as long each time, up to every 30 s, until it answers"]
    configs = {m: parse_config(MODELS / m) for m in ("classify_bls", "resnet50_onnx", "image_quality")}
    dog._models = lambda: configs  # a model loaded: the broken one is probed at the next round
    sent.clear()
    dog._halt.left = 1
    dog._probe_rounds()
    # classify_bls due at 116 else
    assert sent == [(114, "classify_bls"), (114, "resnet50_onnx"), (114, "image_quality")]
