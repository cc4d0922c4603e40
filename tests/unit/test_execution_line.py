"""The execute() record (adapter/records.py): the log line of log_executions and what bls-explain
joins with Triton's traces, on request ids or on the execute()'s CLOCK_MONOTONIC bounds."""

from __future__ import annotations

import json
import os
import socket
import time

import numpy as np

from bls_pipeline.adapter.records import ExecuteTimes, RecordSink, TimedSend, execution_record, line
from bls_pipeline.runtime.results import ChildStats, Prediction, RequestError, Timings


def _answered(n: int) -> Prediction:
    return Prediction(np.array([[b"x"]] * n, dtype=object), np.zeros((n, 1), np.float32), np.zeros((n, 1), np.int32),
                      np.array([[b"m:direct"]] * n, dtype=object))


def test_one_record_names_every_request_the_failed_ones_and_whose_trace_the_calls_joined():
    times = ExecuteTimes()
    times.ms = {"read": 0.1, "decode_preprocess": 12.3, "flow": 250.0, "child_calls": 200.0, "answers": 1.0,
                "probes": 30.0, "metrics": 0.01, "responses": 0.2}
    timings = Timings(decode_preprocess=0.0123, classify=0.25,
                      children={"resnet50_onnx": ChildStats(1, 2, 0.2),
                                "efficientnet_lite0_onnx": ChildStats(1, 3, 0.01)})
    record = execution_record("classify_bls", "classify_bls_0_1", times, times.t0_ns + 300_000_000, ["a", ""],
                              [_answered(2), RequestError("IMAGE[0]: bad", "x")], timings, probes=1,
                              in_process=("efficientnet_lite0_onnx",))
    text = line(record)
    assert "\n" not in text and json.loads(text) == record
    assert record == {
        "event": "bls_execute", "flow": "classify_bls", "instance": "classify_bls_0_1", "pid": os.getpid(),
        "t0_ns": times.t0_ns, "t1_ns": times.t0_ns + 300_000_000, "requests": ["a", "#1"], "probes": 1, "images": 2,
        "failed": {"#1": "INVALID_ARGUMENT"}, "child_calls_traced_with": "a", "ms": times.ms,
        "children": {"resnet50_onnx": {"calls": 1, "images": 2, "ms": 200.0, "in_process": False},
                     "efficientnet_lite0_onnx": {"calls": 1, "images": 3, "ms": 10.0, "in_process": True}}}


def test_an_execute_of_probes_alone_has_no_users_requests():
    record = execution_record("f", "f_0_0", ExecuteTimes(), 0, [], [], None, probes=2)
    assert ((record["requests"], record["probes"], record["children"], record["child_calls_traced_with"])
            == ([], 2, {}, None))


def test_the_laps_cover_the_execute_from_its_start_to_the_last_lap():
    times = ExecuteTimes()
    time.sleep(0.002)
    times.lap("read")
    time.sleep(0.003)
    run_ms = times.lap(None)
    times.users(run_ms, Timings(decode_preprocess=0.001, classify=0.0015), child_seconds=0.001)
    time.sleep(0.001)
    times.lap("responses")
    end = time.monotonic_ns()
    parts = sum(ms for part, ms in times.ms.items() if part != "child_calls")  # child calls are within the flow
    assert abs(parts - (end - times.t0_ns) / 1e6) < 0.5
    assert times.ms["answers"] == run_ms - 1.0 - 1.5


def test_timed_send_adds_up_its_calls_until_taken():
    send = TimedSend(lambda requests: time.sleep(0.002) or list(requests))
    assert send([1]) == [1] and send([2, 3]) == [2, 3]
    assert send.take() >= 0.004 and send.take() == 0.0


def test_the_sink_sends_each_record_as_one_datagram_and_never_waits(tmp_path):
    path = str(tmp_path / "executions.sock")
    reader = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    reader.bind(path)
    sink = RecordSink(path)
    sink.send('{"event":"bls_execute"}')
    assert reader.recv(65536) == b'{"event":"bls_execute"}'
    reader.close()
    sink.send("{}")  # the reader is gone: dropped, not raised
    assert sink.dropped == 1
    sink.close()
    RecordSink(None).send("{}")  # no socket (not under bls-serve): nothing
