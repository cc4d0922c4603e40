"""One bad model kept to itself, and what an on-call engineer reads: a real server (the
launcher bls-serve uses, its status port on) with a child whose ONNX file disagrees with its
config (resnet50_bad: 10 classes where its config says 1000), a flow whose only classifier
it is (classify_bad), and good flows beside them.

- the others serve, the failure is named, and the flow on the broken child answers 500
  naming the load error (not 503, the retry-later code); fixed, it answers again;
- bls-serve's /ready follows the models named, and Triton's strict readiness does not recover;
- the watchdog probes a model loaded later through the repository API, and brings it back;
- with request tracing on, bls-serve's latency histogram counts users' requests exactly (the
  probes left out), it counts the requests Triton's queue refused (Triton counts them nowhere),
  and bls-explain accounts for a request's compute part by part;
- bls-serve as a process names what failed and serves (--fail-fast: exits 2)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from google.protobuf import text_format

from bls_pipeline.base.modelconfig import ModelConfig, config_variant
from bls_pipeline.serve.client import ClassifyClient, tritonclient_module
from bls_pipeline.serve.options import ServerOptions, free_port
from bls_pipeline.serve.server import TritonServer

from polling import eventually, get

pytestmark = pytest.mark.integration

BAD, BAD_FLOW, GOOD_FLOW, TINY_QUEUE = "resnet50_bad", "classify_bad", "classify_bls_resnet50", "classify_tiny_queue"
MISMATCH = ("model resnet50_bad: output output: its config.pbtxt declares TYPE_FP32 dims [1000], max_batch_size 32, "
            "and model.onnx has FP32 [-1, 10]")


def _tiny_onnx(path: Path, classes: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    try:
        from test_artifact_io import _onnx
    finally:
        sys.path.pop(0)
    _onnx(path, classes)


@pytest.fixture(scope="module")
def broken_repo(model_repo, tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("observability") / "models"
    candidates = [d.name for d in model_repo.iterdir() if d.name.startswith(("resnet50_", "efficientnet_lite0_"))]
    for name in (GOOD_FLOW, "classify_bls_broken_shape", "broken_shape", "image_quality", *candidates):
        shutil.copytree(model_repo / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(model_repo / "resnet50_onnx", repo / BAD,
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.json", "__pycache__"))
    (repo / BAD / "config.pbtxt").write_text(config_variant(repo / "resnet50_onnx", BAD, {}))
    _tiny_onnx(repo / BAD / "1" / "model.onnx", 10)
    shutil.copytree(repo / GOOD_FLOW, repo / BAD_FLOW)
    (repo / BAD_FLOW / "config.pbtxt").write_text(config_variant(repo / GOOD_FLOW, BAD_FLOW, {"classifiers": BAD}))
    # One instance, room for one request in the queue: the rest of a burst is refused by Triton.
    shutil.copytree(repo / GOOD_FLOW, repo / TINY_QUEUE)
    config = text_format.Parse(config_variant(repo / GOOD_FLOW, TINY_QUEUE, {}), ModelConfig())
    config.instance_group[0].count = 1
    config.dynamic_batching.default_queue_policy.max_queue_size = 1
    (repo / TINY_QUEUE / "config.pbtxt").write_text(text_format.MessageToString(config))
    return repo


@pytest.fixture(scope="module")
def kept(broken_repo, tmp_path_factory):
    """The server that serves what loads (fail_fast off), watchdog every 0.5 s, status port on."""
    logs = tmp_path_factory.mktemp("observability-logs")
    # trace_rate=1: the histogram, the queue-full refusals and bls-explain read Triton's traces,
    # off as shipped (Triton 2.51's tracer can abort tritonserver: workarounds.py).
    server = TritonServer(ServerOptions.on_free_ports(
        broken_repo, logs / "tritonserver.log", models=(BAD_FLOW, GOOD_FLOW, "classify_bls_broken_shape", TINY_QUEUE),
        fail_fast=False, status_port=free_port(), watchdog_interval_s=0.5, trace_rate=1))
    server.start()
    yield server
    server.stop()


def _infer(server, protocol: str, model: str, image: bytes, request_id: str = "") -> InferenceServerException | None:
    tc = tritonclient_module(protocol)
    client = tc.InferenceServerClient(server.url(protocol))
    try:
        data = np.array([[image]], dtype=object)
        inp = tc.InferInput("IMAGE", [1, 1], "BYTES")
        inp.set_data_from_numpy(data)
        client.infer(model, [inp], request_id=request_id)
        return None
    except InferenceServerException as exc:
        return exc
    finally:
        client.close()


# ---- one bad model kept to itself ------------------------------------------------------------

def test_the_others_serve_and_the_broken_childs_flow_answers_500_naming_its_load_error(kept, sample_images,
                                                                                       broken_repo):
    assert set(kept.failed) == {BAD} and MISMATCH in kept.failed[BAD]
    assert {BAD_FLOW, GOOD_FLOW, "resnet50_onnx", "classify_bls_broken_shape"} <= set(kept.loaded)
    metrics = get(f"{kept.status_url}/metrics")[1]
    assert re.search(rf'^bls_model_load_failed\{{model="{BAD}"\}} 1$', metrics, re.M)
    assert re.search(rf'^bls_model_load_failed\{{model="{GOOD_FLOW}"\}} 0$', metrics, re.M)
    assert _infer(kept, "http", GOOD_FLOW, sample_images["mug"]) is None
    for protocol, status in (("http", "500"), ("grpc", "StatusCode.INTERNAL")):
        error = _infer(kept, protocol, BAD_FLOW, sample_images["mug"])
        assert error is not None and error.status() == status  # broken, not "try again later"
        assert (f"no classifier is ready for classifiers (its candidates, in order: {BAD} failed to "
                "load: " in error.message())
        assert "dim 0 is 1000 against 10" in error.message() or "FP32 [-1, 10]" in error.message()
    # Fixed (a model file that matches), loaded again through the repository API: it answers.
    _tiny_onnx(broken_repo / BAD / "1" / "model.onnx", 1000)
    try:
        kept.load_model(BAD)
        assert _infer(kept, "grpc", BAD_FLOW, sample_images["mug"]) is None
    finally:
        _tiny_onnx(broken_repo / BAD / "1" / "model.onnx", 10)


def test_readiness_follows_the_named_models_and_recovers(kept, broken_repo):
    """Triton's strict readiness stays 400 after one failed load, even once that model is
    unloaded; bls-serve's /ready follows the named models: a flow whose last probe failed is
    not ready, and is again when its child is fixed."""
    assert kept.ready_for == (BAD_FLOW, GOOD_FLOW, "classify_bls_broken_shape", TINY_QUEUE)
    ready = f"{kept.status_url}/ready"
    kept.unload_model(BAD)
    with pytest.raises(Exception):  # the repository API's load of the broken model fails
        kept.load_model(BAD)
    code, text = eventually(lambda: (lambda r: r if r[0] == 503 and f"{BAD} failed to load" in r[1]
                                     else None)(get(ready)),
                            what="not ready, naming the failed load")
    assert ((f"{BAD_FLOW} its last probe failed: [500] no classifier is ready for classifiers (its candidates, in "
             f"order: {BAD} failed to load") in text)
    assert "classify_bls_broken_shape" in text  # its probe fails too (its child is broken): not ready
    kept.unload_model(BAD)
    assert get(f"http://{kept.http_url}/v2/health/ready")[0] == 400  # Triton's, after the unload too
    _tiny_onnx(broken_repo / BAD / "1" / "model.onnx", 1000)
    try:
        kept.load_model(BAD)
        eventually(lambda: BAD_FLOW not in get(ready)[1], what=f"{BAD_FLOW} ready again")
    finally:
        kept.unload_model(BAD)
        _tiny_onnx(broken_repo / BAD / "1" / "model.onnx", 10)


def test_readiness_of_models_the_failed_load_does_not_touch_stays(broken_repo, tmp_path):
    """/ready follows GOOD_FLOW alone: a failed load of another model changes nothing."""
    server = TritonServer(ServerOptions.on_free_ports(broken_repo, tmp_path / "tritonserver.log", models=(GOOD_FLOW,),
                                                      fail_fast=False, status_port=free_port(), watchdog_interval_s=0.5,
                                                      ready_for=(GOOD_FLOW,)))
    server.start()
    try:
        ready = f"{server.status_url}/ready"
        eventually(lambda: get(ready)[0] == 200, what="ready")
        with pytest.raises(Exception):
            server.load_model(BAD)
        server.unload_model(BAD)
        assert get(f"http://{server.http_url}/v2/health/ready")[0] == 400
        rounds = server.watchdog.rounds
        eventually(lambda: server.watchdog.rounds >= rounds + 3, what="three more watchdog rounds")
        assert get(ready) == (200, f"ready: {GOOD_FLOW}\n")
    finally:
        server.stop()


def test_the_watchdog_probes_a_model_loaded_later_and_brings_it_back(kept):
    """image_quality, loaded through the repository API after the start: probed within a few
    rounds, and reloaded when its stub is killed."""
    kept.load_model("image_quality")
    try:
        eventually(lambda: "image_quality" in kept.watchdog.outcomes and kept.watchdog.outcomes["image_quality"].ok,
                    what="a probe of image_quality")
        (pid,) = [int(line.split()[0])
                  for line in subprocess.run(["pgrep", "-a", "-g", str(kept.pid)], capture_output=True,
                                             text=True).stdout.splitlines()
                  if "triton_python_backend_stub" in line and " image_quality_0_0 " in line]
        os.kill(pid, signal.SIGKILL)
        eventually(lambda: any(r.model == "image_quality" and r.recovered_at for r in kept.watchdog.recoveries),
                    what="the reload of image_quality")
        assert re.search(r'bls_watchdog_reloads_total\{model="image_quality"\} 1', get(f"{kept.status_url}/metrics")[1])
    finally:
        kept.unload_model("image_quality")


# ---- what the status port tells -------------------------------------------------------------

def _histogram_count(server, model: str) -> float:
    text = get(f"{server.status_url}/metrics")[1]
    found = re.search(rf'^bls_request_duration_seconds_count\{{model="{model}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_the_latency_histogram_counts_users_requests_and_not_the_probes(kept, sample_images):
    before = _histogram_count(kept, GOOD_FLOW)
    rounds = kept.watchdog.rounds
    eventually(lambda: kept.watchdog.rounds >= rounds + 2, what="two watchdog rounds, each probing GOOD_FLOW")
    client = ClassifyClient(kept.grpc_url, "grpc", model=GOOD_FLOW)
    for i in range(5):
        client.classify([sample_images["mug"]])
    client.close()
    assert _infer(kept, "http", GOOD_FLOW, b"not an image") is not None  # failed: counted too
    eventually(lambda: _histogram_count(kept, GOOD_FLOW) - before == 6, what="6 requests in the histogram")
    rounds = kept.watchdog.rounds
    eventually(lambda: kept.watchdog.rounds >= rounds + 2, what="two more watchdog rounds")
    assert _histogram_count(kept, GOOD_FLOW) - before == 6  # the probes meanwhile are not counted
    text = get(f"{kept.status_url}/metrics")[1]
    assert "# TYPE bls_request_duration_seconds histogram" in text
    assert re.search(rf'^bls_request_duration_seconds_bucket\{{model="{GOOD_FLOW}",le="\+Inf"\}} ', text, re.M)


def test_the_requests_tritons_queue_refused_are_counted_where_triton_counts_none(kept, sample_images):
    """A burst at a flow with room for one request in its queue: every request its client saw
    refused with Triton's "Exceeds maximum queue size" is in bls_refused_requests_total, and in
    neither of Triton's own counters."""
    import threading

    def count(url: str, metric: str) -> float:
        text = get(url)[1]
        return sum(float(v) for v in re.findall(rf'^{metric}\{{[^}}]*model="{TINY_QUEUE}"[^}}]*\}} (\S+)$', text, re.M))

    status, triton = f"{kept.status_url}/metrics", kept.metrics_url
    before = {m: count(u, m)
              for u, m in ((status, "bls_refused_requests_total"), (triton, "nv_inference_request_failure"),
                           (triton, "nv_inference_request_success"))}
    errors: list[str] = []
    start = threading.Barrier(8)

    def send(i: int) -> None:
        start.wait()
        error = _infer(kept, "grpc" if i % 2 else "http", TINY_QUEUE, sample_images["mug"], request_id=f"burst-{i}")
        if error is not None:
            errors.append(error.message())

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    refused = [e for e in errors if "Exceeds maximum queue size" in e]
    assert refused and len(refused) == len(errors), errors
    eventually(lambda: count(status, "bls_refused_requests_total") - before["bls_refused_requests_total"]
               == len(refused),
               what=f"{len(refused)} refusals counted")
    assert count(triton, "nv_inference_request_failure") == before["nv_inference_request_failure"]
    # (the watchdog's probes of it count among the successes too; Triton records a success
    # after the answer has gone, so a client may read the counter before it moves)
    eventually(lambda: (count(triton, "nv_inference_request_success") - before["nv_inference_request_success"]
                        >= 8 - len(refused)),
               what=f"{8 - len(refused)} answers counted as successes")


