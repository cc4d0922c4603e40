"""Zero lost requests under load, on a server of their own (docs/reliability.md): a killed
classifier stub, a killed classify_bls instance stub, a version rollout forward and back, and
overload. Each test prints its counts (run with -s): requests sent, answered, failed by
reason, and the longest request latency.

The flow here calls efficientnet_lite0_onnx alone, through Triton (no cascade, no flip pass,
no other candidate, nothing run in process), so a lost classifier can only be waited for,
never routed around. The faults are the runtime's, not the model's: the cheaper of the two
classifiers (about a seventh of resnet50's CPU an image) keeps the closed-loop load from
taking both cores for longer than each test needs. Assertions are on outcomes and on
the order of events, never on how long something took (the longest latency is printed, and
bounded only where the issue asks: overload)."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from PIL import Image
from tritonclient.utils import InferenceServerException

from bls_pipeline.base.modelconfig import ModelConfig, config_variant
from bls_pipeline.serve.client import ClassifyClient
from bls_pipeline.serve.rollout import main as rollout_main
from bls_pipeline.serve.rollout import roll
from bls_pipeline.tools.footprint import measure
from test_faults import Record, Traffic, _stub_pid

pytestmark = pytest.mark.integration
FLOW, MAIN = "classify_bls_reliable", "efficientnet_lite0_onnx"
RECHECK_S = 1.0  # the flow's route_recheck_s: it looks again for a newer version this often


def flow_on_main_alone(model_repo: Path, repo: Path, copy_function=shutil.copy2) -> Path:
    """A repository of MAIN (version 1 only, as in model_repo) and FLOW, classify_bls on MAIN
    alone through Triton, looking again for a newer version every RECHECK_S. MAIN's memory
    arena is off, as resnet50_onnx's is: the memory the overload test bounds is what queued
    requests hold, not the high-water mark an arena keeps from the largest batch."""
    shutil.copytree(model_repo / MAIN, repo / MAIN, copy_function=copy_function)
    main_config = config_variant(repo / MAIN, MAIN, {"memory_arena": "0"})
    (repo / MAIN / "config.pbtxt").unlink()  # maybe a link to model_repo's: written anew, not through it
    (repo / MAIN / "config.pbtxt").write_text(main_config)
    shutil.copytree(model_repo / "classify_bls", repo / FLOW)
    config = text_format.Parse(config_variant(repo / FLOW, FLOW, {
        "cascade_classifiers": "none", "classifiers": MAIN, "tta_threshold": "0", "route_recheck_s": str(RECHECK_S),
        "run_in_process": "none"}),
        ModelConfig())
    (repo / FLOW / "config.pbtxt").write_text(text_format.MessageToString(config))
    return repo


@pytest.fixture(scope="module")
def reliable_repo(model_repo, tmp_path_factory) -> Path:
    """MAIN (version 1 only, for now: the rollout adds 2) and a flow on it alone."""
    # the ONNX files linked, not copied
    return flow_on_main_alone(model_repo, tmp_path_factory.mktemp("reliable") / "models", copy_function=os.link)


@pytest.fixture(scope="module")
def reliable_server(reliable_repo, tmp_path_factory, server_factory):
    srv = server_factory(reliable_repo, tmp_path_factory.mktemp("reliable-logs"), models=(FLOW, MAIN),
                         watchdog_interval_s=1.0, exit_timeout_s=5)
    yield srv
    srv.stop()


class Load:
    """Closed-loop clients over HTTP and gRPC together (test_faults.Traffic each)."""

    def __init__(self, server, image: bytes, threads_per_protocol: int = 2):
        self.traffic = [Traffic(server.url(p), p, FLOW, image, threads=threads_per_protocol) for p in ("http", "grpc")]

    def __enter__(self) -> "Load":
        for t in self.traffic:
            t.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for t in self.traffic:
            t.__exit__(*exc)

    @property
    def records(self) -> list[Record]:
        return [r for t in self.traffic for r in list(t.records)]

    def wait_for(self, n: int, sent_after: float = float("-inf"), timeout: float = 120.0) -> None:
        for t in self.traffic:  # each protocol gets its answers
            t.wait_for(n, sent_after, timeout)

    def summary(self, fault: str) -> dict:
        for t in self.traffic:
            t.assert_every_thread_accounted_for()
        return counts(fault, self.records)


def counts(fault: str, records: list[Record]) -> dict:
    """What the closing note reports for one fault; printed."""
    failed = Counter(re.sub(r"'[^']*_\d+_\d+'", "'<instance>'", r.error) for r in records if r.error)
    out = {"sent": len(records), "answered": sum(1 for r in records if r.route is not None),
           "failed": dict(failed), "longest_s": round(max((r.answered - r.sent for r in records), default=0.0), 2)}
    print(f"\n[{fault}] sent {out['sent']}, answered {out['answered']}, failed {sum(failed.values())} "
          f"{dict(failed) or ''}, longest latency {out['longest_s']} s")
    return out


def _wait_for_recovery(server, model: str, after: int, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while len(server.watchdog.recoveries) <= after:
        assert time.monotonic() < deadline, f"the watchdog did not reload {model} within {timeout:.0f} s"
        time.sleep(0.1)
    event = server.watchdog.recoveries[after]
    assert event.model == model and event.recovered_at is not None, event
    return event


def test_a_killed_classifier_stub_loses_no_request(reliable_server, sample_images):
    srv = reliable_server
    with Load(srv, sample_images["mug"]) as load:
        load.wait_for(4)
        recoveries = len(srv.watchdog.recoveries)
        os.kill(_stub_pid(srv, f"{MAIN}_0_0"), signal.SIGKILL)
        killed = time.monotonic()
        event = _wait_for_recovery(srv, MAIN, recoveries)
        load.wait_for(4, sent_after=event.recovered_at)
    summary = load.summary("classifier stub killed")
    assert summary["failed"] == {}
    # The retry was at work: requests sent before the watchdog found the dead stub were held
    # through the reload and answered after it.
    held = [r for r in load.records if r.sent < event.detected_at and r.answered > event.recovered_at]
    assert killed < event.detected_at and held and all(r.route == f"{MAIN}:direct" for r in held), load.records


def test_a_killed_flow_instance_fails_only_what_reached_it_before_the_reload(reliable_server, sample_images):
    srv = reliable_server
    victim = f"{FLOW}_0_0"
    kills, events = [], []
    with Load(srv, sample_images["mug"]) as load:
        load.wait_for(4)
        for _ in range(2):  # the second time, the flow serves the config the first reload loaded
            recoveries = len(srv.watchdog.recoveries)
            os.kill(_stub_pid(srv, victim), signal.SIGKILL)
            kills.append(time.monotonic())
            events.append(_wait_for_recovery(srv, FLOW, recoveries))
            load.wait_for(4, sent_after=events[-1].recovered_at)
    summary = load.summary("classify_bls instance stub killed, twice")
    # What fails (docs/reliability.md): the requests the dead instance held, and those Triton
    # gave it until the fresh copy the watchdog loads beside the serving one was swapped in
    # (the reload's end). Nothing is refused: the model serves throughout the reload.
    dead = rf"Stub process '{victim}' is not healthy"
    failed = [r for r in load.records if r.error]
    for r in failed:
        assert re.search(dead, r.error), r.error
        assert any(killed < r.answered and r.sent < e.recovered_at for killed, e in zip(kills, events)), (r, events)
    for killed, e in zip(kills, events):
        assert ([r for r in failed if killed < r.answered
                 and r.sent < e.recovered_at]), "no request reached the dead instance"
        # The other instance kept answering while the dead one was found and reloaded. (Not
        # "sent and answered within the reload": on a busy 2-core machine the fresh copy's load
        # slows every answer past its 1.5 s, and CI once saw none fit.)
        assert [r for r in load.records if killed < r.answered < e.recovered_at and r.route], \
            "nothing was answered between the kill and the end of the reload"
    assert summary["answered"] > 0 and not [r for r in load.records if r.sent > events[-1].recovered_at and r.error]


def test_a_rollout_forward_and_back_under_load_loses_no_request(reliable_server, reliable_repo, sample_images):
    srv = reliable_server
    v1, v2 = f"{MAIN}:direct", f"{MAIN}@2:direct"
    # the new version's folder
    shutil.copytree(reliable_repo / MAIN / "1", reliable_repo / MAIN / "2", copy_function=os.link)
    key = srv.options.admin_key
    with Load(srv, sample_images["mug"]) as load:
        load.wait_for(4)
        forward = roll(srv.http_url, key, MAIN, 2, say=print)
        load.wait_for(4, sent_after=forward[-1].done + RECHECK_S)
        back = roll(srv.http_url, key, MAIN, 1, say=print)
        load.wait_for(4, sent_after=back[-1].done + RECHECK_S)
    summary = load.summary("rollout 1 -> 2 -> 1")
    assert summary["failed"] == {}
    assert [s.versions for s in forward + back] == [(1, 2), (2,), (1, 2), (1,)]
    records = load.records
    assert {r.route for r in records} == {v1, v2}  # every answer names its one version
    # Version 2 answers only once its load was asked for and, after the rollback, only what
    # was sent before version 1 alone served again; version 1 answers nothing sent after its
    # retirement, until the rollback loaded it again.
    answered_by_2 = [r for r in records if r.route == v2]
    assert min(r.answered for r in answered_by_2) > forward[0].started
    assert not [r for r in answered_by_2 if r.sent > back[-1].done]
    assert not [r for r in records if r.route == v1 and forward[-1].done < r.sent and r.answered < back[0].started]
    assert {r.route for r in records if r.sent > back[-1].done + RECHECK_S} == {v1}


def test_the_rollout_command_says_what_to_fix(reliable_server, capsys):
    srv = reliable_server
    code = rollout_main(["no_such_model", "2", "--url", srv.http_url, "--admin-key", srv.options.admin_key])
    assert code == 2
    assert "bls-rollout: error: model no_such_model has no READY version" in capsys.readouterr().err
    assert rollout_main([MAIN, "2", "--url", srv.http_url, "--admin-key", "wrong"]) == 2
    assert "HTTP 403: This API is restricted, expecting header 'triton-admin-key'" in capsys.readouterr().err


def _tiny_jpeg() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((64, 64, 3), 128, np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


# Triton's refusals under its queue policy (models/classify_bls/config.pbtxt): the overload errors,
# full or timed out.
OVERLOADED = (r"Exceeds maximum queue size", r"Request timeout expired")
OVERLOAD_CLIENTS, OVERLOAD_S = 256, 10.0
# No request may take longer than this: the queue timeout (15 s), one execute() of a full batch
# on this 2-core machine, and the client's own overhead with 256 threads, with a wide margin.
HANG_BOUND_S = 60.0


@pytest.mark.timing
def test_overload_answers_or_refuses_each_request_fast_and_memory_stays_bounded(reliable_server):
    srv = reliable_server
    before = sum(f.private_mib for f in measure(srv))
    image, records, lock, stop = _tiny_jpeg(), [], threading.Lock(), threading.Event()
    ended: dict[int, str] = {}

    def client(i: int) -> None:
        try:
            c = ClassifyClient(srv.url("http" if i % 2 else "grpc"), "http" if i % 2 else "grpc", model=FLOW)
            try:
                while not stop.is_set():
                    sent = time.monotonic()
                    try:
                        route, error = c.classify([image], topk=1)["ROUTE"][0, 0].decode(), None
                    except InferenceServerException as exc:
                        route, error = None, f"{exc.status()} {exc.message()}"
                    with lock:
                        records.append(Record(i, sent, time.monotonic(), route, error))
                    if error:
                        time.sleep(0.01)  # a refused client does not spin
            finally:
                c.close()
            ended[i] = "stopped"
        except BaseException as exc:  # noqa: BLE001 - the test fails naming it
            ended[i] = f"died: {type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(OVERLOAD_CLIENTS)]
    for t in threads:
        t.start()
    time.sleep(OVERLOAD_S)
    during = sum(f.private_mib for f in measure(srv))
    stop.set()
    for t in threads:
        t.join(timeout=HANG_BOUND_S + 30)
    assert not [t for t in threads if t.is_alive()], "a request never came back"
    assert ended == {i: "stopped" for i in range(OVERLOAD_CLIENTS)}
    summary = counts(f"overload, {OVERLOAD_CLIENTS} clients", records)
    print(f"private memory of the server's processes: {before:.0f} MiB idle, {during:.0f} MiB under overload")
    unexpected = {e: n for e, n in summary["failed"].items() if not any(re.search(p, e) for p in OVERLOADED)}
    assert not unexpected, f"failed other than overloaded: {unexpected}"
    # Overloaded is temporary: the one retryable code, over either protocol (docs/reliability.md).
    assert {e.split()[0] for e in summary["failed"]} <= {"503", "StatusCode.UNAVAILABLE"}, summary["failed"]
    assert summary["answered"] > 0 and summary["failed"], "the server was not overloaded: raise OVERLOAD_CLIENTS"
    assert summary["longest_s"] < HANG_BOUND_S
    assert during < before + 512  # queued requests are bounded, so is what they hold
