"""Triton's trace files as bls-serve reads them (serve/traces.py), a request's time joined with
its execute()'s record (serve/request_join.py), and the status port's histogram (serve/status.py).
The trace entries have the shape Triton 2.51 writes (tests/integration/test_observability.py
reads real ones)."""

from __future__ import annotations

import json
import math

import pytest

from bls_pipeline.serve.request_join import explain, slowest
from bls_pipeline.serve.status import LATENCY_BOUNDS, Histogram
from bls_pipeline.serve.traces import TraceFiles, parse
from bls_pipeline.tools.explain import main as explain_main, parse_duration, render

MS = 1_000_000


def _entries(trace_id: int, model: str, request_id: str, stamps: dict[str, int],
             parent: int | None = None) -> list[dict]:
    head = {"id": trace_id, "model_name": model, "model_version": 1}
    if request_id:
        head["request_id"] = request_id
    if parent is not None:
        head["parent_id"] = parent
    return [head] + [{"id": trace_id, "timestamps": [{"name": name, "ns": ns}]} for name, ns in stamps.items()]


def _request(t0: int, queue: int, compute: int) -> dict[str, int]:
    return {"REQUEST_START": t0, "QUEUE_START": t0 + 10_000, "COMPUTE_START": t0 + queue,
            "COMPUTE_END": t0 + queue + compute, "REQUEST_END": t0 + queue + compute + 50_000}


def test_a_file_becomes_its_requests_with_their_child_calls():
    child = {"REQUEST_START": 20 * MS, "QUEUE_START": 20 * MS, "COMPUTE_START": 21 * MS, "COMPUTE_END": 90 * MS,
             "REQUEST_END": 91 * MS}
    text = json.dumps(_entries(2, "classify_bls", "req-0", _request(0, 5 * MS, 100 * MS))
                      + _entries(3, "resnet50_onnx", "", child, 2))
    (trace,) = parse(text)
    assert ((trace.model, trace.request_id, trace.span_ms("QUEUE_START", "COMPUTE_START"))
            == ("classify_bls", "req-0", 4.99))
    assert [c.model for c in trace.children] == ["resnet50_onnx"] and not trace.refused


# How Triton 2.51 traces a request that left its queue unserved, over HTTP and gRPC alike
# (tests/integration/test_outcomes.py sees each on a real server).
_FULL = {"REQUEST_START": 0, "QUEUE_START": 5}  # "Exceeds maximum queue size": never taken in, never released
_TIMED_OUT = {"REQUEST_START": 0, "QUEUE_START": 5, "INFER_RESPONSE_COMPLETE": 900 * MS, "REQUEST_END": 900 * MS + 5}
_CANCELLED = {"REQUEST_START": 0, "QUEUE_START": 5, "REQUEST_END": 700 * MS}  # its client gone: no response sent


def test_how_a_request_left_the_queue_unserved_is_read_from_its_trace():
    unserved = {name: parse(json.dumps(_entries(4, "classify_bls", "r", stamps)))[0]
                for name, stamps in (("full", _FULL), ("timed out", _TIMED_OUT), ("cancelled", _CANCELLED))}
    assert {name: (t.unserved, t.refused) for name, t in unserved.items()} == {
        "full": ("queue_full", True), "timed out": ("queue_timeout", True), "cancelled": ("cancelled", False)}
    assert unserved["full"].span_ms("REQUEST_START", "REQUEST_END") is None
    (answered,) = parse(json.dumps(_entries(5, "classify_bls", "a",
                                            {**_request(0, MS, MS), "INFER_RESPONSE_COMPLETE": 3 * MS})))
    # computed, its client gone by the end
    (gone_after,) = parse(json.dumps(_entries(6, "classify_bls", "g", _request(0, MS, MS))))
    assert (answered.unserved, gone_after.unserved, answered.refused) == (None, None, False)


def test_each_file_is_read_once_whole_and_removed_when_owned(tmp_path):
    prefix = tmp_path / "trace.json"
    (tmp_path / "trace.json.0").write_text(json.dumps(_entries(1, "m", "a", _request(0, MS, MS))))
    (tmp_path / "trace.json.1").write_text('[{"id": 2, "model_na')  # being written
    files = TraceFiles(prefix, remove=True)
    assert [t.request_id for t in files.read_new()] == ["a"]
    assert not (tmp_path / "trace.json.0").exists() and (tmp_path / "trace.json.1").exists()
    (tmp_path / "trace.json.1").write_text(json.dumps(_entries(2, "m", "b", _request(0, MS, MS))))
    assert [t.request_id for t in files.read_new()] == ["b"] and files.read_new() == []
    kept = TraceFiles(prefix, remove=False)
    (tmp_path / "trace.json.2").write_text(json.dumps(_entries(3, "m", "c", _request(0, MS, MS))))
    # the user's file stays, read once
    assert [t.request_id for t in kept.read_new()] == ["c"] and kept.read_new() == []
    assert (tmp_path / "trace.json.2").exists()


