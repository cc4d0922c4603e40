"""What bls-serve reads in tritonserver's log as it passes it on (serve/tritonlog.py): Triton
2.51's own lines, as it writes them."""

from __future__ import annotations

import io
import os

from bls_pipeline.serve.tritonlog import LogPump, LogWatch

FAILED = ('E1128 14:52:09.213034 41297 model_lifecycle.cc:642] "failed to load \'resnet50_onnx\' version 1: '
          'Internal: RuntimeError: [ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from model.onnx failed"')
LOADED = 'I1128 14:52:31.004183 41297 model_lifecycle.cc:839] "successfully loaded \'resnet50_onnx\'"'
FATAL = "Signal (11) received."


def test_a_failed_load_is_counted_and_kept_until_the_model_loads():
    seen = []
    watch = LogWatch(on_failure=seen.append)
    watch.read(FAILED, 1.0)
    assert watch.failures == {"resnet50_onnx": 1}
    failure = watch.failing["resnet50_onnx"]
    assert failure.version == "1" and failure.why.startswith("Internal: RuntimeError: [ONNXRuntimeError]")
    assert failure.why.endswith("Load model from model.onnx failed") and seen == [failure]
    watch.read(FAILED, 2.0)
    watch.read(LOADED, 3.0)
    assert watch.failures == {"resnet50_onnx": 2} and watch.failing == {}


def test_a_fatal_signal_is_kept_and_a_stop_is_not():
    watch = LogWatch()
    watch.read("Signal (15) received.", 1.0)
    assert watch.fatal is None
    watch.read(FATAL, 2.0)
    assert watch.fatal == FATAL


def test_the_pump_passes_every_line_on_and_reads_it():
    read_end, write_end = os.pipe()
    sink = io.BytesIO()
    watch = LogWatch()
    pump = LogPump(os.fdopen(read_end, "rb"), sink, watch)
    pump.start()
    with os.fdopen(write_end, "wb") as out:
        out.write(f"{LOADED}\n{FAILED}\nno newline at the end".encode())
    pump.join(timeout=10)
    assert not pump.is_alive()
    assert sink.getvalue().decode() == f"{LOADED}\n{FAILED}\nno newline at the end"
    assert watch.failures == {"resnet50_onnx": 1}
