"""Triton's perf_analyzer against a real server, as docs/performance.md runs it: the input
file from `bls-perf data`, the admin key for the config it reads, closed and open loop, HTTP
and gRPC. Its answers are checked by perf_analyzer itself (validation_data: the answers a
tritonclient got for the same images, known to be right here) and by the server's counts of
what it answered: a flow's own bls_requests_total (Triton's success count takes in the
requests a flow refused: test_status_codes.py), Triton's statistics for other models."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from docblocks import REPO, commands, run_block, user_checkout
from polling import eventually, scrape

from bls_pipeline.runtime.load.loader import is_flow_model
from bls_pipeline.serve.options import free_port
from bls_pipeline.tools import perf

pytestmark = pytest.mark.integration

TOOLS = REPO / "scripts" / "perf-tools.sh"
BINARY = REPO / ".venv-perf" / "bin" / "perf_analyzer"
SIGN_TEXT = "TRITON AVE\nBLS 2026\nFRAGILE"  # samples/sign.png, as test_read_text.py reads it
# A deadline (Triton's timeout, µs) that resnet50 always meets here: an unsure image escalates.
# Without one, an escalation that would end past latency_target_ms (400 ms) after the request's
# arrival is answered degraded, which one client alone sees on a busy 2-core machine.
DEADLINE = "timeout:10000000:int"


@pytest.fixture(scope="module")
def perf_analyzer() -> list[str]:
    if not BINARY.is_file():
        why = (f"perf_analyzer is not installed: {BINARY} is missing (scripts/perf-tools.sh installs it; "
               "./scripts/test.sh runs it)")
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI must run it")
        pytest.skip(why)
    return [str(TOOLS), "perf_analyzer"]


def _data(tmp_path: Path, name: str, args: list[str]) -> Path:
    out = tmp_path / f"{name}.json"
    assert perf.main(["data", *args, "--out", str(out)]) == 0
    return out


def _counts(server, model: str) -> dict[str, int]:
    """What `model` finished so far, by outcome: a flow's own bls_requests_total by status code
    ("code=OK": answered); for other models Triton's statistics ("success", "fail")."""
    if is_flow_model(Path(server.options.model_repository) / model):
        return {k: int(v) for k, v in scrape(server.metrics_url, "bls_requests_total", model).items()}
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]["inference_stats"]
    finally:
        client.close()
    return {"success": int(stats["success"].get("count", 0)), "fail": int(stats["fail"].get("count", 0))}


