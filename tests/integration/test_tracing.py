"""One trace through the flow, on a real trace file written by the embedded tritonserver
(`--trace-config triton,file=...`): the flow's child calls are children of a request's trace,
and a batched child call, which serves every request of its execute(), joins the trace of the
first; the execute()'s log line (`log_executions`) names every request and that one, so the
others find it (docs/reliability.md, "Tracing")."""

from __future__ import annotations

import json
import re
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bls_pipeline.serve.argv import trace_args

pytestmark = pytest.mark.integration

FLOW, CHILD = "classify_bls_traced", "resnet50_onnx"  # one instance, 0.3 s to gather a batch, logs each execute()


def _trace_entries(folder, being_written: bool = False) -> list[dict]:
    """Every entry of every file Triton wrote (one file per trace with log-frequency=1).
    being_written: the server still runs, and a file it is writing is left for the next look."""
    entries = []
    for path in sorted(folder.glob("trace.json*")):
        try:
            entries += json.loads(path.read_text())
        except json.JSONDecodeError:
            if not being_written:
                raise
    return entries


def _execute_lines(log_file) -> list[dict]:
    """The flow's bls_execute lines (JSON, quoted by Triton's log format)."""
    lines = []
    for line in log_file.read_text(errors="replace").splitlines():
        m = re.search(r'"bls_pipeline\.adapter\.flow_model: (\{.*\})"$', line)
        if m and "bls_execute" in m.group(1):
            lines.append(json.loads(m.group(1).replace('\\"', '"')))
    return lines


def test_child_calls_join_the_trace_of_the_first_request_and_the_log_names_the_rest(model_repo, server_factory,
                                                                                    tmp_path, sample_images):
    traces = tmp_path / "traces"
    traces.mkdir()
    # bls-serve --trace
    server = server_factory(model_repo, tmp_path, models=(FLOW,), extra_args=trace_args(traces / "trace.json"))
    try:
        image = np.array([[sample_images["mug"]]], dtype=object)
        start = threading.Barrier(4)

        def send(i: int) -> None:  # two over HTTP, two over gRPC, together: batched into one execute()
            tc = httpclient if i % 2 else grpcclient
            client = tc.InferenceServerClient(server.url("http" if i % 2 else "grpc"))
            inp = tc.InferInput("IMAGE", [1, 1], "BYTES")
            inp.set_data_from_numpy(image)
            start.wait()
            assert (client.infer(FLOW, [inp], request_id=f"req-{i}").as_numpy("ROUTE")[0, 0]
                    == f"{CHILD}:direct".encode())
            client.close()

        threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        deadline = time.monotonic() + 30
        # written as each completes
        while len([e for e in _trace_entries(traces, being_written=True) if e.get("model_name") == FLOW]) < 4:
            assert time.monotonic() < deadline, "Triton wrote no trace for some request"
            time.sleep(0.2)
    finally:
        server.stop()

    entries = _trace_entries(traces)
    requests = {e["id"]: e["request_id"] for e in entries if e.get("model_name") == FLOW}
    assert sorted(requests.values()) == [f"req-{i}" for i in range(4)]
    children = [e for e in entries if e.get("model_name") == CHILD]
    assert children and all(e.get("parent_id") in requests for e in children), children  # under a request's trace
    lines = [line for line in _execute_lines(server.options.log_file) if line["requests"]]  # users' (probes aside)
    assert sorted(r for line in lines for r in line["requests"]) == [f"req-{i}" for i in range(4)]
    assert any(len(line["requests"]) > 1 for line in lines), lines  # one execute() served several requests
    joined = sorted(requests[e["parent_id"]] for e in children)
    for line in lines:
        assert line["child_calls_traced_with"] == line["requests"][0]
        assert line["children"][CHILD]["calls"] == joined.count(line["requests"][0])  # its calls, in that trace alone
        assert line["children"][CHILD]["images"] == line["images"] == len(line["requests"])
    assert set(joined) == {line["requests"][0] for line in lines}


def test_a_probe_beside_users_requests_is_answered_from_their_run(model_repo, server_factory, tmp_path, sample_images):
    """A watchdog probe that Triton batches with a user's request into one execute() is answered
    (no outputs: the watchdog reads only whether it failed) without a run of its own, which the
    user's response would wait for: the execute() record shows the probe and no probes part."""
    server = server_factory(model_repo, tmp_path, models=(FLOW,))
    try:
        image = np.array([[sample_images["mug"]]], dtype=object)
        start = threading.Barrier(2)
        answers = {}

        def send(probe: bool) -> None:
            client = httpclient.InferenceServerClient(server.http_url)
            inp = httpclient.InferInput("IMAGE", [1, 1], "BYTES")
            inp.set_data_from_numpy(image)
            start.wait()
            answers[probe] = client.infer(FLOW, [inp], request_id="probe" if probe else "user",
                                          parameters={"bls_probe": True} if probe else None)
            client.close()

        threads = [threading.Thread(target=send, args=(p,)) for p in (False, True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert answers[False].as_numpy("ROUTE")[0, 0] == f"{CHILD}:direct".encode()
        assert answers[True].get_response()["outputs"] == []  # answered, from the user's run
        deadline = time.monotonic() + 10
        while not (lines := [ln for ln in _execute_lines(server.options.log_file) if "user" in ln["requests"]]):
            assert time.monotonic() < deadline, "no execute() line for the user's request"
            time.sleep(0.2)
        (line,) = lines
        assert line["probes"] == 1 and "probes" not in line["ms"]  # batched together, the probe not run
    finally:
        server.stop()


def test_bls_serve_as_shipped_traces_nothing(model_repo, sample_images):
    """Triton 2.51's tracer can abort tritonserver on any traced request (workarounds.py,
    "tracing abort"): bls-serve as shipped runs it with tracing off, its status port says how to
    turn a sample on, and Triton's own latency summaries count every request instead."""
    import urllib.request

    from bls_pipeline.serve.client import ClassifyClient
    from polling import eventually, get
    from test_crash_recovery import SERVING, BlsServe

    with BlsServe(model_repo, "--models", "classify_bls", "--admin-key", "k") as bls:
        bls.wait_for_line(SERVING)
        argv = open(f"/proc/{bls.tritonserver()}/cmdline", "rb").read().split(b"\0")
        assert not [a for a in argv if a.startswith(b"--trace")], argv
        request = urllib.request.Request(f"http://{bls.url('http')}/v2/trace/setting",
                                         headers={"triton-admin-key": "k"})
        with urllib.request.urlopen(request, timeout=10) as r:
            assert json.loads(r.read())["trace_level"] == ["OFF"]
        code, text = get(f"http://{bls.url('status')}/requests?slowest=1")
        assert code == 409 and "--trace-rate N" in text
        client = ClassifyClient(bls.url("grpc"), "grpc")
        for _ in range(3):
            client.classify([sample_images["mug"]])
        client.close()

        def counted() -> bool:
            with urllib.request.urlopen(f"http://{bls.url('metrics')}/metrics", timeout=10) as r:
                found = re.search(r'^nv_inference_request_summary_us_count\{model="classify_bls",version="1"\} (\d+)',
                                  r.read().decode(), re.M)
            return bool(found) and int(found.group(1)) >= 3
        eventually(counted, "Triton's latency summary counting classify_bls's requests")
        assert "request tracing is on" not in bls.output()