def test_a_file_that_never_parses_is_given_up(tmp_path):
    (tmp_path / "trace.json.0").write_text("[{")
    files = TraceFiles(tmp_path / "trace.json", remove=True, patience_s=0.0)
    assert files.read_new() == [] and files.unreadable == 1 and not (tmp_path / "trace.json.0").exists()


def _record(t0: int, t1: int, requests: list[str], probes: int = 0) -> dict:
    return {"event": "bls_execute", "flow": "classify_bls", "instance": "classify_bls_0_1", "pid": 4242, "t0_ns": t0,
            "t1_ns": t1, "requests": requests, "probes": probes, "images": len(requests), "failed": {},
            "child_calls_traced_with": requests[0],
            "ms": {"read": 0.5, "decode_preprocess": 10.0, "flow": 60.0, "child_calls": 55.0, "answers": 2.0,
                   **({"probes": 20.0} if probes else {}), "metrics": 0.5, "responses": 1.0},
            "children": {"resnet50_onnx": {"calls": 1, "images": 2, "ms": 55.0, "in_process": False}}}


def test_a_request_is_explained_by_the_record_of_its_execute_part_by_part():
    """Two requests of one execute() (the second's trace holds no child call: the first's does),
    and another execute() of another instance at the same time."""
    start = 1_000 * MS
    first = _entries(2, "classify_bls", "req-0", _request(start, 5 * MS, 96 * MS))
    call = {"REQUEST_START": start + 20 * MS, "QUEUE_START": start + 20 * MS, "COMPUTE_START": start + 22 * MS,
            "COMPUTE_END": start + 70 * MS, "REQUEST_END": start + 71 * MS}
    traces = parse(json.dumps(first + _entries(3, "resnet50_onnx", "", call, 2)
                              + _entries(4, "classify_bls", "req-1", _request(start + MS, 4 * MS, 96 * MS))))
    second = next(t for t in traces if t.request_id == "req-1")
    records = [_record(start + 6 * MS, start + 100 * MS, ["req-0", "req-1"], probes=1),
               _record(start + 7 * MS, start + 60 * MS, ["other"])]
    found = explain(second, records, traces)
    assert found["execute"]["requests"] == ["req-0", "req-1"] and found["queue_ms"] == 4.0
    parts = {p["part"]: p for p in found["parts"]}
    assert parts["to the stub"]["ms"] == 1.0 and parts["back to Triton"]["ms"] == 1.0
    assert parts["probes"]["ms"] == 20.0 and "1 watchdog probe(s)" in parts["probes"]["note"]
    assert (parts["child resnet50_onnx"]["level"] == 1
            and "in Triton: queue 2.0 ms, compute 48.0 ms" in parts["child resnet50_onnx"]["note"])
    assert parts["flow's own code"]["ms"] == 5.0
    assert parts["unmeasured in execute()"]["ms"] == 0.0  # 94 ms of execute(): 0.5 + 10 + 60 + 2 + 20 + 0.5 + 1
    assert found["covered"] == pytest.approx(1.0)
    assert sum(p["ms"] for p in found["parts"] if p["level"] == 0) == pytest.approx(found["compute_ms"])


def test_a_request_the_flow_sent_no_record_for_says_so():
    (trace,) = parse(json.dumps(_entries(2, "classify_bls", "", _request(0, MS, 10 * MS))))
    found = explain(trace, [])
    assert found["covered"] is None and "no record" in found["parts"][0]["note"]


def test_slowest_ranks_by_time_in_triton_and_leaves_out_the_probes():
    traces = parse(json.dumps(_entries(1, "m", "a", _request(0, MS, MS))
                              + _entries(2, "m", "b", _request(0, MS, 9 * MS))
                              + _entries(3, "m", "bls_probe", _request(0, MS, 99 * MS))))
    assert [t.request_id for t in slowest(traces, 2, exclude_ids=("bls_probe",))] == ["b", "a"]


def test_the_histogram_is_prometheus_s_cumulative_buckets_sum_and_count():
    h = Histogram((0.1, 1.0))
    for value in (0.05, 0.5, 0.5, 7.0):
        h.observe(value)
    assert h.lines("x_seconds", 'model="m"') == [
        'x_seconds_bucket{model="m",le="0.1"} 1', 'x_seconds_bucket{model="m",le="1"} 3',
        'x_seconds_bucket{model="m",le="+Inf"} 4', 'x_seconds_sum{model="m"} 8.050000', 'x_seconds_count{model="m"} 4']


