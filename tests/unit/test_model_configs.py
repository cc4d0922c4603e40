"""Every config.pbtxt parses into Triton's ModelConfig and agrees with bls_pipeline.contract."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from bls_pipeline import contract
from bls_pipeline.config import load_classifier_info, parse_pipeline_config
from bls_pipeline.repository import parse_config, string_parameters

MODELS = Path(__file__).resolve().parents[2] / "models"
CLASSIFIERS = ["resnet50_onnx", "resnet50_trt"]


def _dtype(spec: contract.TensorSpec) -> int:
    return model_config_pb2.DataType.Value(f"TYPE_{spec.dtype}")


def _assert_tensors(actual, expected: tuple[contract.TensorSpec, ...]) -> None:
    assert [t.name for t in actual] == [s.name for s in expected]
    for tensor, spec in zip(actual, expected):
        assert tensor.data_type == _dtype(spec), tensor.name
        assert tuple(tensor.dims) == spec.dims, tensor.name
        assert getattr(tensor, "optional", False) == spec.optional, tensor.name


@pytest.mark.parametrize("model_dir", sorted(p.parent for p in MODELS.glob("*/config.pbtxt")), ids=lambda p: p.name)
def test_config_parses_with_matching_name(model_dir):
    cfg = parse_config(model_dir)
    assert cfg.name == model_dir.name
    assert cfg.max_batch_size > 0
    if cfg.backend == "python":
        assert (model_dir / "1" / "model.py").exists()


def test_classify_bls_contract():
    cfg = parse_config(MODELS / "classify_bls")
    _assert_tensors(cfg.input, contract.CLASSIFY_INPUTS)
    _assert_tensors(cfg.output, contract.CLASSIFY_OUTPUTS)
    assert cfg.HasField("dynamic_batching")
    parsed = parse_pipeline_config(string_parameters(cfg))  # raises on unknown or bad keys
    for name in parsed.classifiers:
        assert (MODELS / name / "config.pbtxt").exists(), f"classifiers names {name}, which has no config"


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_classifier_contract(name):
    cfg = parse_config(MODELS / name)
    _assert_tensors(cfg.input, (contract.CLASSIFIER_INPUT,))
    _assert_tensors(cfg.output, (contract.CLASSIFIER_OUTPUT,))
    info = load_classifier_info(MODELS, name)
    assert info.preprocess.input_shape == contract.CLASSIFIER_INPUT.dims


def test_classifiers_share_preprocessing_with_the_same_weights():
    onnx, trt = (load_classifier_info(MODELS, n) for n in CLASSIFIERS)
    assert onnx.preprocess == trt.preprocess


def test_ensemble_baseline_contract():
    cfg = parse_config(MODELS / "ensemble_resnet50")
    _assert_tensors(cfg.input, (contract.IMAGE,))
    _assert_tensors(cfg.output, (contract.LABELS, contract.SCORES, contract.CLASS_IDS))
    steps = [s.model_name for s in cfg.ensemble_scheduling.step]
    assert steps == ["ensemble_preprocess", "resnet50_onnx", "ensemble_postprocess"]
    pre, post = parse_config(MODELS / "ensemble_preprocess"), parse_config(MODELS / "ensemble_postprocess")
    _assert_tensors(pre.output, (contract.CLASSIFIER_INPUT,))
    _assert_tensors(post.input, (contract.CLASSIFIER_OUTPUT,))
    # Same default top-k as classify_bls, so the two answer alike.
    assert string_parameters(post)["default_topk"] == string_parameters(parse_config(MODELS / "classify_bls"))["default_topk"]