def test_bls_explain_accounts_for_a_requests_compute(kept, sample_images):
    assert _infer(kept, "grpc", GOOD_FLOW, sample_images["coffee"], request_id="explain-me") is None
    status = kept.status_url.removeprefix("http://")
    out = eventually(lambda: (lambda p: p.stdout if p.returncode == 0 else None)(subprocess.run(
        [str(Path(sys.executable).parent / "bls-explain"), "--status", status, "--request", "explain-me"],
        capture_output=True, text=True, timeout=60)), what="the request explained")
    assert out.startswith(f"{GOOD_FLOW} request explain-me (trace ")
    for part in ("queue", "compute", "to the stub", "decode_preprocess", "child resnet50_onnx", "flow's own code",
                 "answers", "responses", "back to Triton", "response"):
        assert re.search(rf"^\s+{re.escape(part)}\s", out, re.M), (part, out)
    assert re.search(r"in Triton: queue \d+\.\d ms, compute \d+\.\d ms", out)  # the child's own trace, joined
    covered = float(re.search(r"the measured parts: ([\d.]+)% of the compute", out).group(1))
    assert 95.0 <= covered <= 100.5, out
    (found,) = json.loads(subprocess.run([str(Path(sys.executable).parent / "bls-explain"), "--status", status,
                                          "--request",
                                          "explain-me", "--json"], capture_output=True, text=True, timeout=60).stdout)
    top = sum(p["ms"] for p in found["parts"] if p["level"] == 0)
    assert top == pytest.approx(found["compute_ms"], rel=0.05)


