"""Faults against a real server: a classifier unloaded mid-traffic, shutdown under load, a
killed python stub, and the stop after one. They break things on purpose, so they run on
servers of their own: one for the unloaded classifier and then the shutdown (which stops it),
one with the watchdog for the killed stubs, and one per stop after a killed stub.

Assertions are on outcomes and on the order of events (a request's send and answer times
against the moment a model was unloaded or loaded), not on how long something took, except
the stop after a killed stub: the issue asks for 5 s at most (tritonserver would wait out
its exit timeout)."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tritonclient.utils import InferenceServerException

from bls_pipeline.serve.client import ClassifyClient
from bls_pipeline.serve.processes import stubs
from bls_pipeline.serve.stopping import StopReport
from bls_pipeline.tools.footprint import measure

pytestmark = pytest.mark.integration
FAILOVER = "classify_bls_failover"  # resnet50_onnx first, efficientnet_lite0_onnx next, no cascade
RECHECK_S = 1.0  # its route_recheck_s (tests/integration/conftest.py)
MAIN, BACKUP = "resnet50_onnx", "efficientnet_lite0_onnx"


@dataclass(frozen=True)
class Record:
    thread: int
    sent: float  # time.monotonic() before the call
    answered: float  # ... after it returned or raised
    route: str | None  # the answer's ROUTE, None when it failed
    error: str | None  # "<status> <message>" of the InferenceServerException


class Traffic:
    """Closed-loop clients, each on its own connection, sending one image per request until
    stopped. Every request is recorded; every thread's end is too (a thread that dies on an
    unexpected exception says which), so none can vanish unnoticed."""

    def __init__(self, url: str, protocol: str, model: str, image: bytes, threads: int = 4):
        self.records: list[Record] = []
        self.sent = [0] * threads
        self.ended: dict[int, str] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(i, url, protocol, model, image), daemon=True)
                         for i in range(threads)]

    def _loop(self, i: int, url: str, protocol: str, model: str, image: bytes) -> None:
        try:
            client = ClassifyClient(url, protocol, model=model)
            try:
                while not self._stop.is_set():
                    self.sent[i] += 1
                    sent = time.monotonic()
                    try:
                        route, error = client.classify([image], topk=1)["ROUTE"][0, 0].decode(), None
                    except InferenceServerException as exc:
                        route, error = None, f"{exc.status()} {exc.message()}"
                    with self._lock:
                        self.records.append(Record(i, sent, time.monotonic(), route, error))
                    if error:
                        time.sleep(0.01)  # a refused client does not spin
            finally:
                client.close()
            self.ended[i] = "stopped"
        except BaseException as exc:  # noqa: BLE001 - recorded: the test fails naming it
            self.ended[i] = f"died: {type(exc).__name__}: {exc}"

    def answers(self, sent_after: float = float("-inf")) -> int:
        with self._lock:
            return sum(1 for r in self.records if r.route is not None and r.sent > sent_after)

    def wait_for(self, n: int, sent_after: float = float("-inf"), timeout: float = 120.0) -> None:
        """Until n answers to requests sent after `sent_after` came back (the machine may be slow)."""
        deadline = time.monotonic() + timeout
        while self.answers(sent_after) < n:
            assert time.monotonic() < deadline, f"fewer than {n} answers in {timeout:.0f}s: {self.outcomes()}"
            assert not self.ended, f"a client thread ended early: {self.ended}"
            time.sleep(0.05)

    def recent_latency(self, last: int = 8) -> float:
        """The median time to an answer of the latest `last` requests answered."""
        with self._lock:
            answered = [r for r in self.records if r.route is not None][-last:]
        took = sorted(r.answered - r.sent for r in answered)
        return took[len(took) // 2]

    def outcomes(self) -> Counter:
        with self._lock:
            return Counter(r.route or r.error for r in self.records)

    def __enter__(self) -> "Traffic":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def assert_every_thread_accounted_for(self) -> None:
        assert not [t.name for t in self._threads if t.is_alive()], "a request never came back"
        assert self.ended == {i: "stopped" for i in range(len(self._threads))}
        per_thread = Counter(r.thread for r in self.records)
        assert [per_thread[i] for i in range(len(self._threads))] == self.sent  # every request sent came back


@pytest.fixture(scope="module")
def faults_server(model_repo, tmp_path_factory, server_factory):
    srv = server_factory(model_repo, tmp_path_factory.mktemp("faults"), models=(FAILOVER, MAIN, BACKUP))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def watched_server(model_repo, tmp_path_factory, server_factory):
    srv = server_factory(model_repo, tmp_path_factory.mktemp("watched"), models=(FAILOVER, MAIN, BACKUP),
                         watchdog_interval_s=1.0, exit_timeout_s=2)
    yield srv
    srv.stop()


def _serving(server):
    """The server, serving (a test that broke it for good fails the next one here)."""
    assert server.running() and all(server.is_model_ready(m) for m in (FAILOVER, MAIN, BACKUP))
    return server


def _wait_for_route(client, image: bytes, route: str, timeout: float = 10.0) -> None:
    """Until 4 answers in a row take `route`: each instance of the flow answers so (an instance
    that rerouted looks again for its preferred model route_recheck_s after its last look)."""
    deadline, streak = time.monotonic() + timeout, 0
    while streak < 4:
        streak = streak + 1 if client.classify([image])["ROUTE"][0, 0] == route.encode() else 0
        assert time.monotonic() < deadline, f"the flow did not come back to {route} within {timeout:.0f} s"
        time.sleep(0.3)


def _wait_until_unloaded(server, model: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while server.admin.states().get(model) in ("READY", "UNLOADING"):
        assert time.monotonic() < deadline, f"{model} still loaded after {timeout:.0f}s"
        time.sleep(0.05)


def _private_mib(server, model: str) -> float:
    """The private memory of the model's one stub (bls-footprint's measure)."""
    (row,) = [r for r in measure(server) if r.process == f"{model}_0_0"]
    return row.private_mib


def test_unloaded_classifier_reroutes_to_its_standby_fallback_then_comes_back(faults_server, sample_images):
    """The fallback is on standby behind resnet50 (bls-serve names it so): it holds no engine
    until resnet50 goes, then opens it and takes every call, and lets go of it again once
    resnet50 is back and no call came for its standby_release_s (conftest: 2 s)."""
    srv = _serving(faults_server)
    assert srv.plan().standby == {BACKUP: f"a fallback behind {MAIN}"}
    with Traffic(srv.http_url, "http", FAILOVER, sample_images["mug"]) as traffic:
        traffic.wait_for(10)
        standby_mib = _private_mib(srv, BACKUP)
        unload_called = time.monotonic()
        srv.unload_model(MAIN)
        _wait_until_unloaded(srv, MAIN)
        unloaded = time.monotonic()
        traffic.wait_for(20, sent_after=unloaded)
        serving_mib = _private_mib(srv, BACKUP)
        load_called = time.monotonic()
        srv.load_model(MAIN)  # returns once it is READY
        loaded = time.monotonic()
        traffic.wait_for(10, sent_after=loaded + RECHECK_S)
        _wait_for(lambda: _private_mib(srv, BACKUP) < standby_mib + 15, f"{BACKUP} releasing its engine", timeout=30)
        released_mib = _private_mib(srv, BACKUP)
    traffic.assert_every_thread_accounted_for()
    assert [r.error for r in traffic.records if r.error] == []  # no good request lost
    before = [r.route for r in traffic.records if r.answered < unload_called]
    during = [r.route for r in traffic.records if r.sent > unloaded and r.answered < load_called]
    after = [r.route for r in traffic.records if r.sent > loaded + RECHECK_S]  # every chooser has looked again
    assert set(before) == {f"{MAIN}:direct"} and len(before) >= 10
    assert set(during) == {f"{BACKUP}:direct"} and len(during) >= 20
    assert set(after) == {f"{MAIN}:direct"} and len(after) >= 10
    # Standby, it held the stub and no engine: efficientnet_lite0's session with its arena is more than 40 MiB.
    assert serving_mib > standby_mib + 40, (standby_mib, serving_mib)
    steady = sorted(r.answered - r.sent for r in traffic.records if r.answered < unload_called)
    first_backup = min((r for r in traffic.records if r.route == f"{BACKUP}:direct"), key=lambda r: r.answered)
    slowest = max(r.answered - r.sent for r in traffic.records
                  if unload_called <= r.answered <= first_backup.answered + 1)
    print(f"\n{BACKUP} private MiB: {standby_mib:.0f} on standby, {serving_mib:.0f} serving, {released_mib:.0f} "
          f"released; takeover: first answer {first_backup.answered - unload_called:.2f} s after the unload began, "
          "slowest request around it "
          f"{slowest:.2f} s (median before: {steady[len(steady) // 2]:.3f} s)")


# ---- shutdown (after the unloaded classifier: it stops their server) ----------------------------

# What a request may get instead of an answer once the stop began. The drain has unloaded
# the flow: Triton refuses on arrival, so a request refused this way was never accepted
# (it may have been sent just before the stop began and arrived just after the unload).
DRAINED = rf"StatusCode\.NOT_FOUND Request for unknown model: '{FAILOVER}' has no available versions"
# After the drain the server closes: the gRPC transport refuses what is sent from then on.
CLOSED = (
    r"StatusCode\.UNAVAILABLE failed to connect to all addresses; .*Connection refused",
    # A graceful close (gRPC words it either way, the second seen once under CI).
    r"StatusCode\.UNAVAILABLE Stream removed \((Socket closed \()?GOAWAY received; Error code: 0; Debug Text: \)\)?",
    # The socket closed while the client was still writing the request: it never arrived
    # (seen 3 times in one run of a fresh clone, two test workers).
    r"StatusCode\.UNAVAILABLE Stream removed \(sendmsg: Broken pipe \(32\)\)",
    r"StatusCode\.CANCELLED CANCELLED",
)


def _heavy_png() -> bytes:
    """A 3200x2400 PNG: its decode keeps classify_bls busy before its child call, so a request
    is often accepted and still waiting for the classifier when the stop begins."""
    y, x = np.mgrid[0:2400, 0:3200].astype(np.float32)
    rgb = np.stack([x / 3200, y / 2400, 0.5 + 0.5 * np.sin(x / 97 + y / 53)], axis=-1)
    buf = io.BytesIO()
    Image.fromarray((rgb * 255).astype(np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def test_shutdown_under_load_answers_what_it_accepted(faults_server):
    srv = _serving(faults_server)
    pid, prefix = srv.pid, srv.shm_prefix
    with Traffic(srv.grpc_url, "grpc", FAILOVER, _heavy_png(), threads=8) as traffic:
        traffic.wait_for(16)
        # wait_for returns just after an answer, and an execute() answers several clients at
        # once: their next requests are still on their way (a 3200x2400 PNG each), and the drain
        # refuses them on arrival. Half a request's time later they are in the flow.
        time.sleep(traffic.recent_latency() / 2)
        stop_began = time.monotonic()
        code = srv.stop()
        stopped = time.monotonic()
        deadline = time.monotonic() + 60
        while not any(r.sent > stopped for r in list(traffic.records)):  # requests go on after the stop
            assert not traffic.ended and time.monotonic() < deadline, f"no request after the stop: {traffic.ended}"
            time.sleep(0.05)
    traffic.assert_every_thread_accounted_for()

    def refused(record: Record, allowed: tuple[str, ...]) -> bool:
        return record.answered > stop_began and any(re.fullmatch(p, record.error) for p in allowed)

    # Triton 2.51 was once seen (1 run in many) not to exit on SIGTERM after every model had
    # been unloaded; the launcher then kills it, which loses nothing only because the drain
    # came first. A request sent after the stop began then meets a server that is killed
    # under it: the gRPC transport says UNAVAILABLE (socket closed, connection reset), a refusal.
    killed = code == -signal.SIGKILL
    closed = (*CLOSED, r"StatusCode\.UNAVAILABLE .*") if killed else CLOSED
    # Every request is answered, or refused as documented: none lost in flight.
    before = [r for r in traffic.records if r.sent < stop_began]
    after = [r for r in traffic.records if r.sent >= stop_began]
    lost = Counter(r.error for r in before if r.error and not refused(r, (DRAINED,)))
    lost += Counter(r.error for r in after if r.error and not refused(r, (DRAINED, *closed)))
    assert not lost, f"requests neither answered nor refused as documented: {lost}"
    # The test saw the drain at work: requests in flight when the stop began were answered,
    # and later ones were refused by the drained model.
    in_flight = [r for r in before if r.answered > stop_began and r.route is not None]
    assert in_flight, "no request was in flight when the stop began: the test saw nothing drain"
    by_the_drain = [r for r in after if r.error and re.fullmatch(DRAINED, r.error)]
    assert by_the_drain, f"none refused by the drain: {traffic.outcomes()}"
    print(f"\n{len(in_flight)} requests in flight at the stop answered; sent before it and refused on arrival: "
          f"{sum(1 for r in before if r.error)}; sent after it: {Counter((r.error or r.route)[:60] for r in after)}; "
          f"stop took {stopped - stop_began:.1f} s")

    if code != 0:  # killed after the drain (above): its thread stacks are in the server log
        assert killed, f"tritonserver exit code {code}, {srv.last_stop}"
        warnings.warn(f"tritonserver had to be killed after a clean drain; see {srv.options.log_file}")
    assert srv.last_stop.drained

    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    assert not [p for p in Path("/dev/shm").iterdir() if p.name.startswith(prefix)]


# ---- killed stubs --------------------------------------------------------------------------------

def _standby_openings(server) -> int:
    """How often the standby fallback opened its engine (engines/standby.py logs each)."""
    return Path(server.options.log_file).read_text(errors="replace").count(f"{BACKUP} takes calls: its engine opened")


def _stub_pid(server, instance: str) -> int:
    out = subprocess.run(["pgrep", "-a", "-g", str(server.pid)], capture_output=True, text=True).stdout
    pids = [int(line.split()[0]) for line in out.splitlines() if "triton_python_backend_stub" in line
            and f" {instance} " in line]
    assert len(pids) == 1, out
    return pids[0]


@pytest.mark.parametrize("victim", [MAIN, FAILOVER])
def test_killed_stub_is_detected_and_reloaded(watched_server, sample_images, victim):
    """Triton 2.51 keeps a model with a dead stub READY; the watchdog notices (the stub is a
    zombie in the server's process group, whether the model has one instance or two) and
    reloads it, and resnet50 answers through the flow again within 10 s."""
    srv = _serving(watched_server)
    client = ClassifyClient(srv.http_url, "http", model=FAILOVER)
    try:
        # both instances back on resnet50 (an earlier kill)
        _wait_for_route(client, sample_images["mug"], f"{MAIN}:direct")
        recoveries = len(srv.watchdog.recoveries)
        if victim == MAIN:  # the standby fallback takes over: the watchdog's probes did not open it before
            opened = _standby_openings(srv)
            rounds = srv.watchdog.rounds
            _wait_for(lambda: srv.watchdog.rounds >= rounds + 2, "two rounds of probes")
            assert _standby_openings(srv) == opened
        os.kill(_stub_pid(srv, f"{victim}_0_0"), signal.SIGKILL)
        killed = time.monotonic()
        assert srv.is_model_ready(victim)  # what Triton claims: still READY
        errors = Counter()
        while True:
            try:
                route = client.classify([sample_images["mug"]])["ROUTE"][0, 0].decode()
            except InferenceServerException as exc:
                errors[exc.message()] += 1
                route = None
            if route == f"{MAIN}:direct" and len(srv.watchdog.recoveries) > recoveries:
                break
            assert time.monotonic() - killed < 10, f"not back within 10 s: {srv.watchdog.recoveries}, {errors}"
            time.sleep(0.2)
    finally:
        client.close()
    (event,) = srv.watchdog.recoveries[recoveries:]
    if victim == MAIN:
        assert not errors and _standby_openings(srv) > opened  # the fallback opened and answered meanwhile
    assert event.model == victim and event.recovered_at is not None and event.detected_at > killed
    for message in errors:  # while dead: the stub's error; while reloading: another classifier or none ready
        assert "is not healthy" in message or "no classifier is ready" in message, message
    print(f"stub of {victim} killed: reloaded after {event.recovered_at - killed:.1f} s, errors meanwhile: "
          f"{dict(errors)}")


# ---- the stop after a killed stub ---------------------------------------------------------------

STOP_S = 5.0  # the stop's bound once nothing is in flight (issue 25)


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _nothing_left(pgid: int, shm_prefix: str) -> None:
    """No process of tritonserver's group (the server, a stub, a zombie) and no /dev/shm region.
    A stub killed with the server is init's to reap here (bls-serve reaps its own at once)."""
    _wait_for(lambda: not _group_exists(pgid), f"processes of group {pgid} still there", timeout=30)
    assert not [p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(shm_prefix)]


def _wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.05)


