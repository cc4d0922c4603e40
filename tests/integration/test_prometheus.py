"""A real Prometheus (Debian's `prometheus`; .ci/run installs it) scrapes a real server, Triton's
metrics port and bls-serve's status port, with deploy/monitoring/rules.yml as they stand: the
broken-flow alert stays quiet while nothing failed and fires after one request to a flow whose
child breaks its contract; the latency recording rule reads Triton's latency summary; and a
2-minute overload pages while it lasts and resolves after it (`timing`: run apart)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from bls_pipeline.serve.client import ClassifyClient
from bls_pipeline.serve.options import ServerOptions, free_port
from bls_pipeline.serve.server import TritonServer
from tritonclient.utils import InferenceServerException

from polling import eventually

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="prometheus is not installed (Debian: apt-get install prometheus; .ci/run "
                                        "does)")]

FLOW = "classify_bls_broken_shape"  # its child answers 10 scores where its config says 1000: INTERNAL


def _api(prometheus: str, path: str, **query) -> object:
    url = f"http://{prometheus}/api/v1/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())["data"]


def _alerts(prometheus: str, name: str) -> list[dict]:
    return [a for a in _api(prometheus, "alerts")["alerts"] if a["labels"].get("alertname") == name
            and a["labels"].get("model") == FLOW]


@pytest.fixture
def watched(model_repo, tmp_path, repo_root):
    """A server with its status port, on free ports, and a Prometheus scraping both endpoints
    every second, started as docs/reliability.md says (deploy/monitoring/run-prometheus.sh)."""
    server = TritonServer(ServerOptions.on_free_ports(model_repo, tmp_path / "tritonserver.log", models=(FLOW,),
                                                      status_port=free_port()))
    server.start()
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([str(repo_root / "deploy" / "monitoring" / "run-prometheus.sh"), "--metrics-port",
                             str(server.options.metrics_port),
                             "--status-port", str(server.options.status_port), "--interval", "1s", "--listen",
                             f"127.0.0.1:{port}",
                             "--data", str(tmp_path / "prometheus")], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield server, f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        server.stop()


def test_the_broken_flow_alert_fires_after_one_broken_childs_request(watched, sample_images):
    server, prometheus = watched

    def scraped():
        try:
            up = _api(prometheus, "query", query="up")["result"]
        except OSError:
            return False
        return len(up) == 2 and all(r["value"][1] == "1" for r in up)

    eventually(scraped, "Prometheus scraping both endpoints", timeout_s=60.0, every_s=0.5)
    # The flow's INTERNAL series is there from its load on, at 0: the alert has evaluated it, quiet.
    query = f'bls_requests_total{{model="{FLOW}",code="INTERNAL"}}'
    eventually(lambda: _api(prometheus, "query", query=query)["result"], "the INTERNAL series at 0",
               timeout_s=60.0, every_s=0.5)
    time.sleep(3)  # a few evaluations
    assert _alerts(prometheus, "BLSFlowBroken") == []
    client = ClassifyClient(server.grpc_url, "grpc", model=FLOW)
    with pytest.raises(InferenceServerException, match="broken_shape returned output with shape"):
        client.classify([sample_images["mug"]])
    client.close()
    firing = eventually(lambda: [a for a in _alerts(prometheus, "BLSFlowBroken") if a["state"] == "firing"],
                        "BLSFlowBroken firing", timeout_s=60.0, every_s=0.5)
    assert firing[0]["labels"]["severity"] == "ticket"
    assert firing[0]["annotations"]["summary"].startswith(f"{FLOW} answered ")
    # The request reached the model: the latency rule reads Triton's own latency summary.
    query = f'bls:request_duration_seconds:p99_1m{{model="{FLOW}"}} > 0'  # a number once a request came
    p99 = eventually(lambda: _api(prometheus, "query", query=query)["result"], "the p99 recording", timeout_s=60.0,
                     every_s=0.5)
    assert float(p99[0]["value"][1]) < 60


def _recorded(prometheus: str, query: str) -> list:
    try:
        return _api(prometheus, "query", query=query)["result"]
    except OSError:  # not listening yet
        return []


def _alert_state(prometheus: str, name: str, model: str) -> str:
    alerts = [a for a in _api(prometheus, "alerts")["alerts"]
              if a["labels"].get("alertname") == name and a["labels"].get("model") == model]
    return alerts[0]["state"] if alerts else "inactive"


@pytest.mark.timing
def test_a_two_minute_overload_pages_while_it_lasts_and_resolves_after(model_repo, tmp_path, repo_root, sample_images):
    """bls-serve as shipped (no tracing), a Prometheus with the shipped scrape interval (15 s)
    and rules: two minutes of 96 gRPC clients back to back, more than classify_bls's queue of 32
    and its instances hold (the queue stands full, Triton refuses what overflows it), fire
    BLSOverloaded before the two minutes are over, and it resolves within two minutes of the
    overload's end, with two clients still sending."""
    from test_crash_recovery import SERVING, BlsServe
    from test_faults import Traffic

    mug = sample_images["mug"]
    with BlsServe(model_repo, "--models", "classify_bls") as bls:
        bls.wait_for_line(SERVING)
        port = free_port()
        log = open(tmp_path / "prometheus.log", "wb")
        proc = subprocess.Popen([str(repo_root / "deploy" / "monitoring" / "run-prometheus.sh"), "--metrics-port",
                                 str(bls.ports["metrics"]), "--status-port", str(bls.ports["status"]), "--listen",
                                 f"127.0.0.1:{port}", "--data", str(tmp_path / "prometheus")], stdout=log,
                                stderr=subprocess.STDOUT)
        prometheus = f"127.0.0.1:{port}"
        try:
            with Traffic(bls.url("grpc"), "grpc", "classify_bls", mug, threads=2):
                eventually(lambda: _recorded(prometheus, 'sum(rate(bls_requests_total{model="classify_bls"}[1m])) > 0'),
                           "Prometheus recording classify_bls's requests", timeout_s=120.0, every_s=1.0)
                assert _alert_state(prometheus, "BLSOverloaded", "classify_bls") == "inactive"
                began = time.monotonic()
                fired = None
                with Traffic(bls.url("grpc"), "grpc", "classify_bls", mug, threads=96) as overload:
                    while time.monotonic() - began < 120.0:
                        if fired is None and _alert_state(prometheus, "BLSOverloaded", "classify_bls") == "firing":
                            fired = time.monotonic() - began
                        time.sleep(2.0)
                ended = time.monotonic()
                refused = sum(1 for r in overload.records if r.error and "UNAVAILABLE" in r.error)
                resolved = None
                while time.monotonic() - ended < 180.0:
                    if _alert_state(prometheus, "BLSOverloaded", "classify_bls") == "inactive":
                        resolved = time.monotonic() - ended
                        break
                    time.sleep(2.0)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
    print(f"\n2-minute overload ({len(overload.records)} requests, {refused} refused 503): BLSOverloaded firing "
          f"{fired if fired is None else round(fired)} s into it; resolved "
          f"{resolved if resolved is None else round(resolved)} s after it ended")
    assert fired is not None and fired < 120.0, "BLSOverloaded did not fire while the overload lasted"
    assert resolved is not None, "BLSOverloaded still firing 3 minutes after the overload ended"
