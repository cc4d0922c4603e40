"""torchvision resnet50 -> models/resnet50_onnx/1/model.onnx (dynamic batch, input/output)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bls_pipeline.contract import CLASSIFIER_INPUT, CLASSIFIER_OUTPUT

__all__ = ["WeightsUnavailable", "build_torch_model", "export_onnx"]

log = logging.getLogger(__name__)
RANDOM_SEED = 0
OPSET = 17


class WeightsUnavailable(RuntimeError):
    """Pretrained weights could not be obtained (no network, bad file)."""


def _require_torch():
    try:
        import torch
        import torchvision
    except ImportError as exc:
        raise ImportError("export needs torch and torchvision: pip install 'bls-pipeline[build]'") from exc
    return torch, torchvision


def build_torch_model(weights: str):
    """resnet50 in eval mode. weights: 'imagenet', 'random' (seeded) or a .pth state dict path."""
    torch, torchvision = _require_torch()
    if weights == "random":
        torch.manual_seed(RANDOM_SEED)
        return torchvision.models.resnet50(weights=None).eval()
    if weights == "imagenet":
        try:
            # V1: trained for the 256/224 eval transform that bls_pipeline.preprocess implements.
            return torchvision.models.resnet50(weights=torchvision.models.ResNet50_Weights.IMAGENET1K_V1).eval()
        except Exception as exc:  # noqa: BLE001 - URLError, HTTPError, SSL errors, hash mismatch
            raise WeightsUnavailable(f"could not download torchvision's ImageNet weights for resnet50 ({type(exc).__name__}: {exc})") from exc
    path = Path(weights)
    if not path.is_file():
        raise WeightsUnavailable(f"--weights {weights!r}: not 'imagenet', 'random' or an existing .pth file")
    model = torchvision.models.resnet50(weights=None)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state.get("state_dict", state) if isinstance(state, dict) else state)
    except Exception as exc:  # noqa: BLE001
        raise WeightsUnavailable(f"{path} is not a resnet50 state dict: {exc}") from exc
    return model.eval()


def export_onnx(model, output: Path, check_batch: int = 2) -> float:
    """Export, run onnx.checker, compare onnxruntime with torch. Returns the max abs diff."""
    torch, _ = _require_torch()
    import onnx
    import onnxruntime as ort

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    steps = tqdm(total=3, desc=f"export {output.name}", unit="step")
    example = torch.randn(1, *CLASSIFIER_INPUT.dims)
    tmp = output.with_suffix(".onnx.tmp")
    torch.onnx.export(
        model, (example,), str(tmp),
        input_names=[CLASSIFIER_INPUT.name], output_names=[CLASSIFIER_OUTPUT.name],
        dynamic_axes={CLASSIFIER_INPUT.name: {0: "batch"}, CLASSIFIER_OUTPUT.name: {0: "batch"}},
        opset_version=OPSET, dynamo=False,
    )
    steps.update()
    onnx.checker.check_model(str(tmp), full_check=True)
    steps.update()
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((check_batch, *CLASSIFIER_INPUT.dims), dtype=np.float32))
    with torch.no_grad():
        expected = model(x).numpy()
    session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    got = session.run([CLASSIFIER_OUTPUT.name], {CLASSIFIER_INPUT.name: x.numpy()})[0]
    diff = float(np.abs(got - expected).max())
    scale = float(np.abs(expected).max()) or 1.0
    steps.update()
    steps.close()
    if diff > 1e-3 * max(1.0, scale):
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"onnxruntime output differs from torch by {diff:.3g} (scale {scale:.3g}): export is wrong")
    tmp.replace(output)  # atomic: a half-written model.onnx never appears
    return diff