def test_log_executions_is_switched_on_at_run_time(kept, sample_images):
    """bls-explain --log-executions on FLOW: the flow loaded anew with it, no request lost,
    and its execute() lines in the server log from then on."""
    explain = [str(Path(sys.executable).parent / "bls-explain"), "--url", kept.http_url, "--admin-key",
               kept.options.admin_key]
    log = Path(kept.options.log_file)
    done = subprocess.run([*explain, "--log-executions", "on", GOOD_FLOW], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout == f"{GOOD_FLOW}: log_executions on\n", done.stdout + done.stderr
    try:
        assert kept.admin.config(GOOD_FLOW)["parameters"]["log_executions"]["string_value"] == "true"
        assert _infer(kept, "http", GOOD_FLOW, sample_images["mug"], request_id="logged-1") is None
        eventually(lambda: '"requests":["logged-1"]' in log.read_text(errors="replace").replace('\\"', '"'),
                    what="the execute() line in the log")
    finally:
        subprocess.run([*explain, "--log-executions", "off", GOOD_FLOW], capture_output=True, text=True, timeout=300)
    assert kept.admin.config(GOOD_FLOW)["parameters"]["log_executions"]["string_value"] == "false"


# ---- bls-serve as a process -------------------------------------------------------------------

def _bls_serve(repo: Path, *args: str) -> subprocess.Popen:
    ports = [str(free_port()) for _ in range(4)]
    return subprocess.Popen([str(Path(sys.executable).parent / "bls-serve"), "--model-repository", str(repo),
                             "--http-port", ports[0], "--grpc-port", ports[1], "--metrics-port", ports[2],
                             "--status-port", ports[3], "--watchdog-interval", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_bls_serve_names_what_failed_and_serves_the_rest_and_fail_fast_exits_2(broken_repo):
    proc = _bls_serve(broken_repo, "--models", f"{BAD_FLOW},{GOOD_FLOW}")
    out = []
    try:
        for line in proc.stdout:
            out.append(line)
            if line == "Ctrl-C to stop.\n":
                break
        text = "".join(out)
        assert re.search(rf"^Serving .*\b{GOOD_FLOW}\b", text, re.M), text
        assert f"  FAILED to load: {BAD} (" in text and "its callers answer 500 naming it" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    fast = _bls_serve(broken_repo, "--models", f"{BAD_FLOW},{GOOD_FLOW}", "--fail-fast")
    text = fast.communicate(timeout=300)[0]
    assert fast.returncode == 2 and "bls-serve: error:" in text and MISMATCH in text
