"""The exported ONNX agrees with the contract that the configs and the code use."""

import onnx
import pytest

from bls_pipeline import contract

pytestmark = pytest.mark.integration


def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_exported_onnx_names_and_dims(onnx_model):
    model = onnx.load(str(onnx_model))
    (inp,), (out,) = model.graph.input, model.graph.output
    assert inp.name == contract.CLASSIFIER_INPUT.name and out.name == contract.CLASSIFIER_OUTPUT.name
    assert _dims(inp) == ["batch", *contract.CLASSIFIER_INPUT.dims]  # dynamic batch axis
    assert _dims(out) == ["batch", *contract.CLASSIFIER_OUTPUT.dims]
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
