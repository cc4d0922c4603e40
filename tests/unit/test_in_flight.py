"""When the drain counts a model still unloading as held by no request (serve/in_flight.py):
Triton reports nothing pending and nothing answered, and every python stub idle, for a whole
interval. Triton's texts are parsed as it writes them; the snapshots are built by the test."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bls_pipeline.serve.in_flight import (IDLE_TICKS, HeldStubs, QuietWatch, Snapshot, answered_counts, pending_count,
                                          quiet, stub_cpu_ticks)
from bls_pipeline.serve.processes import Stubs, destruction_began, model_of

METRICS = ("# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution "
           "per-model.\n"
           """# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="classify_bls",version="1"} 0
nv_inference_pending_request_count{model="resnet50_onnx",version="1"} 3
# HELP nv_inference_count Number of inferences performed
nv_inference_count{model="classify_bls",version="1"} 120
""")

STATS = {"model_stats": [
    {"name": "classify_bls", "version": "1",
     "inference_stats": {"success": {"count": 100, "ns": 5}, "fail": {"count": 7, "ns": 1},
                                                               "queue": {"count": 107, "ns": 9}}},
    {"name": "resnet50_onnx", "version": "1", "inference_stats": {"success": {"count": 4}}},
    {"name": "resnet50_onnx", "version": "2", "inference_stats": {"success": {"count": 1}, "fail": {}}},
]}


def snap(at, pending=0.0, answered=None, cpu=None):
    return Snapshot(at, pending, answered if answered is not None else {"classify_bls": 107},
                    cpu if cpu is not None else {11: 500})


def test_the_pending_gauge_is_summed_over_models_and_absent_is_unknown():
    assert pending_count(METRICS) == 3.0
    assert pending_count("nv_inference_count{model=\"m\",version=\"1\"} 4\n") is None


def test_answered_counts_success_and_fail_over_versions():
    assert answered_counts(STATS) == {"classify_bls": 107, "resnet50_onnx": 5}


def test_quiet_needs_nothing_pending_nothing_answered_and_idle_stubs():
    first = snap(0.0)
    assert quiet(first, snap(1.5, cpu={11: 500 + IDLE_TICKS}))
    assert not quiet(first, snap(1.5, pending=1.0))  # queued in a scheduler
    assert not quiet(first, snap(1.5, answered={"classify_bls": 108}))  # an execute() answered meanwhile
    assert not quiet(first, snap(1.5, cpu={11: 500 + IDLE_TICKS + 1}))  # a stub computing
    assert not quiet(first, snap(1.5, pending=None))  # Triton did not say: never quiet
    # A model unloaded meanwhile leaves the statistics, a stub that exited leaves /proc: neither is activity.
    assert quiet(snap(0.0, answered={"classify_bls": 107, "resnet50_onnx": 5}, cpu={11: 500, 12: 40}), snap(1.5))


def test_the_watch_counts_from_the_first_quiet_snapshot_and_starts_again_on_activity():
    readings = iter([snap(0.0, pending=2.0), snap(0.3), snap(0.6), snap(0.9, cpu={11: 600}), snap(1.2, cpu={11: 600}),
                     snap(2.8, cpu={11: 600})])
    watch = QuietWatch(lambda: next(readings), interval_s=1.5, every_s=0.25)
    assert [watch.quiet_for(t) for t in (0.0, 0.3, 0.6)] == [0.0, 0.0, 0.3]  # pending at 0.0: quiet from 0.3
    assert watch.quiet_for(0.7) == 0.3  # no new snapshot within every_s
    assert watch.quiet_for(0.9) == 0.0  # a stub computed: from here again
    assert not watch.held(1.2)
    assert watch.held(2.8)


def test_a_server_that_does_not_answer_is_never_quiet():
    def read():
        raise OSError("connection refused")

    watch = QuietWatch(read, interval_s=0.5)
    assert watch.quiet_for(5.0) == 0.0 and not watch.held(10.0)


def test_this_process_cpu_is_read_from_proc():
    ticks = stub_cpu_ticks([os.getpid(), 2 ** 22 + 1])  # the second: no such process, left out
    assert list(ticks) == [os.getpid()] and ticks[os.getpid()] >= 0


def test_a_model_counts_as_being_destroyed_once_one_of_its_stubs_has_exited():
    """Not held, only slow: its python instances are destroyed one after another, each stub
    idle meanwhile (processes.destruction_began)."""
    before = {11: "resnet50_onnx_0_0", 12: "resnet50_onnx_0_1", 13: "classify_bls_0_0"}
    nobody_left = Stubs(live=dict(before), dead=frozenset())
    assert not destruction_began("resnet50_onnx", before, nobody_left)
    one_exited = Stubs(live={12: "resnet50_onnx_0_1", 13: "classify_bls_0_0"}, dead=frozenset())
    assert destruction_began("resnet50_onnx", before, one_exited)
    assert not destruction_began("classify_bls", before, one_exited)
    # a zombie is a stub that died, not one Triton destroyed; one exiting (argv gone) has left
    assert not destruction_began("resnet50_onnx", before, Stubs(live={12: "resnet50_onnx_0_1"}, dead=frozenset({11})))
    assert (destruction_began("resnet50_onnx", before,
                              Stubs(live={12: "resnet50_onnx_0_1"}, dead=frozenset(), dying=frozenset({11}))))


def test_a_stub_exiting_says_nothing_where_two_copies_of_a_model_run():
    """A copy still finishing after a reload has stubs of the same names as the new one."""
    before = {11: "resnet50_onnx_0_0", 21: "resnet50_onnx_0_0"}
    assert not destruction_began("resnet50_onnx", before, Stubs(live={21: "resnet50_onnx_0_0"}, dead=frozenset()))
    assert not destruction_began("image_quality", before, Stubs(live={}, dead=frozenset()))  # no stub of it known


@pytest.mark.timing
def test_a_held_model_whose_stub_exits_or_computes_was_only_slow():
    """After tritonserver's SIGTERM: a stub that stays asleep keeps its model held; one that
    exits, or computes, shows its model was being destroyed (in_flight.HeldStubs)."""
    asleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    exits = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    computes = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.2); sum(range(10**6))"])
    try:
        time.sleep(0.5)  # the interpreters started
        watch = HeldStubs({asleep.pid: "classify_bls_0_0", exits.pid: "resnet50_onnx_0_0",
                           computes.pid: "image_quality_0_0"}, model_of)
        assert watch.stirred() == set()
        exits.kill()
        exits.wait()
        time.sleep(1.0)  # the computing one uses more than IDLE_TICKS in it
        assert watch.stirred() == {"resnet50_onnx", "image_quality"}
    finally:
        for proc in (asleep, exits, computes):
            proc.kill()
            proc.wait()