def _run(server, command: list[str], model: str, protocol: str, data: Path, *load: str, requests: int = 12,
         key: bool = True) -> subprocess.CompletedProcess:
    headers = server.admin_headers_for(protocol) if key else {}
    cmd = [*command, "-m", model, "-u", server.url(protocol), "-i", protocol, "--input-data", str(data),
           "--request-count", str(requests), *load, *[a for k, v in headers.items() for a in ("-H", f"{k}:{v}")]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _checked_run(server, command, model, protocol, data, *load, requests=12) -> str:
    """perf_analyzer's run, which must succeed, and the server's counts, which must have gained
    at least `requests` answers and nothing else (a flow's metrics follow its answers within
    a flush: polled)."""
    answered = "code=OK" if is_flow_model(Path(server.options.model_repository) / model) else "success"
    before = _counts(server, model)
    done = _run(server, command, model, protocol, data, *load, requests=requests)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    def gained() -> dict[str, int]:
        return {k: n - before.get(k, 0) for k, n in _counts(server, model).items() if n != before.get(k, 0)}

    eventually(lambda: gained().get(answered, 0) >= requests, f"{model}: {requests} requests counted {answered}")
    assert set(gained()) == {answered}, gained()
    return done.stdout


def test_classify_bls_answers_checked_route_by_route(server, perf_analyzer, repo_root, tmp_path):
    """One in flight over gRPC, every answer's ROUTE checked by perf_analyzer; the cat escalates,
    the mug does not (test_bench_smoke.py's photos), so the check tells the branches apart."""
    data = _data(tmp_path, "classify", [str(repo_root / "samples" / f"{n}.jpg") for n in ("chelsea", "mug", "coffee")]
                 + ["--bench-set", "--expect", "ROUTE", "--request-parameter", DEADLINE, "--url", server.grpc_url])
    routes = [v["ROUTE"][0] for v in json.loads(data.read_text())["validation_data"]]
    assert routes[:4] == ["resnet50_onnx:escalated"] * 2 + ["efficientnet_lite0_onnx:confident"] * 2, routes
    out = _checked_run(server, perf_analyzer, "classify_bls", "grpc", data, "--concurrency-range", "1",
                       "--request-parameter", DEADLINE)
    assert "Concurrency: 1, throughput:" in out


def test_closed_loops_up_to_32_are_answered_every_answer_checked(server, perf_analyzer, repo_root, tmp_path):
    """The shipped classify_bls holds a closed loop of up to 32 in flight (its queue holds 64):
    perf_analyzer's sweep, which stops at the first refusal, runs to 32 with every ROUTE checked.
    The checked images are those the cheap classifier is sure of, whose answers no load changes
    (an escalated one may come back degraded under load, as it should)."""
    data = _data(tmp_path, "confident", [str(repo_root / "samples"), "--bench-set", "--expect", "ROUTE",
                                         "--only-routes", "confident", "--url", server.grpc_url])
    routes = [v["ROUTE"][0] for v in json.loads(data.read_text())["validation_data"]]
    assert len(routes) >= 4 and set(routes) == {"efficientnet_lite0_onnx:confident"}, routes
    for concurrency in (1, 2, 4, 8, 16, 32):  # two requests per client: no refusal, the right answer
        out = _checked_run(server, perf_analyzer, "classify_bls", "grpc", data, "--concurrency-range", str(concurrency),
                           requests=2 * concurrency)
        assert f"Concurrency: {concurrency}, throughput:" in out


def test_a_wrong_answer_fails_the_run(server, perf_analyzer, repo_root, tmp_path):
    """The check is real: the mug expected to escalate fails perf_analyzer's run."""
    data = _data(tmp_path, "mug",
                 [str(repo_root / "samples" / "mug.jpg"), "--expect", "ROUTE", "--url", server.grpc_url])
    document = json.loads(data.read_text())
    assert document["validation_data"] == [{"ROUTE": ["efficientnet_lite0_onnx:confident"]}]
    document["validation_data"] = [{"ROUTE": ["resnet50_onnx:escalated"]}]
    data.write_text(json.dumps(document))
    done = _run(server, perf_analyzer, "classify_bls", "grpc", data, "--concurrency-range", "1", requests=2)
    assert done.returncode != 0 and "Output doesn't match expected output" in done.stdout + done.stderr


def test_read_text_open_loop_reads_the_sign(server, perf_analyzer, repo_root, tmp_path):
    """Open loop (--request-rate-range) on read_text, each answer's TEXT and REGION_COUNT checked."""
    data = _data(tmp_path, "sign", [str(repo_root / "samples" / "sign.png"), "--model", "read_text",
                                    "--expect", "TEXT,REGION_COUNT", "--url", server.grpc_url])
    assert json.loads(data.read_text())["validation_data"] == [{"TEXT": [SIGN_TEXT], "REGION_COUNT": [3]}]
    out = _checked_run(server, perf_analyzer, "read_text", "grpc", data, "--request-rate-range", "4", requests=6)
    assert "Request Rate: 4" in out


@pytest.mark.parametrize("model", ["classify_bls", "ensemble_resnet50"])
def test_over_http_the_server_counts_every_request_answered(server, perf_analyzer, repo_root, tmp_path, model):
    """Over HTTP perf_analyzer 2.51 wants every output in validation_data, which it cannot take
    for variable shapes: the server's counts check the answers (the flow's own for
    classify_bls; the ensemble has no fixed-shape output at all)."""
    data = _data(tmp_path, "images", [str(repo_root / "samples"), "--bench-set"])
    assert len(json.loads(data.read_text())["data"]) == 12  # 6 JPEGs and their mirrors
    _checked_run(server, perf_analyzer, model, "http", data, "--concurrency-range", "1")


def test_without_the_admin_key_it_stops_at_the_config(server, perf_analyzer, repo_root, tmp_path):
    """Reading a model's config is behind the admin key (docs/deploy.md): without it
    perf_analyzer stops before its first request, naming the header."""
    data = _data(tmp_path, "mug", [str(repo_root / "samples" / "mug.jpg")])
    done = _run(server, perf_analyzer, "classify_bls", "grpc", data, "--concurrency-range", "1", requests=1, key=False)
    assert done.returncode != 0
    assert "expecting header 'triton-grpc-protocol-triton-admin-key'" in done.stdout + done.stderr


def test_the_documented_commands_run_as_they_stand(perf_analyzer, model_repo, tmp_path):
    """docs/performance.md's block in a reader's checkout: bls-serve, the input files, and
    perf_analyzer on every flow and the ensemble, HTTP and gRPC, closed loops up to 32 in flight
    and open loop, with per-request parameters. bash -e: any run that fails (an error answer, an
    answer that is not the one expected) fails the block; the flow's own count, printed last,
    has every request answered and none refused."""
    (block,) = commands(REPO / "docs" / "performance.md")
    checkout = user_checkout(tmp_path, model_repo)
    (checkout / "scripts").symlink_to(REPO / "scripts")
    result = run_block(block, checkout)
    out = result.stdout
    assert result.returncode == 0, out[-4000:]
    for line in ("Concurrency: 1, throughput:", "Concurrency: 2, throughput:", "Concurrency: 4, throughput:",
                 "Concurrency: 16, throughput:", "Concurrency: 32, throughput:", "Request Rate: 3", "Request Rate: 4"):
        assert line in out, line
    assert out.count("Successfully read data for 1 stream/streams with 12 step/steps") == 2  # bls-bench's set, checked
    confident = json.loads((checkout / "build" / "perf" / "confident.json").read_text())["validation_data"]
    assert {v["ROUTE"][0] for v in confident} == {"efficientnet_lite0_onnx:confident"}  # what the sweep checked against
    direct = json.loads((checkout / "build" / "perf" / "direct.json").read_text())["validation_data"]
    assert [v["ROUTE"] for v in direct] == [["resnet50_onnx:direct"]] * 12  # what skip_cascade was checked against
    counts: dict[str, float] = {}
    for code, value in re.findall(r'^bls_requests_total\{(?=[^}]*model="classify_bls")[^}]*code="(\w+)"[^}]*\} (\S+)$',
                                  out, re.M):
        counts[code] = counts.get(code, 0.0) + float(value)
    sent = 24 * 4 + 2 * (1 + 2 + 4 + 8 + 16 + 32)  # four runs of 24 and the sweep
    assert counts.get("OK", 0) >= sent and not any(n for code, n in counts.items() if code != "OK"), counts
    assert "tritonserver stopped (exit code 0)" in out


def test_a_deadline_too_short_fails_the_run(server, perf_analyzer, repo_root, tmp_path):
    """perf_analyzer's timeout parameter is the request's deadline: 1 ms is too short for
    classify_bls, whose answers say so, and perf_analyzer fails on them."""
    data = _data(tmp_path, "mug", [str(repo_root / "samples" / "mug.jpg")])
    done = _run(server, perf_analyzer, "classify_bls", "grpc", data, "--concurrency-range", "2",
                "--request-parameter", "timeout:1000:int", requests=4)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and ("deadline" in out or "timeout" in out), out[-2000:]


def test_compare_measures_each_target_with_both_tools(perf_analyzer, model_repo, repo_root, tmp_path):
    """bls-perf compare (the numbers in docs/performance.md come from a full run): one server,
    both tools on the same target, their numbers side by side."""
    images = tmp_path / "images"
    images.mkdir()
    (images / "mug.jpg").symlink_to(repo_root / "samples" / "mug.jpg")
    out = tmp_path / "compare"
    assert perf.main(["compare", "--targets", "ensemble_resnet50", "--concurrency", "2", "--duration", "1", "--warmup",
                      "0.5",
                      "--rounds", "1", "--stability", "100", "--model-repository", str(model_repo), "--images",
                      str(images), "--out", str(out)]) == 0
    runs = json.loads((out / "compare.json").read_text())["runs"]
    bench, pa = runs["bench ensemble_resnet50 c=2"]["0"], runs["perf_analyzer ensemble_resnet50 c=2"]["0"]
    assert bench["errors"] == 0 and bench["images_per_s"] > 0 and pa["images_per_s"] > 0
    assert pa["server_compute_ms"] > 0 and pa["p50_ms"] <= pa["p99_ms"]
    assert "| ensemble_resnet50 | 2 |" in (out / "compare.md").read_text()


def test_bls_tritonserver_is_a_plain_tritonserver(model_repo, tmp_path):
    """What Model Analyzer's local launch mode starts (scripts/model-analyzer.yaml): it takes
    tritonserver's own flags, finds the python backend, and is tritonserver itself (exec):
    Model Analyzer signals that pid and reads its memory."""
    ports = [free_port() for _ in range(3)]
    command = [str(Path(sys.executable).parent / "bls-tritonserver"), f"--model-repository={model_repo}",
               "--model-control-mode=explicit", "--load-model=image_quality",
               *[f"--{kind}-{what}" for kind, port in zip(("http", "grpc", "metrics"), ports)
                 for what in ("address=127.0.0.1", f"port={port}")]]
    with open(tmp_path / "tritonserver.log", "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not _ready(f"http://127.0.0.1:{ports[0]}/v2/models/image_quality/ready"):
            assert proc.poll() is None, (tmp_path / "tritonserver.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "image_quality not ready after 180 s"
            time.sleep(0.5)
        assert Path(f"/proc/{proc.pid}/comm").read_text().strip() == "tritonserver"
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False
