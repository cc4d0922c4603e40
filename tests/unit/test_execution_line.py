"""The execute() log line (log_executions): JSON an operator joins with Triton's traces on
request ids."""

from __future__ import annotations

import json

import numpy as np

from bls_pipeline.adapter.flow_model import execution_line
from bls_pipeline.runtime.results import ChildStats, Prediction, RequestError, Timings


def test_one_line_names_every_request_the_failed_ones_and_whose_trace_the_calls_joined():
    answered = Prediction(np.array([[b"x"]] * 2, dtype=object), np.zeros((2, 1), np.float32), np.zeros((2, 1), np.int32),
                          np.array([[b"m:direct"]] * 2, dtype=object))
    timings = Timings(decode_preprocess=0.0123, classify=0.25, children={"resnet50_onnx": ChildStats(1, 2, 0.2)})
    line = execution_line("classify_bls", "classify_bls_0_1", ["a", ""], [answered, RequestError("IMAGE[0]: bad", "x")],
                          timings)
    assert "\n" not in line
    assert json.loads(line) == {
        "event": "bls_execute", "flow": "classify_bls", "instance": "classify_bls_0_1", "probe": False,
        "requests": ["a", "#1"], "images": 2, "failed": {"#1": "INVALID_ARGUMENT"}, "child_calls_traced_with": "a",
        "ms": {"decode_preprocess": 12.3, "flow": 250.0}, "children": {"resnet50_onnx": {"calls": 1, "images": 2, "ms": 200.0}}}
