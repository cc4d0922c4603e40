"""The exported ONNX agrees with the contract that the configs and the code use."""

import onnx
import pytest

from bls_pipeline import contract

pytestmark = pytest.mark.integration


def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.mark.parametrize("artifact", ["onnx_model", "effnet_onnx_model"])  # resnet50 (random), efficientnet_lite0 (pretrained)
def test_exported_onnx_names_and_dims(artifact, request):
    model = onnx.load(str(request.getfixturevalue(artifact)))
    (inp,), (out,) = model.graph.input, model.graph.output
    assert inp.name == contract.CLASSIFIER_INPUT.name and out.name == contract.CLASSIFIER_OUTPUT.name
    assert _dims(inp) == ["batch", *contract.CLASSIFIER_INPUT.dims]  # dynamic batch axis
    assert _dims(out) == ["batch", *contract.CLASSIFIER_OUTPUT.dims]
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT


@pytest.mark.parametrize("artifact,weights", [("onnx_model", "random"), ("effnet_onnx_model", "pretrained")])
def test_export_records_the_weights_it_used(artifact, weights, request, tmp_path):
    from engine_build.export_onnx import exported_weights

    assert exported_weights(request.getfixturevalue(artifact)) == weights  # bls-demo will not serve "random"
    assert exported_weights(tmp_path / "model.onnx") is None
    (tmp_path / "model.onnx").write_bytes(b"made elsewhere")
    assert exported_weights(tmp_path / "model.onnx") == "unknown"
