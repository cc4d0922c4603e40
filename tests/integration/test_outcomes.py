"""Outcomes counted apart, on a real server watched by a real Prometheus with
deploy/monitoring/rules.yml: clients that give up are not refusals.

Six gRPC clients with 0.3 s deadlines against a flow slower than that leave bls-serve's
refusal counter, the availability ratio and the overload alerts as they were; their requests
dropped in Triton's queue are counted in a series of their own, exactly as many as Triton's
nv_inference_request_failure{reason="CANCELED"} counts. Then real refusals move them: requests
that wait out their `timeout` in the queue ("Request timeout expired") and a burst beyond a
small queue ("Exceeds maximum queue size"), each counted under its reason.

The flows call `slow_child`, a python classifier that takes 1 s a call (test-only: no shipped
model is reliably slower than 0.3 s on every machine, and a sleep makes the queue certain).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.utils import InferenceServerException

from bls_pipeline.contract import IMAGE
from bls_pipeline.base.modelconfig import ModelConfig, config_variant
from bls_pipeline.serve.client import tritonclient_module
from bls_pipeline.serve.options import ServerOptions, free_port
from bls_pipeline.serve.server import TritonServer

from polling import eventually

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="prometheus is not installed (Debian: apt-get install prometheus; .ci/run "
                                        "does)")]

FLOW, SMALL_QUEUE, CHILD = "slow_flow", "slow_flow_small_queue", "slow_child"
_CHILD = '''"""slow_child (tests only): 1 s a call, unsure of every image; each call, as it
begins, adds a line to calls.txt beside this file."""
import time
from pathlib import Path

import numpy as np


def slow(inputs):
    with open(Path(__file__).with_name("calls.txt"), "a") as calls:
        calls.write("call\\n")
    time.sleep(1.0)
    return {"output": np.zeros((len(inputs["input"]), 1000), np.float32)}
'''


def _flow(repo: Path, shipped: Path, name: str, max_queue_size: int | None = None) -> None:
    shutil.copytree(shipped / "classify_bls", repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    config = text_format.Parse(config_variant(shipped / "classify_bls", name, {
        "cascade_classifiers": "none", "classifiers": CHILD, "tta_threshold": "0", "run_in_process": "none"}),
        ModelConfig())
    config.instance_group[0].count = 1
    if max_queue_size is not None:
        config.dynamic_batching.default_queue_policy.max_queue_size = max_queue_size
    (repo / name / "config.pbtxt").write_text(text_format.MessageToString(config))


@pytest.fixture(scope="module")
def watched(repo_root, tmp_path_factory, child_factory):
    """A server with its status port (room for 64 in FLOW's queue, 2 on SMALL_QUEUE),
    and a Prometheus scraping both endpoints every second with the shipped rules."""
    tmp = tmp_path_factory.mktemp("outcomes")
    shipped, repo = repo_root / "models", tmp / "models"
    child_factory(repo, shipped, CHILD, _CHILD, "slow", max_batch_size=64)
    # Room for what six impatient clients leave in FLOW's queue: Triton drops a cancelled request
    # only when the instance takes its next batch (a call here takes 1 s), and counts it till then.
    _flow(repo, shipped, FLOW, max_queue_size=64)
    _flow(repo, shipped, SMALL_QUEUE, max_queue_size=2)
    # trace_rate=1: the status port's refusal and cancellation counters read Triton's traces,
    # off as shipped (Triton 2.51's tracer can abort tritonserver: workarounds.py).
    server = TritonServer(ServerOptions.on_free_ports(repo, tmp / "tritonserver.log", models=(FLOW, SMALL_QUEUE),
                                                      status_port=free_port(), trace_rate=1))
    server.start()
    port = free_port()
    shutil.copy(repo_root / "deploy" / "monitoring" / "rules.yml", tmp / "rules.yml")
    (tmp / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yml"],
        "scrape_configs": [{"job_name": "triton", "static_configs": [{"targets": [
                               server.metrics_url.removeprefix("http://").removesuffix("/metrics")]}]},
                           {"job_name": "bls-serve", "static_configs": [{"targets": [
                               server.status_url.removeprefix("http://")]}]}]}))
    log = open(tmp / "prometheus.log", "wb")
    proc = subprocess.Popen([shutil.which("prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        yield server, f"127.0.0.1:{port}", repo / CHILD / "1" / "calls.txt"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        server.stop()


# ---- what the server and Prometheus say ----------------------------------------------------------

def _count(url: str, metric: str, model: str, **labels: str) -> float:
    """The sum of `metric` over its series for `model` (and these labels) at `url`."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    total = 0.0
    for found, value in re.findall(rf'^{metric}\{{([^}}]*)\}} (\S+)$', text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', found))
        if have.get("model") == model and all(have.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


def _counts(server, model: str) -> dict[str, float]:
    status = f"{server.status_url}/metrics"
    return {"refused": _count(status, "bls_refused_requests_total", model),
            "queue_full": _count(status, "bls_refused_requests_total", model, reason="queue_full"),
            "queue_timeout": _count(status, "bls_refused_requests_total", model, reason="queue_timeout"),
            "queue_cancelled": _count(status, "bls_queue_cancelled_requests_total", model),
            "triton_canceled": _count(server.metrics_url, "nv_inference_request_failure", model, reason="CANCELED"),
            "triton_rejected": _count(server.metrics_url, "nv_inference_request_failure", model, reason="REJECTED")}


def _query(prometheus: str, query: str) -> list[dict]:
    url = f"http://{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())["data"]["result"]


def _alerts(prometheus: str, model: str) -> dict[str, str]:
    """The overload and availability alerts on `model`, by name: their state (pending, firing)."""
    with urllib.request.urlopen(f"http://{prometheus}/api/v1/alerts", timeout=10) as r:
        alerts = json.loads(r.read())["data"]["alerts"]
    return {a["labels"]["alertname"]: a["state"] for a in alerts
            if a["labels"].get("model") == model
            and a["labels"]["alertname"] in ("BLSOverloaded", "BLSAvailabilityLow")}


def _seen_by_prometheus(prometheus: str, server, model: str) -> None:
    """Wait until Prometheus has scraped the status port's counts as they are now, and
    evaluated its rules over them."""
    now = _counts(server, model)

    def scraped() -> bool:
        for metric, key in (("bls_refused_requests_total", "refused"),
                            ("bls_queue_cancelled_requests_total", "queue_cancelled")):
            result = _query(prometheus, f'sum(max_over_time({metric}{{model="{model}"}}[2s]))')
            if not result or float(result[0]["value"][1]) != now[key]:
                return False
        return True

    eventually(scraped, f"Prometheus scraping {model}'s counts", timeout_s=60.0, every_s=0.5)
    seen_at = time.time()
    # Then every rule group evaluated twice over them (a `for` of 0 s shows pending after one).
    eventually(lambda: _evaluated_since(prometheus, seen_at, times=2), "the rules evaluated over those counts",
               timeout_s=30.0, every_s=0.25)


def _evaluated_since(prometheus: str, since: float, times: int) -> bool:
    """Whether every rule group's last evaluation began `times` intervals or more after `since`."""
    with urllib.request.urlopen(f"http://{prometheus}/api/v1/rules", timeout=10) as r:
        groups = json.loads(r.read())["data"]["groups"]
    for group in groups:
        last = datetime.fromisoformat(group["lastEvaluation"].replace("Z", "+00:00")).timestamp()
        if last < since + (times - 1) * float(group["interval"]):
            return False
    return bool(groups)


def _pending(server, model: str) -> float:
    """Triton's count of the model's requests waiting in its queue now."""
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    found = re.findall(rf'^nv_inference_pending_request_count{{[^}}]*model="{model}"[^}}]*}} (\S+)$', text, re.M)
    return sum(float(v) for v in found)


def _availability(prometheus: str, model: str) -> float | None:
    result = _query(prometheus, f'bls:availability:ratio_rate5m{{model="{model}"}}')
    return float(result[0]["value"][1]) if result else None


def _infer(server, protocol: str, model: str, image: bytes, **kwargs) -> InferenceServerException | None:
    tc = tritonclient_module(protocol)
    client = tc.InferenceServerClient(server.url(protocol))
    try:
        inp = tc.InferInput(IMAGE.name, [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[image]], dtype=object))
        client.infer(model, [inp], **kwargs)
        return None
    except InferenceServerException as exc:
        return exc
    finally:
        client.close()


def _together(n: int, send) -> list[InferenceServerException | None]:
    """send(i) from n threads at once; their outcomes."""
    outcomes: list = [None] * n
    start = threading.Barrier(n)

    def run(i: int) -> None:
        start.wait()
        outcomes[i] = send(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return outcomes


# ---- the test ------------------------------------------------------------------------------------

def test_impatient_clients_are_not_refusals_and_real_refusals_still_count(watched, sample_images):
    server, prometheus, child_calls = watched
    image = sample_images["mug"]
    def scraping() -> bool:
        try:
            return bool(_query(prometheus, f'bls_queue_cancelled_requests_total{{model="{FLOW}"}}'))
        except OSError:  # not listening yet
            return False

    eventually(scraping, "Prometheus scraping the status port's series at 0", timeout_s=90.0, every_s=0.5)
    for _ in range(2):  # answered: the availability ratio is a number, 1
        assert _infer(server, "grpc", FLOW, image) is None
    before = _counts(server, FLOW)

    # Six clients, each sending again as soon as its 0.3 s deadline has passed, for 4 s.
    def impatient(i: int) -> list[str]:
        seen, stop = [], time.monotonic() + 4.0
        while time.monotonic() < stop:
            error = _infer(server, "grpc", FLOW, image, client_timeout=0.3, request_id=f"impatient-{i}")
            seen.append("answered" if error is None else error.status())
        return seen

    seen = [s for outcomes in _together(6, impatient) for s in outcomes]
    assert seen and set(seen) == {"StatusCode.DEADLINE_EXCEEDED"}, seen
    # Triton drops a cancelled request only when it next takes requests from the queue: first
    # every request of the run has left the queue, then both counts have caught up with that
    # (they can agree on the way, with cancelled requests still queued).
    eventually(lambda: _pending(server, FLOW) == 0, "the flow's queue empty", timeout_s=30.0)
    after = eventually(lambda: (lambda c: c if c["queue_cancelled"] > before["queue_cancelled"]
                                and c["queue_cancelled"] - before["queue_cancelled"]
                                == c["triton_canceled"] - before["triton_canceled"] else None)(_counts(server, FLOW)),
                       "the cancellations counted, as many as Triton's CANCELED", timeout_s=30.0)
    print(f"\n{len(seen)} impatient requests: {after['queue_cancelled'] - before['queue_cancelled']:.0f} dropped in "
          f"Triton's queue (its CANCELED: {after['triton_canceled'] - before['triton_canceled']:.0f}), refused "
          f"{after['refused'] - before['refused']:.0f}")
    assert after["refused"] == before["refused"]
    assert after["queue_cancelled"] - before["queue_cancelled"] == after["triton_canceled"] - before["triton_canceled"]
    _seen_by_prometheus(prometheus, server, FLOW)
    assert _availability(prometheus, FLOW) == 1.0
    assert _alerts(prometheus, FLOW) == {}

    # Real refusals: two requests whose 0.2 s `timeout` passes in the queue behind a busy instance ...
    calls = len(child_calls.read_text().splitlines())
    busy = threading.Thread(target=_infer, args=(server, "grpc", FLOW, image))
    busy.start()
    eventually(lambda: len(child_calls.read_text().splitlines()) > calls, "the flow's instance busy", every_s=0.02)
    timed_out = _together(2, lambda i: _infer(server, ("grpc", "http")[i], FLOW, image, timeout=200_000))
    busy.join(timeout=60)
    assert all(e is not None and "Request timeout expired" in e.message() for e in timed_out), timed_out
    refused = eventually(lambda: (lambda c: c if c["queue_timeout"] - before["queue_timeout"] == 2
                                  else None)(_counts(server, FLOW)),
                         "2 queue timeouts counted")
    assert refused["triton_rejected"] - before["triton_rejected"] == 2
    assert refused["queue_cancelled"] == after["queue_cancelled"] and refused["queue_full"] == before["queue_full"]
    _seen_by_prometheus(prometheus, server, FLOW)
    assert _availability(prometheus, FLOW) < 0.99
    assert _alerts(prometheus, FLOW) == {"BLSOverloaded": "pending", "BLSAvailabilityLow": "pending"}

    # ... and a burst beyond a queue with room for two.
    small = _counts(server, SMALL_QUEUE)
    burst = _together(6, lambda i: _infer(server, ("grpc", "http")[i % 2], SMALL_QUEUE, image))
    full = [e for e in burst if e is not None]
    assert full and all("Exceeds maximum queue size" in e.message() for e in full), full
    eventually(lambda: _counts(server, SMALL_QUEUE)["queue_full"] - small["queue_full"] == len(full),
               f"{len(full)} refusals of a full queue counted")
    now = _counts(server, SMALL_QUEUE)
    assert (now["queue_timeout"], now["queue_cancelled"]) == (small["queue_timeout"], small["queue_cancelled"])
    _seen_by_prometheus(prometheus, server, SMALL_QUEUE)
    assert _availability(prometheus, SMALL_QUEUE) < 0.99
    assert _alerts(prometheus, SMALL_QUEUE).get("BLSOverloaded") == "pending"