def _reloaded(srv, after: int = 0) -> bool:
    return len(srv.watchdog.recoveries) > after and srv.watchdog.recoveries[-1].recovered_at is not None


def test_an_idle_child_stub_killed_leaves_no_stuck_copy_and_the_stop_is_clean(model_repo, tmp_path, server_factory):
    """The watchdog finds the dead stub from the processes (a zombie) and reloads its model
    before any request or probe reaches it, so the old copy unloads (its zombie is reaped),
    and the stop is clean: tritonserver exits 0, nothing is left."""
    srv = server_factory(model_repo, tmp_path, models=(FAILOVER, MAIN, BACKUP), watchdog_interval_s=1.0)
    pid, prefix = srv.pid, srv.shm_prefix
    try:
        # Idle: no client, and no probe in the stub either (the watchdog's next round starts
        # 1 s after the end of this one, with a look at the processes).
        rounds = srv.watchdog.rounds
        _wait_for(lambda: srv.watchdog.rounds > rounds, "no watchdog round ended")
        os.kill(_stub_pid(srv, f"{MAIN}_0_0"), signal.SIGKILL)
        killed = time.monotonic()
        _wait_for(lambda: _reloaded(srv), "the watchdog did not reload the model")
        (event,) = srv.watchdog.recoveries
        assert event.model == MAIN and event.detected_at > killed
        _wait_for(lambda: not stubs(pid).dead, "the old copy kept its dead stub: a request reached it", timeout=30)
        client = ClassifyClient(srv.http_url, "http", model=FAILOVER)
        try:
            assert client.classify([_tiny_image()])["ROUTE"][0, 0].decode() in (f"{MAIN}:direct", f"{BACKUP}:direct")
        finally:
            client.close()
    finally:
        began = time.monotonic()
        srv.stop()
        took = time.monotonic() - began
    print(f"\nidle stub killed: found after {event.detected_at - killed:.1f} s, reloaded after "
          f"{event.recovered_at - killed:.1f} s; stop took {took:.1f} s, {srv.last_stop}")
    assert srv.last_stop == StopReport(code=0, drained=True, stuck=())
    assert took <= STOP_S
    _nothing_left(pid, prefix)