def test_the_latency_bounds_are_fine_enough_for_a_quantile_within_a_few_percent():
    assert LATENCY_BOUNDS[0] == 0.001 and LATENCY_BOUNDS[-1] == 82.0 and len(LATENCY_BOUNDS) == 60
    assert max(b / a for a, b in zip(LATENCY_BOUNDS, LATENCY_BOUNDS[1:])) <= 1.25 + 1e-9
    assert all(math.isfinite(b) for b in LATENCY_BOUNDS)


def test_bls_explain_prints_each_part_under_the_compute_with_the_stubs_pid():
    start = 1_000 * MS
    traces = parse(json.dumps(_entries(2, "classify_bls", "req-0", _request(start, 5 * MS, 96 * MS))))
    text = render(explain(traces[0], [_record(start + 6 * MS, start + 100 * MS, ["req-0"])], traces))
    lines = text.splitlines()
    assert lines[0] == "classify_bls request req-0 (trace 2): 101.0 ms in Triton"
    assert lines[2].startswith("  compute") and "classify_bls_0_1 (pid 4242), one execute() of 1 request(s)" in lines[2]
    assert [ln.split()[0] for ln in lines[3:6]] == ["to", "read", "decode_preprocess"]
    assert any(ln.startswith("      child resnet50_onnx") for ln in lines)  # within the flow, indented under it
    # 94 ms of execute(), 74 of them in its parts: 20 unmeasured, and the share of the compute says so.
    assert ([ln.split()[-1] for ln in lines if "unmeasured" in ln] == ["took"]
            and "20.0" in next(ln for ln in lines if "unmeasured" in ln))
    assert lines[-2] == "    (the measured parts: 79.2% of the compute)" and lines[-1].startswith("  response")


def test_bls_explain_says_whether_triton_refused_a_request_or_its_client_had_gone():
    said = {}
    for name, stamps in (("full", _FULL), ("timed out", _TIMED_OUT), ("cancelled", _CANCELLED)):
        (trace,) = parse(json.dumps(_entries(4, "classify_bls", "r", stamps)))
        said[name] = render(explain(trace, [])).splitlines()[1:]
    assert said == {
        "full": ["  refused by Triton's queue, full (Exceeds maximum queue size): the model never saw it"],
        "timed out": ["  refused by Triton's queue once it waited out its timeout (Request timeout expired): the model "
                      "never saw it"],
        "cancelled": ["  its client had gone (cancelled, or its gRPC deadline passed) while it waited in Triton's "
                      "queue: dropped there, not refused; the model never saw it"]}
    (trace,) = parse(json.dumps(_entries(4, "classify_bls", "r", _CANCELLED)))
    assert explain(trace, [])["unserved"] == "cancelled" and explain(trace, [])["refused"] is False


def test_the_status_port_counts_users_requests_refusals_and_cancellations_apart(tmp_path):
    """A user's request, the watchdog's probe, a child call written apart from its caller, a
    request Triton's queue refused as full, one it refused once its timeout passed, and two
    whose client had gone while queued: the histogram counts the first, the refusals the two
    refused by their reason, the cancellations the last two, in a series of their own."""
    from bls_pipeline.serve.admin import RepositoryAdmin
    from bls_pipeline.serve.model_index import ModelStates
    from bls_pipeline.serve.status import StatusServer

    files = [_entries(1, "classify_bls", "user", _request(0, MS, 40 * MS)),
             _entries(2, "classify_bls", "bls_probe", _request(0, MS, 40 * MS)),
             _entries(3, "resnet50_onnx", "", _request(0, MS, 30 * MS), parent=99),
             _entries(4, "classify_bls", "late", _FULL),
             _entries(5, "classify_bls", "waited", _TIMED_OUT),
             _entries(6, "classify_bls", "gone", _CANCELLED) + _entries(7, "classify_bls", "gone too", _CANCELLED)]
    for i, entries in enumerate(files):
        (tmp_path / f"trace.json.{i}").write_text(json.dumps(entries))
    status = StatusServer("127.0.0.1", 0, ModelStates(RepositoryAdmin("127.0.0.1:1", "key")), "127.0.0.1:1",
                          tmp_path / "trace.json", own_traces=True, records_path=tmp_path / "records.sock",
                          ready_for=("classify_bls",))
    status.collect()
    text = status.metrics()
    assert 'bls_request_duration_seconds_count{model="classify_bls"} 1' in text
    assert 'bls_request_duration_seconds_bucket{model="classify_bls",le="0.047"} 1' in text  # 41.05 ms
    assert 'bls_request_duration_seconds_bucket{model="classify_bls",le="0.039"} 0' in text
    assert "resnet50_onnx" not in text
    assert 'bls_refused_requests_total{model="classify_bls",reason="queue_full"} 1' in text
    assert 'bls_refused_requests_total{model="classify_bls",reason="queue_timeout"} 1' in text
    assert 'bls_queue_cancelled_requests_total{model="classify_bls"} 2' in text
    assert ("# HELP bls_queue_cancelled_requests_total " in text
            and "# TYPE bls_queue_cancelled_requests_total counter" in text)
    assert list(tmp_path.glob("trace.json.*")) == []  # its own folder: read and removed


