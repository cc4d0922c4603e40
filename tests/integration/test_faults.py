"""Faults against a real server: a classifier unloaded mid-traffic, a killed python stub,
shutdown under load. Each test starts its own server (they break things on purpose)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from bls_pipeline.serve.client import ClassifyClient

pytestmark = pytest.mark.integration
FAILOVER = "classify_bls_failover"  # resnet50_onnx first, efficientnet_lite0_onnx next, no cascade
RESNET_ALONE = {"efficientnet_lite0_onnx": "these tests serve resnet50 alone"}


class Traffic:
    """Closed-loop clients sending one good image per request until stopped."""

    def __init__(self, url: str, protocol: str, model: str, image: bytes, threads: int = 4):
        self.routes: list[tuple[float, str]] = []
        self.errors: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(url, protocol, model, image), daemon=True) for _ in range(threads)]

    def _loop(self, url, protocol, model, image):
        client = ClassifyClient(url, protocol, model=model)
        while not self._stop.is_set():
            try:
                route = client.classify([image], topk=1)["ROUTE"][0, 0].decode()
                with self._lock:
                    self.sent += 1
                    self.routes.append((time.monotonic(), route))
            except InferenceServerException as exc:
                with self._lock:
                    self.sent += 1
                    self.errors.append(exc.message())
        client.close()

    def wait_for(self, n: int, since: float, timeout: float = 60.0) -> None:
        """Block until n answers arrived after `since` (the machine may be slow)."""
        deadline = time.monotonic() + timeout
        while sum(1 for t, _ in list(self.routes) if t > since) < n:
            assert time.monotonic() < deadline, f"fewer than {n} answers in {timeout:.0f}s"
            time.sleep(0.1)

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self._threads), "a request never came back"


def _stub_pid(server, instance: str) -> int:
    out = subprocess.run(["pgrep", "-a", "-g", str(server.pid)], capture_output=True, text=True).stdout
    pids = [int(line.split()[0]) for line in out.splitlines() if "triton_python_backend_stub" in line and f" {instance} " in line]
    assert len(pids) == 1, out
    return pids[0]


def test_unloaded_classifier_reroutes_then_comes_back(model_repo, tmp_path, server_factory, sample_images):
    srv = server_factory(model_repo, tmp_path, models=(FAILOVER, "resnet50_onnx", "efficientnet_lite0_onnx"))
    try:
        with Traffic(srv.http_url, "http", FAILOVER, sample_images["mug"]) as traffic:
            traffic.wait_for(10, since=0)
            unloaded_at = time.monotonic()
            srv.unload_model("resnet50_onnx")
            traffic.wait_for(20, since=unloaded_at + 1)
            srv.load_model("resnet50_onnx")
            reloaded_at = time.monotonic()
            time.sleep(1.5)  # > route_recheck_s (1 s in the test variant)
            traffic.wait_for(10, since=reloaded_at + 1.5)
        assert traffic.errors == []  # no good request lost
        before = Counter(r for t, r in traffic.routes if t < unloaded_at)
        during = Counter(r for t, r in traffic.routes if unloaded_at + 1 < t < reloaded_at)
        after = Counter(r for t, r in traffic.routes if t > reloaded_at + 1.5)
        assert set(before) == {"resnet50_onnx:direct"}
        assert set(during) == {"efficientnet_lite0_onnx:direct"}
        assert set(after) == {"resnet50_onnx:direct"}
    finally:
        srv.stop()


@pytest.mark.parametrize("victim", ["resnet50_onnx", FAILOVER])
def test_killed_stub_is_detected_and_reloaded(model_repo, tmp_path, server_factory, sample_images, victim):
    """Triton 2.51 keeps a model with a dead stub READY; the watchdog's real-inference
    probe notices and reloads it: service is back within 10 s."""
    srv = server_factory(model_repo, tmp_path, models=(FAILOVER,), exclude=RESNET_ALONE, watchdog_interval_s=1.0)
    client = ClassifyClient(srv.http_url, "http", model=FAILOVER)
    try:
        assert client.classify([sample_images["mug"]])["ROUTE"][0, 0] == b"resnet50_onnx:direct"
        os.kill(_stub_pid(srv, f"{victim}_0_0"), signal.SIGKILL)
        killed = time.monotonic()
        assert srv.is_model_ready(victim)  # what Triton claims: still READY
        while True:
            try:
                client.classify([sample_images["mug"]])
                break
            except InferenceServerException as exc:
                # while dead: the stub error; while reloading: no classifier ready
                assert "is not healthy" in exc.message() or "no classifier is ready" in exc.message(), exc.message()
                assert time.monotonic() - killed < 10, "service did not come back within 10 s"
                time.sleep(0.2)
        recovered = time.monotonic() - killed
        assert recovered < 10
        deadline = time.monotonic() + 10
        while not srv.watchdog.recoveries and time.monotonic() < deadline:  # the record lands just after the load
            time.sleep(0.1)
        (event,) = srv.watchdog.recoveries
        assert event.model == victim and event.recovered_at is not None
        print(f"stub of {victim} killed: service back after {recovered:.1f} s")
    finally:
        client.close()
        srv.stop()


def test_shutdown_under_load_answers_or_fails_cleanly(model_repo, tmp_path, server_factory, sample_images):
    srv = server_factory(model_repo, tmp_path, models=(FAILOVER,), exclude=RESNET_ALONE)
    pid, prefix = srv.pid, srv.shm_prefix
    traffic = Traffic(srv.grpc_url, "grpc", FAILOVER, sample_images["mug"], threads=8)
    with traffic:
        time.sleep(2)
        t0 = time.monotonic()
        code = srv.stop()
        stop_s = time.monotonic() - t0
        time.sleep(0.5)
    if code == 0:
        assert stop_s < srv.options.exit_timeout_s + 5
    else:
        # Triton 2.51 was once seen (1 run in many) not to exit on SIGTERM after every model
        # had been unloaded; the launcher then kills it, which loses nothing only because
        # the drain came first. Its thread stacks go to the server log for a bug report.
        assert code == -signal.SIGKILL and srv.last_stop.drained, f"tritonserver exit code {code}, {srv.last_stop}"
        warnings.warn(f"tritonserver had to be killed after a clean drain; see {srv.options.log_file}")
    assert traffic.sent == len(traffic.routes) + len(traffic.errors)  # every request came back
    assert len(traffic.routes) > 0
    for message in traffic.errors:  # refused after shutdown began, never a hang or a crash
        assert re.search(r"unavailable|no available versions|cancelled|connect|shutting|stopping|not found|Socket closed|refused|reset|not ready", message, re.I), message
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    assert not [p for p in Path("/dev/shm").iterdir() if p.name.startswith(prefix)]
