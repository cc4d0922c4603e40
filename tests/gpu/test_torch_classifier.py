"""resnet50_torch's classifier on CUDA, in process: FP16 channels-last against onnxruntime on
the same exported weights, and its CUDA-graph option against the plain run."""

from __future__ import annotations

import numpy as np
import pytest

from bls_pipeline.engines.torch_classifier import TorchClassifier, TorchSettings

pytestmark = pytest.mark.gpu
REQUIRES = ("cuda",)


@pytest.fixture(scope="module")
def batch():
    return np.random.default_rng(3).standard_normal((5, 3, 224, 224), dtype=np.float32)


@pytest.fixture(scope="module")
def reference(onnx_reference, batch):
    return onnx_reference.run(["output"], {"input": batch})[0]


@pytest.mark.parametrize("settings",
                         [TorchSettings(), TorchSettings(precision="fp32"), TorchSettings(cuda_graphs=True)],
                         ids=["fp16", "fp32", "fp16+cuda_graphs"])
def test_the_gpu_classifier_matches_onnxruntime(resnet50_artifacts, batch, reference, settings):
    model = TorchClassifier(resnet50_artifacts["torch"], settings, "cuda:0", max_batch_size=4)  # 5 rows: two chunks
    logits = model(model.as_input(batch))
    assert logits.is_cuda and str(logits.dtype) == "torch.float32"
    got = logits.cpu().numpy()
    scale = max(1.0, float(np.abs(reference).max()))
    # fp16: about 3 significant digits through 50 layers; fp32 convolutions run in TF32 on
    # tensor cores by default (cuDNN), about as precise.
    tolerance = 2e-2
    print(f"{settings}: max abs diff {np.abs(got - reference).max():.4f} at scale {scale:.1f}")
    assert np.abs(got - reference).max() <= tolerance * scale
    assert np.array_equal(got.argmax(1), reference.argmax(1))
