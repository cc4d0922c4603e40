"""A torch classifier -> models/<name>_torch/1/model.pt: the state dict the *_torch model serves.

The weights are the ONNX export's (`--weights` means the same for both commands), so
resnet50_torch answers as resnet50_onnx does, within FP16 rounding on the GPU. The file is
written atomically with a stamp of its weights beside it (model.pt.json, as the ONNX has),
after it was loaded back the way the server loads it (engines/torch_classifier.py, FP32 on
the CPU) and compared with the model it came from, and with the exported ONNX when that
carries the same weights.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bls_pipeline.contract import CLASSIFIER_INPUT, CLASSIFIER_OUTPUT

from bls_pipeline.engines.artifact_io import exported_weights, stamp_path

from .export_onnx import _require_torch

__all__ = ["TorchExport", "export_state_dict"]

log = logging.getLogger(__name__)


class TorchExport(dict):
    """What export_state_dict checked: max abs differences of the reloaded file's logits
    against the model ("torch") and against the ONNX file ("onnx", None when not compared)."""


def export_state_dict(model, output: Path, weights: str, architecture: str, onnx_path: Path | None = None,
                      check_batch: int = 2) -> TorchExport:
    torch, _ = _require_torch()
    from bls_pipeline.engines.torch_classifier import TorchClassifier, TorchSettings

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    compare_onnx = onnx_path is not None and exported_weights(onnx_path) == weights
    steps = tqdm(total=3 if compare_onnx else 2, desc=f"export {output.name}", unit="step")
    tmp = output.with_suffix(".pt.tmp")
    tmp_stamp = tmp.with_suffix(".tmp.json")
    torch.save(model.state_dict(), tmp)
    tmp_stamp.write_text(json.dumps({"weights": weights}))
    steps.update()
    try:
        served = TorchClassifier(tmp, TorchSettings(artifact=tmp.name, architecture=architecture, precision="fp32"),
                                 "cpu", max_batch_size=check_batch, input_shape=CLASSIFIER_INPUT.dims)
        x = np.random.default_rng(2).standard_normal((check_batch, *CLASSIFIER_INPUT.dims), dtype=np.float32)
        with torch.no_grad():
            expected = model(torch.from_numpy(x)).numpy()
        got = served(served.as_input(x)).numpy()
        result = TorchExport(torch=float(np.abs(got - expected).max()), onnx=None)
        scale = max(1.0, float(np.abs(expected).max()))
        if result["torch"] > 1e-4 * scale:
            raise RuntimeError(f"{output.name} loaded back differs from the model by {result['torch']:.3g}: the export "
                               "is wrong")
        steps.update()
        if compare_onnx:
            import onnxruntime as ort

            session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
            onnx_out = session.run([CLASSIFIER_OUTPUT.name], {CLASSIFIER_INPUT.name: x})[0]
            result["onnx"] = float(np.abs(got - onnx_out).max())
            if result["onnx"] > 1e-3 * scale:
                raise RuntimeError(f"{output.name} and {onnx_path} carry the same weights ({weights}) but differ by "
                                   f"{result['onnx']:.3g}: re-export both")
            steps.update()
    except BaseException:
        tmp.unlink(missing_ok=True)
        tmp_stamp.unlink(missing_ok=True)
        raise
    finally:
        steps.close()
    tmp.replace(output)  # atomic: a half-written model.pt never appears
    tmp_stamp.replace(stamp_path(output))
    return result