def test_a_copy_left_stuck_by_a_dead_stub_does_not_hold_up_the_stop(model_repo, tmp_path, server_factory, caplog):
    """On Triton 2.51 a model copy that got a request after its python stub died never
    finishes unloading: after the watchdog's reload, tritonserver would wait out its whole
    exit timeout on it at stop and exit 1. After a full drain nothing is in flight, so the
    launcher kills it at once and says why, naming the dead stub."""
    import tritonclient.http as th

    srv = server_factory(model_repo, tmp_path, models=(MAIN,), watchdog_interval_s=1.0, exit_timeout_s=20)
    pid, prefix = srv.pid, srv.shm_prefix
    try:
        os.kill(_stub_pid(srv, f"{MAIN}_0_0"), signal.SIGKILL)
        client = th.InferenceServerClient(srv.http_url)
        pixels = th.InferInput("input", [1, 3, 224, 224], "FP32")
        pixels.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))
        with pytest.raises(InferenceServerException, match="is not healthy"):
            client.infer(MAIN, [pixels])  # the request that leaves the old copy stuck
        client.close()
        _wait_for(lambda: _reloaded(srv), "the watchdog did not reload the model", timeout=30)
        assert len(stubs(pid).dead) == 1  # the old copy's, stuck
    finally:
        began = time.monotonic()
        srv.stop()
        took = time.monotonic() - began
    print(f"\nstop with a copy left stuck by a dead stub: {took:.1f} s, {srv.last_stop}")
    assert srv.last_stop == StopReport(code=-signal.SIGKILL, drained=True, stuck=(f"{MAIN}_0_0",))
    assert took <= STOP_S, f"the stop took {took:.1f} s: it waited out the exit timeout (20 s)"
    (warning,) = [r.getMessage() for r in caplog.records if "cannot exit cleanly" in r.getMessage()]
    assert f"dead python stub(s) {MAIN}_0_0 got requests after the stub died" in warning
    _nothing_left(pid, prefix)


def _tiny_image() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 120, 40)).save(buf, "JPEG")
    return buf.getvalue()
