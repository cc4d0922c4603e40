"""Triton 2.51's defects that bls-serve works around, in one place.

Each constant below is what the launcher, the watchdog and the stop read to live with one
defect of Triton 2.51 (the nvidia-pytriton wheel's tritonserver, and the NGC 24.10 image);
WORKAROUNDS names every workaround, the defect it answers, where it lives, the test that
shows it, and what a newer Triton lets go. The words of Triton's that they read (DEAD_STUB,
PROBE_BUSY, LOAD_FAILED, ...) are base/messages.py's, named here with the rest.
docs/reliability.md, "Triton 2.51 workarounds", lists them (tests/unit/test_workarounds.py
checks the list, and that each test exists).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base.messages import DEAD_STUB, LOAD_FAILED, LOADED, PROBE_BUSY, TRITON_FATAL

__all__ = ["DEAD_STUB", "HELD_GRACE_S", "LEAKED_GRACE_S", "LOAD_FAILED", "LOADED", "PROBE_BUSY", "STUB_ARGV",
           "STUB_HEALTH_CHECK_S", "TRITON_FATAL", "Workaround", "WORKAROUNDS"]


@dataclass(frozen=True)
class StubArgv:
    """Where the python backend's stub (triton_python_backend_stub, pb_stub.cc's main) keeps
    what bls-serve reads of it on its command line: a stub that died keeps no command line."""
    model_path: int = 1
    shm_region: int = 2  # its shared-memory region, named from --backend-config python,shm-region-prefix-name
    parent_pid: int = 5  # the tritonserver that started it
    instance: int = 8  # the model instance it serves ("classify_bls_0_1")


STUB_ARGV = StubArgv()

# The python backend checks each stub's health every second, and destroying a python instance
# begins with that check: one instance takes a little over this long to go.
STUB_HEALTH_CHECK_S = 1.0
# After a drain that found a model held with nothing in flight (stopping.py), how long
# tritonserver gets after its SIGTERM to exit by itself before it is killed, unless a stub of
# a held model stirs meanwhile.
HELD_GRACE_S = STUB_HEALTH_CHECK_S
# After a full drain, how long a tritonserver whose log named a failed load gets after its
# SIGTERM before it is killed: on 2.51 the failed copy's model object stays live, and it would
# wait out its exit timeout for it ("Found 1 live models"). A clean exit after a drain takes
# about a second (the last instances' destruction).
LEAKED_GRACE_S = 3.0


@dataclass(frozen=True)
class Workaround:
    name: str
    defect: str  # what Triton 2.51 does
    workaround: str  # what bls-serve does about it
    where: str  # the code
    test: str  # the test that shows it: tests/<path>::<test>
    newer: str  # what a newer Triton lets go


WORKAROUNDS = (
    Workaround(
        "tracing abort",
        "The tracer's TraceManager::TraceRelease destroys a trace while it holds the trace's own mutex, then unlocks "
        "the freed mutex: where the trace's last release comes after its client's response (an answer sent at the "
        "door, a BLS child call), a heap chunk another thread took is written; tritonserver aborts (a tpp.c "
        "assertion, `malloc(): invalid size`) or crashes, then deadlocks in its own signal handler.",
        "bls-serve runs tritonserver with request tracing off (no TraceRelease ever runs); --trace-rate N turns a "
        "sample on for bls-explain and the status port's histograms, at that risk; Triton's latency summaries "
        "(summary_latencies) measure every request for the alerts.",
        "serve/argv.py (trace_args), serve/options.py (ServerOptions.trace_rate)",
        "tests/integration/test_tracing.py::test_bls_serve_as_shipped_traces_nothing",
        "Triton 2.57 (server PR #8144) releases the mutex before the trace is destroyed: tracing every request is "
        "safe again."),
    Workaround(
        "a crash that hangs",
        "After a fatal signal, tritonserver's ErrorSignalHandler can deadlock on malloc's lock while it prints the "
        "stack: the process stays alive, its ports accept connections and answer nothing.",
        "bls-serve asks /v2/health/live over HTTP and gRPC, each with a timeout; a tritonserver that leaves either "
        "unanswered for --hang-timeout is killed with its group and restarted (cause `hung`).",
        "serve/liveness.py, serve/cli.py (_serve)",
        "tests/integration/test_hangs.py::test_a_frozen_tritonserver_is_replaced_and_classify_bls_answers_again",
        "Nothing: any server can hang; a newer Triton only hangs less."),
    Workaround(
        "the unrestarted stub",
        "A python stub that died (OOM killer, SIGKILL) or stopped answering its health check is never restarted: the "
        "model stays READY and each request fails with \"Stub process '<instance>' is not healthy\".",
        "The watchdog sees the dead stub (processes, or that message) and loads a fresh copy beside the old one; a "
        "stub still alive that Triton found unhealthy (frozen) is killed once the fresh copy serves.",
        "serve/watchdog.py, DEAD_STUB",
        "tests/integration/test_hangs.py::test_a_frozen_stub_is_replaced_and_the_stop_then_takes_seconds",
        "Not verified fixed in a later release: run its test on the new Triton before dropping it."),
    Workaround(
        "the stuck copy",
        "A model copy that got a request after its stub died keeps that request's response factory forever: it never "
        "unloads, its dead stub stays a zombie, and tritonserver waits out --exit-timeout-secs on it, then exits 1.",
        "After a full drain, a dead stub still in tritonserver's group marks such a copy: tritonserver is killed at "
        "once (nothing is in flight) and the stop exits 0.",
        "serve/stopping.py (stuck_copies)",
        "tests/integration/test_faults.py::test_a_copy_left_stuck_by_a_dead_stub_does_not_hold_up_the_stop",
        "Not verified fixed in a later release: run its test on the new Triton before dropping it."),
    Workaround(
        "the held model",
        "After a spike of cancelled gRPC calls, Triton can keep a model from unloading with nothing in flight, until "
        "its exit timeout.",
        "The drain watches Triton's pending gauge, its statistics and the stubs' CPU (in_flight.py): a model quiet for "
        "QUIET_S whose destruction did not begin is held; tritonserver gets HELD_GRACE_S after SIGTERM, then is "
        "killed.",
        "serve/stopping.py (drain, terminate), serve/in_flight.py",
        "tests/integration/test_stop_after_spike.py::test_ten_stops_after_grpc_spikes_each_take_seconds_and_exit_0",
        "Not verified fixed in a later release: run its test on the new Triton before dropping it."),
    Workaround(
        "the health-check timing",
        "A python instance's destruction begins with the backend's 1 s health check, one instance after another: a "
        "model of two instances takes over 2 s to unload, its stubs idle meanwhile.",
        "The drain starts the next stage once the first stub of a model exits (processes.destruction_began), and a "
        "model whose destruction began is never counted held (STUB_HEALTH_CHECK_S, HELD_GRACE_S).",
        "serve/stopping.py, serve/processes.py",
        "tests/unit/test_stopping.py::test_a_model_is_done_with_its_requests_once_one_of_its_stubs_exited",
        "Not verified fixed in a later release: run its test on the new Triton before dropping it."),
    Workaround(
        "the stub's argv layout",
        "A stub names its model instance only on its command line (argv[8]), with its shared-memory region (argv[2]) "
        "and its tritonserver (argv[5]); Triton reaps a dead stub only when it unloads the copy.",
        "processes.py reads STUB_ARGV to find each stub's instance, and the orphans of a killed bls-serve by the "
        "region prefix it gave them.",
        "serve/processes.py, STUB_ARGV",
        "tests/unit/test_watchdog.py::test_stubs_reads_live_and_dead_stubs_of_a_real_group",
        "Not verified fixed in a later release: run its test on the new Triton before dropping it."),
    Workaround(
        "the reload key",
        "A load of a loaded model with its config as served is a no-op, so a model cannot be loaded afresh beside "
        "its serving copy.",
        "reload_model loads the config as served with RELOAD_KEY (base/modelconfig.py) counted up: a config that "
        "differs, so Triton loads a fresh copy and swaps it in once READY.",
        "serve/server.py (reload_model), base/modelconfig.py (RELOAD_KEY)",
        "tests/integration/test_faults.py::test_killed_stub_is_detected_and_reloaded",
        "Not verified fixed in a later release: run its test on the new Triton before dropping it."),
    Workaround(
        "the silent failed reload",
        "A reload that fails while a copy serves leaves that copy READY; the repository index shows no reason and "
        "only the log says \"failed to load\".",
        "bls-serve reads tritonserver's log as it passes it on (tritonlog.py): such a line is logged, counted "
        "(bls_model_load_failures_total) and shown by bls_model_load_failed and /ready's text.",
        "serve/tritonlog.py, LOAD_FAILED",
        "tests/integration/test_hangs.py::test_a_failed_reload_is_counted_while_the_old_copy_serves",
        "Not verified fixed in a later release: run its test on the new Triton before dropping it."),
    Workaround(
        "the failed load that stays live",
        "After a load fails (a reload beside a serving copy included), the failed copy's model object stays live: "
        "once every model is unloaded and tritonserver gets SIGTERM, it logs \"Found 1 live models\" each second "
        "until its exit timeout (20 s), then exits 1.",
        "After a full drain, a tritonserver whose log named a failed load since it started gets LEAKED_GRACE_S after "
        "its SIGTERM, then is killed (nothing is in flight) and bls-serve exits 0, saying so.",
        "serve/stopping.py (terminate), serve/tritonlog.py",
        "tests/integration/test_hangs.py::test_a_failed_reload_is_counted_while_the_old_copy_serves",
        "Not verified fixed in a later release: run its test on the new Triton before dropping it."),
    Workaround(
        "message patterns",
        "Triton hands a BLS caller only the message of a failed child call (its code is lost).",
        "The transport tells a child that cannot take a call (retried) or is overloaded from the words "
        "(UNAVAILABLE, BUSY); the watchdog tells a busy probe (PROBE_BUSY) and a dead stub (DEAD_STUB) the same "
        "way; bls-bench tells a refusal by Triton's queue (QUEUE_FULL, QUEUE_TIMEOUT).",
        "base/messages.py, adapter/transport.py, serve/watchdog.py, tools/loadgen.py",
        "tests/unit/test_watchdog.py::test_dead_stub_model_from_triton_messages",
        "Not verified fixed in a later release: run its test on the new Triton before dropping it."),
)