def test_slowest_keeps_to_a_model_and_a_time_window():
    """--model and --since: a slow request of another model, or one from an earlier run, is not
    among the slowest."""
    traces = parse(json.dumps(_entries(1, "m", "old", _request(0, MS, 99 * MS))
                              + _entries(2, "m", "new", _request(100 * MS, MS, 5 * MS))
                              + _entries(3, "other", "x", _request(100 * MS, MS, 50 * MS))
                              + _entries(4, "m", "newer", _request(200 * MS, MS, 2 * MS))))
    assert [t.request_id for t in slowest(traces, 3)] == ["old", "x", "new"]
    assert [t.request_id for t in slowest(traces, 3, model="m")] == ["old", "new", "newer"]
    assert [t.request_id for t in slowest(traces, 3, model="m", since_ns=100 * MS)] == ["new", "newer"]
    assert slowest(traces, 3, model="absent") == []


@pytest.mark.parametrize(("text", "seconds"),
                         [("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("1.5m", 90.0), ("250ms", 0.25)])
def test_a_duration_is_a_number_and_a_unit(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5", "5x", "m", "-5m", "0s", "", "5 minutes"])
def test_a_bad_duration_says_what_to_write(text, capsys):
    with pytest.raises(SystemExit) as exc:
        explain_main(["--slowest", "3", f"--since={text}"])
    assert exc.value.code == 2
    assert f"--since: {text!r} is not a duration: write a number above 0 and a unit (ms, s, m, h), e.g. 30s, 5m, 1h" \
        in capsys.readouterr().err


def test_the_status_port_answers_the_slowest_of_a_model_in_a_window(tmp_path, capsys):
    """bls-explain --slowest N --since D --model M against the status port: Triton's timestamps
    are on this process's monotonic clock, so a request 10 minutes old is outside --since 5m."""
    import time

    from bls_pipeline.serve.admin import RepositoryAdmin
    from bls_pipeline.serve.model_index import ModelStates
    from bls_pipeline.serve.status import StatusServer

    now = time.monotonic_ns()
    files = [_entries(1, "classify_bls", "ten-minutes-ago", _request(now - 600_000 * MS, MS, 900 * MS)),
             _entries(2, "classify_bls", "just-now", _request(now - 1_000 * MS, MS, 20 * MS)),
             _entries(3, "triage_bls", "just-now-elsewhere", _request(now - 1_000 * MS, MS, 300 * MS))]
    for i, entries in enumerate(files):
        (tmp_path / f"trace.json.{i}").write_text(json.dumps(entries))
    status = StatusServer("127.0.0.1", 0, ModelStates(RepositoryAdmin("127.0.0.1:1", "key")), "127.0.0.1:1",
                          tmp_path / "trace.json", own_traces=True, records_path=tmp_path / "r.sock",
                          ready_for=("classify_bls",), states_every_s=3600)
    status.start()
    try:
        address = "127.0.0.1:%d" % status._http.server_address[1]
        assert explain_main(["--status", address, "--slowest", "5", "--json"]) == 0
        assert [f["request_id"] for f in json.loads(capsys.readouterr().out)] == [
            "ten-minutes-ago", "just-now-elsewhere", "just-now"]
        assert (explain_main(["--status", address, "--slowest", "5", "--since", "5m", "--model", "classify_bls",
                              "--json"]) == 0)
        assert [f["request_id"] for f in json.loads(capsys.readouterr().out)] == ["just-now"]
        assert explain_main(["--status", address, "--slowest", "5", "--since", "5m", "--model", "read_text"]) == 1
        assert capsys.readouterr().err == "no request of read_text in the last 5m traced\n"
        assert explain_main(["--status", address, "--request", "ten-minutes-ago", "--since", "1m"]) == 1
        assert capsys.readouterr().err == "no such request among the recent ones in the last 1m\n"
    finally:
        status.stop()
