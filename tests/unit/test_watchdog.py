"""The watchdog's pure parts: which model a dead-stub error names, and its probe request."""

from pathlib import Path

import numpy as np
import tritonclient.http as tc

from bls_pipeline.runtime.modelconfig import parse_config
from bls_pipeline.serve import watchdog
from bls_pipeline.serve.processes import stub_instances
from bls_pipeline.serve.watchdog import Watchdog, _probe_inputs, dead_stub_model, instance_names

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


def test_instance_names_follow_the_config():
    assert instance_names("classify_bls", parse_config(MODELS / "classify_bls")) == {"classify_bls_0_0", "classify_bls_0_1"}
    assert instance_names("resnet50_onnx", parse_config(MODELS / "resnet50_onnx")) == {"resnet50_onnx_0_0"}


def test_a_model_with_one_of_its_stubs_gone_is_lost(monkeypatch):
    configs = {m: parse_config(MODELS / m) for m in ("classify_bls", "resnet50_onnx")}
    dog = Watchdog("127.0.0.1:1", configs, reload=lambda m: None, pgid=12345)
    monkeypatch.setattr(watchdog, "stub_instances", lambda pgid: {11: "classify_bls_0_1", 12: "resnet50_onnx_0_0"})
    assert dog._lost_stubs() == ["classify_bls"]
    monkeypatch.setattr(watchdog, "stub_instances", lambda pgid: {11: "classify_bls_0_0", 12: "classify_bls_0_1"})
    assert dog._lost_stubs() == []  # resnet50_onnx's only stub gone: left to the inference probe
    dog._client.close()


def test_stub_instances_of_a_group_with_none_is_empty():
    import os

    assert stub_instances(os.getpgrp()) == {}  # pytest's own group runs no stub
