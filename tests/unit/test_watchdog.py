"""The watchdog's pure parts: which model a dead-stub error names, and its probe request."""

from pathlib import Path

import numpy as np
import tritonclient.http as tc

from bls_pipeline.runtime.modelconfig import parse_config
from bls_pipeline.serve.watchdog import _probe_inputs, dead_stub_model

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_dead_stub_model_from_triton_messages():
    assert dead_stub_model("Stub process 'resnet50_onnx_0_0' is not healthy.") == "resnet50_onnx"
    assert dead_stub_model("classifier x failed: Stub process 'classify_bls_failover_0_12' is not healthy.") == "classify_bls_failover"
    assert dead_stub_model("Request for unknown model: 'resnet50_onnx' has no available versions") is None
    assert dead_stub_model("IMAGE[0]: not a decodable image") is None


def test_probe_for_an_image_model_is_one_small_jpeg():
    (image,) = _probe_inputs(tc, parse_config(MODELS / "classify_bls"))  # optional TOPK left out
    assert image.name() == "IMAGE" and image.shape() == [1, 1] and image.datatype() == "BYTES"


def test_probe_for_a_classifier_is_one_zero_tensor():
    (tensor,) = _probe_inputs(tc, parse_config(MODELS / "resnet50_onnx"))
    assert tensor.name() == "input" and tensor.shape() == [1, 3, 224, 224] and tensor.datatype() == "FP32"
    assert np.frombuffer(tensor._get_binary_data(), np.float32).max() == 0
