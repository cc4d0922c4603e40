"""The exported ONNX agrees with the contract that the configs and the code use, and computes
what the torch model computes."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from bls_pipeline import contract
from bls_pipeline.stages.decode import decode
from bls_pipeline.stages.postprocess import softmax
from bls_pipeline.stages.preprocess import PreprocessSpec, preprocess_into

pytestmark = pytest.mark.integration


def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


# resnet50 (random), efficientnet_lite0 (pretrained)
@pytest.mark.parametrize("artifact", ["onnx_model", "effnet_onnx_model"])
def test_exported_onnx_names_and_dims(artifact, request):
    model = onnx.load(str(request.getfixturevalue(artifact)))
    (inp,), (out,) = model.graph.input, model.graph.output
    assert inp.name == contract.CLASSIFIER_INPUT.name and out.name == contract.CLASSIFIER_OUTPUT.name
    assert _dims(inp) == ["batch", *contract.CLASSIFIER_INPUT.dims]  # dynamic batch axis
    assert _dims(out) == ["batch", *contract.CLASSIFIER_OUTPUT.dims]
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT


@pytest.mark.parametrize("artifact,weights", [("onnx_model", "random"), ("effnet_onnx_model", "pretrained")])
def test_export_records_the_weights_it_used(artifact, weights, request, tmp_path):
    from bls_pipeline.engines.artifact_io import exported_weights

    assert exported_weights(request.getfixturevalue(artifact)) == weights  # bls-demo will not serve "random"
    assert exported_weights(tmp_path / "model.onnx") is None
    (tmp_path / "model.onnx").write_bytes(b"made elsewhere")
    assert exported_weights(tmp_path / "model.onnx") == "unknown"


# onnxruntime against torch, both float32 on CPU: max |logit difference| within this share of
# the largest logit (measured: 4e-7 for resnet50's random weights, 8e-7 for efficientnet_lite0).
PARITY_RTOL = 1e-5
PARITY = [("onnx_model", "resnet50", "random"), ("effnet_onnx_model", "efficientnet_lite0", "pretrained")]


@pytest.mark.parametrize("artifact,model,weights", PARITY, ids=["resnet50", "efficientnet_lite0"])
def test_exported_onnx_computes_what_torch_computes(artifact, model, weights, request, sample_images):
    """The file the tests serve against a torch model built afresh with the same weights,
    on noise and on the sample photos preprocessed: export_onnx's own check is not trusted."""
    import torch

    from engine_build.export_onnx import build_torch_model

    photos = [sample_images[n] for n in ("mug", "coffee", "chelsea")]
    batch = np.empty((len(photos), *contract.CLASSIFIER_INPUT.dims), np.float32)
    for i, data in enumerate(photos):
        preprocess_into(decode(data), PreprocessSpec(), batch[i])
    noise = np.random.default_rng(7).standard_normal((2, *contract.CLASSIFIER_INPUT.dims), dtype=np.float32)
    inputs = np.concatenate([noise, batch])

    with torch.no_grad():
        expected = build_torch_model(weights, model)(torch.from_numpy(inputs)).numpy()
    session = ort.InferenceSession(str(request.getfixturevalue(artifact)), providers=["CPUExecutionProvider"])
    (got,) = session.run([contract.CLASSIFIER_OUTPUT.name], {contract.CLASSIFIER_INPUT.name: inputs})

    scale = float(np.abs(expected).max())
    diff = float(np.abs(got - expected).max())
    assert (diff <= PARITY_RTOL * max(1.0, scale)), (f"{model}: onnxruntime differs from torch by {diff:.3g} (largest "
                                                     f"logit {scale:.3g})")
    np.testing.assert_array_equal(got.argmax(axis=1), expected.argmax(axis=1))
    np.testing.assert_allclose(softmax(got), softmax(expected), atol=1e-5)
