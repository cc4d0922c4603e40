"""bls-serve as a real process against a tritonserver that hangs, a stub that hangs, a stop
that meets either, a reload that fails while the old copy serves, and a bls-serve killed
outright (issue 47: "a server that cannot hang unseen").

The tests that assert a time (a recovery, a stop) are marked `timing`: they run apart from the
parallel suite (pytest -m timing), on a quiet machine; each prints what it measured (-s)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import time

import pytest

from bls_pipeline.base.modelconfig import RELOAD_KEY
from bls_pipeline.serve.client import ClassifyClient
from bls_pipeline.serve.processes import stubs
from bls_pipeline.serve.options import ServerOptions, free_port
from bls_pipeline.serve.server import TritonServer
from test_crash_recovery import SERVING, BlsServe, _shm_regions
from test_faults import FAILOVER, MAIN, Traffic, _group_exists

from polling import eventually, get

pytestmark = pytest.mark.integration

# bls-serve's exit codes (server.ExitCode), as an orchestrator reads them
OK, HUNG = 0, 3
RECOVERY_S = 30.0  # the targets: classify_bls answers again within 30 s of a freeze
STOP_S = 30.0  # SIGTERM to exit, whatever tritonserver does
CLEAN_STOP_S = 10.0  # ... after a stub was frozen and replaced


def _status(bls: BlsServe, path: str) -> tuple[int, str]:
    return get(f"http://{bls.url('status')}{path}")


def _restarts(bls: BlsServe) -> dict[str, float]:
    text = _status(bls, "/metrics")[1]
    return {m[1]: float(m[2])
            for m in re.finditer(r'^bls_tritonserver_restarts_total\{cause="(\w+)"\} (\S+)$', text, re.M)}


def _answers_after(bls: BlsServe, image: bytes, since: float, timeout_s: float) -> float:
    """Seconds from `since` to the first classify_bls answer over gRPC to a request sent now or later."""
    deadline = time.monotonic() + timeout_s
    while True:
        client = ClassifyClient(bls.url("grpc"), "grpc")
        try:
            client.classify([image])
            return time.monotonic() - since
        except Exception:  # noqa: BLE001 - not serving yet: asked again
            assert (time.monotonic() < deadline), (f"classify_bls not answering {timeout_s:.0f} s "
                                                   f"on:\n{bls.output()[-3000:]}")
            time.sleep(0.2)
        finally:
            client.close()


@pytest.mark.timing
def test_a_frozen_tritonserver_is_replaced_and_classify_bls_answers_again(model_repo, sample_images):
    """SIGSTOP to tritonserver under load: alive, its sockets open, answering nothing. bls-serve's
    liveness checks see it, the status port says why at once (never waiting on it), bls-serve
    kills it with its stubs and starts it again (cause hung), and classify_bls answers again
    within 30 s. No client waits longer than the hang timeout and the restart."""
    mug = sample_images["mug"]
    with BlsServe(model_repo, "--models", "classify_bls", "--watchdog-interval", "1") as bls:
        bls.wait_for_line(SERVING)
        first = bls.tritonserver()
        with Traffic(bls.url("grpc"), "grpc", "classify_bls", mug, threads=2) as traffic:
            traffic.wait_for(4)
            os.kill(first, signal.SIGSTOP)
            frozen = time.monotonic()
            code, why = eventually(lambda: (lambda r: r if r[0] == 503 and "not answering" in r[1]
                                            or "did not answer" in r[1]
                                            else None)(_status(bls, "/ready")), "the status port saying why",
                                   timeout_s=30)
            said = time.monotonic() - frozen
            took = _answers_after(bls, mug, frozen, RECOVERY_S + 30)
            traffic.wait_for(4, sent_after=frozen + took)
        second = bls.tritonserver()
        assert second != first and not _group_exists(first)  # killed with its stubs
        assert _restarts(bls) == {"crashed": 0, "exited": 0, "hung": 1, "start_failed": 0}  # every cause, from 0
        assert re.search(r"tritonserver did not answer \(no answer over (HTTP|gRPC) for \d+\.\d s", bls.output())
        worst = max(r.answered - r.sent for r in traffic.records)
        stop_took, exit_code = bls.sigterm()
    traffic.assert_every_thread_accounted_for()
    print(f"\ntritonserver frozen under 2 gRPC clients: /ready said why after {said:.1f} s ({why.strip()[:120]}); "
          f"classify_bls answered again after {took:.1f} s; the longest client wait {worst:.1f} s; "
          f"then SIGTERM to exit {stop_took:.1f} s, exit code {exit_code}")
    assert took <= RECOVERY_S, f"classify_bls answered again only {took:.1f} s after the freeze"
    assert exit_code == OK and not _group_exists(second) and not _shm_regions(bls.shm_prefix)


@pytest.mark.timing
def test_sigterm_with_tritonserver_frozen_exits_within_30_s_naming_the_cause(model_repo, sample_images):
    with BlsServe(model_repo, "--models", "classify_bls") as bls:
        bls.wait_for_line(SERVING)
        triton = bls.tritonserver()
        os.kill(triton, signal.SIGSTOP)
        took, code = bls.sigterm()
    out = bls.output()
    print(f"\nSIGTERM with tritonserver frozen: exit after {took:.1f} s, exit code {code}")
    assert code == HUNG, out[-3000:]
    assert (re.search(r"tritonserver did not answer at the stop \(.*\): it was killed with its group .* bls-serve "
                      r"exits 3", out))
    assert took <= STOP_S, f"SIGTERM to exit took {took:.1f} s"
    assert not _group_exists(triton) and not _shm_regions(bls.shm_prefix)


@pytest.mark.timing
def test_tritonserver_killed_mid_drain_ends_the_stop_at_once_naming_it(model_repo, sample_images):
    """SIGTERM under load, then tritonserver killed while bls-serve drains it."""
    with BlsServe(model_repo, "--models", "classify_bls") as bls:
        bls.wait_for_line(SERVING)
        triton = bls.tritonserver()
        with Traffic(bls.url("grpc"), "grpc", "classify_bls", sample_images["mug"], threads=4) as traffic:
            traffic.wait_for(4)
            began = time.monotonic()
            bls.proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)  # the drain has begun: classify_bls is being unloaded
            os.kill(triton, signal.SIGKILL)
            code = bls.proc.wait(timeout=120)
            took = time.monotonic() - began
    out = bls.output()
    print(f"\ntritonserver killed mid-drain: SIGTERM to exit {took:.1f} s, exit code {code}")
    assert code != OK and took <= STOP_S, out[-3000:]
    assert re.search(r"tritonserver exited with code -9 while draining|tritonserver stopped without a full drain", out)
    assert not _group_exists(triton) and not _shm_regions(bls.shm_prefix)


@pytest.mark.timing
def test_a_frozen_stub_is_replaced_and_the_stop_then_takes_seconds(model_repo, sample_images):
    """resnet50's stub frozen (SIGSTOP) under load: Triton finds it unhealthy, the watchdog loads
    a fresh copy and kills the frozen stub, clients of the failover flow keep getting answers,
    and SIGTERM then stops bls-serve within 10 s with exit code 0 (the old copy no longer holds
    tritonserver's exit for its exit timeout)."""
    with BlsServe(model_repo, "--models", FAILOVER, "--watchdog-interval", "1") as bls:
        bls.wait_for_line(SERVING)
        triton = bls.tritonserver()
        with Traffic(bls.url("grpc"), "grpc", FAILOVER, sample_images["mug"], threads=4) as traffic:
            traffic.wait_for(4)
            victim = bls.stub(f"{MAIN}_0_0")
            os.kill(victim, signal.SIGSTOP)
            frozen = time.monotonic()
            bls.wait_for_line(rf"WATCHDOG: model '{MAIN}' reloaded, serving again", timeout=60)
            replaced = time.monotonic() - frozen
            bls.wait_for_line(rf"WATCHDOG: killed the unhealthy python stub of {MAIN}_0_0 \(pid {victim}, state T\)",
                              timeout=10)
            traffic.wait_for(4, sent_after=time.monotonic())
        took, code = bls.sigterm()
    traffic.assert_every_thread_accounted_for()
    print(f"\nresnet50's stub frozen under 4 gRPC clients: replaced after {replaced:.1f} s; "
          f"{len(traffic.records)} requests, outcomes {dict(traffic.outcomes())}; SIGTERM to exit {took:.1f} s, exit "
          f"code {code}")
    assert code == OK, bls.output()[-3000:]
    assert took <= CLEAN_STOP_S, f"SIGTERM to exit took {took:.1f} s:\n{bls.output()[-3000:]}"
    assert not _group_exists(triton) and not _shm_regions(bls.shm_prefix)


def test_a_killed_bls_serve_takes_tritonserver_along_and_the_next_leaves_no_orphan(model_repo):
    """SIGKILL to bls-serve: its tritonserver gets SIGKILL too (PR_SET_PDEATHSIG), the stubs end
    once they see their parent gone, and the next bls-serve on the repository removes what they
    left (their shared memory) and ends any stub still there."""
    with BlsServe(model_repo, "--models", "classify_bls") as first:
        first.wait_for_line(SERVING)
        triton = first.tritonserver()
        stub_pids = set(stubs(triton).live)
        assert stub_pids and _shm_regions(first.shm_prefix)
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(timeout=30)
        eventually(lambda: not _group_exists(triton), "tritonserver and its stubs gone after bls-serve was killed",
                   timeout_s=30)
        left = _shm_regions(first.shm_prefix)  # the stubs leave their regions to their parent, killed
        with BlsServe(model_repo, "--models", "classify_bls") as second:
            second.wait_for_line(SERVING)
            assert not _shm_regions(first.shm_prefix)
            second.proc.send_signal(signal.SIGTERM)
            assert second.proc.wait(timeout=60) == OK
    print(f"\nbls-serve killed: its tritonserver and {len(stub_pids)} stubs went with it; {len(left)} region(s) left "
          f"behind, removed by the next bls-serve")


def test_a_failed_reload_is_counted_while_the_old_copy_serves(model_repo, tmp_path, caplog):
    """A reload of resnet50_onnx with a model file that does not read: Triton answers 400 and
    keeps the old copy READY, its index shows no reason. bls-serve reads Triton's log: the
    failure is logged, counted, and shown by bls_model_load_failed and /ready's text, with
    /ready still 200 (the old copy serves); a reload that works clears it. The stop after it
    does not wait out the exit timeout on the failed copy Triton keeps live."""
    repo = tmp_path / "models"
    shutil.copytree(model_repo / MAIN, repo / MAIN, ignore=shutil.ignore_patterns("__pycache__"))
    server = TritonServer(ServerOptions.on_free_ports(repo, tmp_path / "tritonserver.log", models=(MAIN,),
                                                      status_port=free_port(), fail_fast=False))
    server.start()
    metrics = f"{server.status_url}/metrics"
    try:
        assert re.search(rf'^bls_model_load_failures_total\{{model="{MAIN}"\}} 0$', get(metrics)[1], re.M)
        model_file = repo / MAIN / "1" / "model.onnx"
        good = model_file.read_bytes()
        model_file.write_bytes(b"not an onnx file")
        config = server.admin.config(MAIN)
        config.setdefault("parameters", {})[RELOAD_KEY] = {"string_value": "7"}
        with pytest.raises(Exception, match="400|failed"):
            server.admin.load(MAIN, config)
        assert server.admin.states()[MAIN] == "READY"  # Triton keeps the old copy, and says nothing of it
        text = eventually(lambda: (lambda t: t
                                   if re.search(rf'^bls_model_load_failures_total\{{model="{MAIN}"\}} 1$', t, re.M)
                                   else None)(get(metrics)[1]), "the failed reload counted")
        assert re.search(rf'^bls_model_load_failed\{{model="{MAIN}"\}} 1$', text, re.M)
        code, ready = get(f"{server.status_url}/ready")
        assert code == 200 and f"{MAIN} (its last load failed, its serving copy answers" in ready
        assert f"{MAIN}: a load failed (Triton's log: version 1:" in caplog.text
        assert "Triton keeps its serving copy READY" in caplog.text
        model_file.write_bytes(good)
        config["parameters"][RELOAD_KEY] = {"string_value": "8"}
        server.admin.load(MAIN, config)
        eventually(lambda: re.search(rf'^bls_model_load_failed\{{model="{MAIN}"\}} 0$', get(metrics)[1], re.M),
                   "the gauge cleared by a reload that works")
    finally:
        began = time.monotonic()
        server.stop()
        took = time.monotonic() - began
    print(f"\nstop after a failed reload, then a good one: {took:.1f} s, {server.last_stop}")
    # Triton 2.51 keeps the failed copy's model object live and would wait out its exit timeout
    # (20 s, exit 1) for it: after the full drain it is killed for it (workarounds.py).
    assert server.last_stop.drained and server.last_stop.held == (MAIN,)
