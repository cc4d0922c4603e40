"""An engine file against its config.pbtxt, at load (engines/artifact_io.py): the pure
comparison, real ONNX and OpenVINO files made here, and LocalFlow failing to start on a
child whose file differs, naming the model, the tensor and both sides."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from bls_pipeline.flow import LocalFlow
from bls_pipeline.engines.artifact_io import Declared, FileTensor
from bls_pipeline.base.tensors import TensorInfo
from bls_pipeline.engines.onnx import OnnxModel, OpenVinoModel
from bls_pipeline.base.errors import ConfigError

MODELS = Path(__file__).resolve().parents[2] / "models"
CLASSIFIER = Declared("clf", 8, (TensorInfo("input", "FP32", (3, 224, 224)),), (TensorInfo("output", "FP32", (1000,)),))
INPUT_OK = [FileTensor("input", "FP32", (None, 3, 224, 224))]
OUTPUT_OK = [FileTensor("output", "FP32", (None, 1000))]


def test_a_file_like_its_config_passes():
    CLASSIFIER.check("model.onnx", INPUT_OK, OUTPUT_OK)
    # A dim dynamic on either side agrees with any size.
    CLASSIFIER.check("model.onnx", [FileTensor("input", "FP32", (None, 3, None, None))], OUTPUT_OK)
    loose = Declared("det", 4, (TensorInfo("image", "UINT8", (-1, -1, 3)),), (TensorInfo("boxes", "FP32", (-1, 4)),))
    loose.check("det.onnx", [FileTensor("image", "UINT8", (None, 640, 640, 3))],
                [FileTensor("boxes", "FP32", (None, 100, 4))])


@pytest.mark.parametrize("inputs,outputs,words", [
    (INPUT_OK, [FileTensor("output", "FP32", (None, 1001))],
     "output output: its config.pbtxt declares TYPE_FP32 dims [1000], max_batch_size 8, and model.onnx has FP32 [-1, "
     "1001] (dim 0 is 1000 against 1001)"),
    (INPUT_OK, [FileTensor("output", "FP16", (None, 1000))],
     "output output: its config.pbtxt declares TYPE_FP32 dims [1000]"),
    ([FileTensor("input", "FP32", (None, 224, 224, 3))], OUTPUT_OK,
     "input input: its config.pbtxt declares TYPE_FP32 dims [3, 224, 224]"),
    ([FileTensor("input", "FP32", (1, 3, 224, 224))], OUTPUT_OK,
     "its batch dimension is fixed at 1, under max_batch_size 8"),
    ([FileTensor("input", "FP32", (None, 3, 224))], OUTPUT_OK, "3 dims against 2"),
    ([FileTensor("pixels", "FP32", (None, 3, 224, 224))], OUTPUT_OK,
     "declares input(s) input, and model.onnx has pixels (FP32 [-1, 3, 224, 224])"),
    (INPUT_OK, [FileTensor("logits", "FP32", (None, 1000))], "declares output(s) output, and model.onnx has logits"),
])
def test_a_difference_names_the_model_the_tensor_and_both_sides(inputs, outputs, words):
    with pytest.raises(ConfigError) as caught:
        CLASSIFIER.check("model.onnx", inputs, outputs)
    assert str(caught.value).startswith("model clf: ")
    assert words in str(caught.value)


def _onnx(path: Path, classes: int, dtype=None) -> Path:
    """A tiny classifier as an ONNX file: input [N,3,224,224] -> output [N, classes]."""
    onnx = pytest.importorskip("onnx", reason="making an ONNX file needs onnx (the build extra)")
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((3, classes), np.float32), "w")
    nodes = [helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[2, 3], keepdims=0),
             helper.make_node("MatMul", ["pooled", "w"], ["output"])]
    graph = helper.make_graph(nodes, "tiny",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["n", 3, 224, 224])],
                              [helper.make_tensor_value_info("output", dtype or TensorProto.FLOAT, ["n", classes])],
                              [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_onnxruntime_compares_the_file_at_load(tmp_path):
    path = _onnx(tmp_path / "model.onnx", 10)
    OnnxModel(path, ["input"], ["output"],
              declared=Declared("clf", 8, CLASSIFIER.inputs, (TensorInfo("output", "FP32", (10,)),)))
    with pytest.raises(ConfigError,
                       match=r"model clf: output output: its config\.pbtxt declares TYPE_FP32 dims \[1000\], "
                             r"max_batch_size 8, and model\.onnx has FP32 \[-1, 10\]"):
        OnnxModel(path, ["input"], ["output"], declared=CLASSIFIER)


def test_openvino_compares_the_file_at_load(tmp_path):
    ov = pytest.importorskip("openvino", reason="the OpenVINO engine needs openvino")
    onnx_path = _onnx(tmp_path / "model.onnx", 10)
    xml = tmp_path / "model.xml"
    ov.save_model(ov.convert_model(str(onnx_path)), str(xml))
    with pytest.raises(ConfigError, match=r"model clf: output output: .* and model\.xml has FP32 \[-1, 10\]"):
        OpenVinoModel(xml, ["input"], ["output"], declared=CLASSIFIER)


def test_localflow_fails_to_start_on_a_child_file_unlike_its_config(tmp_path):
    repo = tmp_path / "models"
    for name in ("classify_bls", "resnet50_onnx"):
        shutil.copytree(MODELS / name, repo / name,
                        ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.json", "__pycache__"))
    _onnx(repo / "resnet50_onnx" / "1" / "model.onnx", 10)  # its config declares 1000 classes
    params = {"cascade_classifiers": "none", "classifiers": "resnet50_onnx"}
    with pytest.raises(ConfigError,
                       match=r"model resnet50_onnx: output output: its config\.pbtxt declares TYPE_FP32 dims \[1000\], "
                             r"max_batch_size 32, and model\.onnx has FP32 \[-1, 10\]"):
        LocalFlow(repo / "classify_bls", parameters=params)
    # A stand-in for it is not checked against a file (nor is a child that is not READY).
    with LocalFlow(repo / "classify_bls", {"resnet50_onnx": lambda x: np.zeros((len(x), 1000), np.float32)},
                   parameters=params) as flow:
        assert flow.runtime.children["resnet50_onnx"].outputs[0].dims == (1000,)
