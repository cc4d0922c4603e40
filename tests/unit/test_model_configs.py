"""Every config.pbtxt parses into Triton's ModelConfig and agrees with bls_pipeline.contract."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tritonclient.grpc import model_config_pb2

from bls_pipeline import contract
from bls_pipeline.base.tensors import TensorInfo
from bls_pipeline.stages.preprocess import IMAGENET_MEAN, IMAGENET_STD, preprocess_into
from bls_pipeline.runtime.load.children import load_child
from bls_pipeline.runtime.load.loader import load_flow
from bls_pipeline.base.modelconfig import config_variant, parse_config, string_parameters
from bls_pipeline.runtime.load.settings import parse_settings

MODELS = Path(__file__).resolve().parents[2] / "models"
# Classifiers by weights: the ONNX (CPU) and TensorRT (GPU) model of one set of weights.
SAME_WEIGHTS = {
    "resnet50": ("resnet50_onnx", "resnet50_trt"),
    "efficientnet_lite0": ("efficientnet_lite0_onnx", "efficientnet_lite0_trt"),
}
CLASSIFIERS = [name for pair in SAME_WEIGHTS.values() for name in pair]


def _dtype(spec: TensorInfo) -> int:
    return model_config_pb2.DataType.Value(f"TYPE_{spec.dtype}")


def _assert_tensors(actual, expected: tuple[TensorInfo, ...]) -> None:
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
    _assert_tensors(cfg.output, (*contract.CLASSIFY_OUTPUTS, contract.JSON))
    assert cfg.HasField("dynamic_batching")
    flow = load_flow(MODELS / "classify_bls" / "1" / "flow.py")
    _, parsed = parse_settings(string_parameters(cfg), flow.settings, "classify_bls")  # raises on unknown or bad keys
    for name in parsed.models():
        assert (MODELS / name / "config.pbtxt").exists(), f"classify_bls declares {name}, which has no config"


@pytest.mark.parametrize("name", ["classify_bls", "triage_bls", "read_text"])
def test_the_shipped_flows_answer_json_as_the_contract_says(name):
    """Each declares the JSON output (each image's answer as one document), last, with the
    contract's type and dims."""
    cfg = parse_config(MODELS / name)
    _assert_tensors(cfg.output[:4], contract.CLASSIFY_OUTPUTS)
    _assert_tensors(cfg.output[-1:], (contract.JSON,))


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_classifier_contract(name):
    cfg = parse_config(MODELS / name)
    _assert_tensors(cfg.input, (contract.CLASSIFIER_INPUT,))
    _assert_tensors(cfg.output, (contract.CLASSIFIER_OUTPUT,))
    info = load_child(MODELS, name)
    assert info.preprocess.input_shape == contract.CLASSIFIER_INPUT.dims
    assert info.is_classifier and len(info.labels) == contract.NUM_CLASSES


@pytest.mark.parametrize("weights", sorted(SAME_WEIGHTS))
def test_classifiers_share_preprocessing_with_the_same_weights(weights):
    onnx, trt = (load_child(MODELS, n) for n in SAME_WEIGHTS[weights])
    assert onnx.preprocess == trt.preprocess


@pytest.mark.parametrize("weights", sorted(SAME_WEIGHTS))
def test_onnx_and_trt_models_of_the_same_weights(weights):
    onnx_name, trt_name = SAME_WEIGHTS[weights]
    onnx, trt = parse_config(MODELS / onnx_name), parse_config(MODELS / trt_name)
    assert onnx.backend == "python" and string_parameters(onnx)["artifact"] == "model.onnx"
    assert [g.kind for g in onnx.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_CPU]
    assert trt.platform == "tensorrt_plan"
    assert [g.kind for g in trt.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_GPU]
    assert onnx.HasField("dynamic_batching") and trt.HasField("dynamic_batching")
    assert onnx.max_batch_size == trt.max_batch_size


def test_onnx_classifiers_share_one_adapter():
    """efficientnet_lite0_onnx runs resnet50_onnx's model.py: the same file, byte for byte."""
    copy = MODELS / "efficientnet_lite0_onnx" / "1" / "model.py"
    assert copy.read_bytes() == (MODELS / "resnet50_onnx" / "1" / "model.py").read_bytes()
    assert (string_parameters(parse_config(copy.parent.parent)).keys()
            == string_parameters(parse_config(MODELS / "resnet50_onnx")).keys())


def test_the_shipped_model_folders_hold_no_links():
    """A link into another folder is shared with it: `cp -r` (or a copytree that keeps links)
    of a shipped folder, then an edit of the copy's labels.txt, edited resnet50_onnx's."""
    links = sorted(str(p.relative_to(MODELS)) for p in MODELS.rglob("*") if p.is_symlink())
    assert links == []


def test_a_copied_model_folder_is_its_own(tmp_path):
    original = (MODELS / "resnet50_onnx" / "labels.txt").read_bytes()
    copy = tmp_path / "my_classifier"
    shutil.copytree(MODELS / "efficientnet_lite0_onnx", copy, symlinks=True)  # what cp -r does with links
    with open(copy / "labels.txt", "a") as labels:
        labels.write("my own label\n")
    (copy / "1" / "model.py").write_text("# mine\n")
    assert (MODELS / "resnet50_onnx" / "labels.txt").read_bytes() == original
    assert (MODELS / "resnet50_onnx" / "1" / "model.py").read_text() != "# mine\n"


@pytest.mark.parametrize("original, copies", [
    ("resnet50_onnx/labels.txt", [f"{m}/labels.txt" for m in ("resnet50_trt", "resnet50_torch", "resnet50_int8",
     "resnet50_openvino", "efficientnet_lite0_onnx", "efficientnet_lite0_trt", "efficientnet_lite0_int8",
     "efficientnet_lite0_openvino")]),
    ("resnet50_onnx/1/model.py", [f"{m}/1/model.py" for m in ("resnet50_int8", "efficientnet_lite0_onnx",
     "efficientnet_lite0_int8", "text_orientation")]),
    ("resnet50_openvino/1/model.py", ["efficientnet_lite0_openvino/1/model.py"]),
])
def test_the_copies_of_a_shared_file_stay_equal(original, copies):
    """ImageNet's labels and the engine adapters are copies: an edit of one must be made to all."""
    want = (MODELS / original).read_bytes()
    assert [c for c in copies if (MODELS / c).read_bytes() != want] == []


def test_classifier_families_have_their_own_preprocessing():
    """Same geometry, different normalisation: the spec is per classifier, not global."""
    resnet = load_child(MODELS, "resnet50_onnx").preprocess
    effnet = load_child(MODELS, "efficientnet_lite0_onnx").preprocess
    assert (effnet.resize, effnet.crop) == (resnet.resize, resnet.crop) == (256, 224)
    assert resnet.mean == IMAGENET_MEAN and resnet.std == IMAGENET_STD
    assert effnet.mean != resnet.mean and effnet.std != resnet.std
    assert effnet != resnet


def test_efficientnet_spec_is_its_training_normalisation():
    """efficientnet_lite0's weights were trained on (x - 127) / 128 of 0-255 pixels."""
    spec = load_child(MODELS, "efficientnet_lite0_onnx").preprocess
    for value in (0, 64, 127, 128, 200, 255):
        out = np.empty(spec.input_shape, np.float32)
        preprocess_into(Image.new("RGB", (300, 260), (value,) * 3), spec, out)
        np.testing.assert_allclose(out, (value - 127) / 128, atol=1e-3, err_msg=f"pixel value {value}")


def test_imagenet_normalisation_gives_efficientnet_a_different_input():
    """resnet50's mean/std on a real photo leave efficientnet's [-1, 1] training range."""
    from bls_pipeline.stages.decode import DecodePolicy, decode

    img = decode((MODELS.parent / "samples" / "mug.jpg").read_bytes(), DecodePolicy())
    inputs = {}
    for name in ("efficientnet_lite0_onnx", "resnet50_onnx"):
        inputs[name] = np.empty(contract.CLASSIFIER_INPUT.dims, np.float32)
        preprocess_into(img, load_child(MODELS, name).preprocess, inputs[name])
    right, wrong = inputs["efficientnet_lite0_onnx"], inputs["resnet50_onnx"]
    assert right.min() >= -1.0 and right.max() <= 1.0
    assert wrong.min() < -1.5 and wrong.max() > 1.5
    assert np.abs(right - wrong).mean() > 0.4


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
    from bls_pipeline.runtime.load.loader import flow_settings

    assert int(string_parameters(post)["default_topk"]) == flow_settings(MODELS / "classify_bls")[0].default_topk


def test_config_variant_renames_and_sets_parameters():
    from google.protobuf import text_format

    text = config_variant(MODELS / "classify_bls", "classify_bls_x", {"tta_threshold": "0.9", "route_recheck_s": "1"})
    cfg = text_format.Parse(text, model_config_pb2.ModelConfig())
    params = string_parameters(cfg)
    assert cfg.name == "classify_bls_x" and params["tta_threshold"] == "0.9" and params["route_recheck_s"] == "1"
    assert params["run_in_process"] == string_parameters(parse_config(MODELS / "classify_bls"))["run_in_process"]
    # still valid
    parse_settings(params, load_flow(MODELS / "classify_bls" / "1" / "flow.py").settings, "classify_bls_x")


def test_a_flows_config_sets_only_what_differs_from_its_defaults():
    """A flow's defaults live in one place: its flow.py's Settings and the runtime's. Its
    config.pbtxt carries only what differs (a copied default would drift from the code)."""
    from bls_pipeline.runtime.load.loader import is_flow_model

    flows = [d for d in sorted(MODELS.iterdir()) if is_flow_model(d)]
    assert {d.name for d in flows} >= {"classify_bls", "triage_bls", "read_text"}
    for folder in flows:
        flow = load_flow(folder / "1" / "flow.py")
        params = string_parameters(parse_config(folder))
        default_runtime, default_settings = parse_settings({}, flow.settings, folder.name)
        for key in params:
            one_runtime, one_settings = parse_settings({key: params[key]}, flow.settings, folder.name)
            assert (one_runtime, one_settings) != (default_runtime, default_settings), \
                f"{folder.name}/config.pbtxt sets {key}={params[key]!r}, its default: leave it out"
