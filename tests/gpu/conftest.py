"""GPU tests: marked `gpu`, skipped with the reason where this machine cannot run them.

Each module says what it needs in REQUIRES: "cuda" (torch sees a CUDA GPU), "tensorrt"
(TensorRT's Python package), "server" (nvidia-pytriton's tritonserver). scripts/gpu/run.sh
runs them with BLS_TEST_MODELS naming a model repository that holds resnet50 exported with
random weights (ONNX and torch state dict); without it they export their own.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest


def _why_not(need: str) -> str | None:
    if need == "cuda":
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed"
        import torch

        if not torch.cuda.is_available():
            return "no CUDA GPU visible (torch.cuda.is_available() is False)"
    if need == "tensorrt" and importlib.util.find_spec("tensorrt") is None:
        return "TensorRT's Python package is not installed (it ships in NGC tritonserver images)"
    if need == "server" and importlib.util.find_spec("pytriton") is None and shutil.which("tritonserver") is None:
        return "no tritonserver (nvidia-pytriton's wheel, or one on PATH)"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("gpu") is None:  # not `"gpu" in item.keywords`: that is this folder's name too
            continue
        needs = getattr(item.module, "REQUIRES", ("cuda",))
        reason = next((why for why in map(_why_not, needs) if why), None)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def resnet50_artifacts(tmp_path_factory) -> dict[str, Path | None]:
    """resnet50 with seeded random weights: {"torch": model.pt, "onnx": model.onnx or None},
    stamped. The ONNX is None where it could not be exported (onnxruntime checks the export:
    a machine whose onnxruntime does not import still tests the rest)."""
    given = os.environ.get("BLS_TEST_MODELS")
    if given:
        torch_path = Path(given) / "resnet50_torch" / "1" / "model.pt"
        onnx_path = Path(given) / "resnet50_onnx" / "1" / "model.onnx"
        if torch_path.exists():
            return {"torch": torch_path, "onnx": onnx_path if onnx_path.exists() else None}
    from engine_build.export_onnx import build_torch_model, export_onnx
    from engine_build.export_torch import export_state_dict

    folder = tmp_path_factory.mktemp("resnet50")
    model = build_torch_model("random")
    paths: dict[str, Path | None] = {"torch": folder / "model.pt", "onnx": folder / "model.onnx"}
    try:
        export_onnx(model, paths["onnx"], "random")
    except Exception as exc:  # noqa: BLE001 - said by the tests that need it
        print(f"resnet50 ONNX export failed here: {type(exc).__name__}: {exc}")
        paths["onnx"] = None
    export_state_dict(model, paths["torch"], "random", "resnet50", onnx_path=paths["onnx"])
    return paths


@pytest.fixture(scope="session")
def onnx_reference(resnet50_artifacts):
    """An onnxruntime session on resnet50's ONNX, or a skip saying why there is none."""
    if resnet50_artifacts["onnx"] is None:
        pytest.skip("no resnet50 ONNX here (its export failed: see the export step's output)")
    try:
        import onnxruntime as ort
    except Exception as exc:  # noqa: BLE001 - e.g. built for another numpy
        pytest.skip(f"onnxruntime does not import here: {type(exc).__name__}: {exc}")
    return ort.InferenceSession(str(resnet50_artifacts["onnx"]), providers=["CPUExecutionProvider"])
