"""ONNX -> CPU engines: INT8 by post-training quantization, and OpenVINO IR (FP32).

Two INT8 methods, both calibrated on the same images, preprocessed as the served model's
config.pbtxt says (its `preprocess_*` parameters, read by the flow runtime's own code):

    nncf         OpenVINO's NNCF on the IR, for OpenVINO: models/<model>_openvino/1/model.xml
    onnxruntime  static QDQ quantization (per-channel int8 weights, uint8 activations),
                 an ONNX file for onnxruntime: models/<model>_int8/1/model.onnx

`METHODS` says which is the default and why (docs/performance.md has the measurement).
OpenVINO and NNCF are imported only when asked for: pip install 'bls-pipeline[openvino]'.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from bls_pipeline.contract import CLASSIFIER_INPUT
from bls_pipeline.stages.decode import IMAGE_SUFFIXES
from bls_pipeline.stages.preprocess import PreprocessSpec, preprocess_into

__all__ = ["CalibrationError", "DEFAULT_METHOD", "METHODS", "calibration_images", "calibration_tensors",
           "convert_openvino", "quantize"]

log = logging.getLogger(__name__)

# Measured on this project's machine (AMD EPYC, AVX-512 VNNI, 2 cores; docs/performance.md),
# classify_bls on resnet50 in one bls-bench run: NNCF's INT8 in OpenVINO 3.30x FP32 onnxruntime
# at concurrency 8, onnxruntime's QDQ 2.97x; idle, 488 against 523 MiB private for the
# repository. Their agreement with FP32 is the same (efficientnet_lite0: 84% top-1).
METHODS = ("nncf", "onnxruntime")
DEFAULT_METHOD = "nncf"


class CalibrationError(ValueError):
    """The calibration folder gives no image to calibrate with."""


def _require(module: str, extra: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{module} is needed here: pip install 'bls-pipeline[{extra}]'") from exc


def calibration_images(folder: Path, limit: int | None = None) -> list[tuple[Path, "object"]]:
    """The readable images in `folder` (not recursive, sorted), decoded to RGB: at most `limit`.
    Files not named as images (a README, notes; bls_pipeline.stages.decode's IMAGE_SUFFIXES) are passed
    over; an image that does not decode is skipped with a warning. Raises CalibrationError
    naming the folder when it holds no readable image."""
    from PIL import Image

    folder = Path(folder)
    if not folder.is_dir():
        raise CalibrationError(f"calibration folder {folder} does not exist (give --calibration DIR, a folder of "
                               "images)")
    files = sorted(p for p in folder.iterdir() if p.is_file())
    images, unreadable = [], []
    for path in (p for p in files if p.suffix.lower() in IMAGE_SUFFIXES):
        try:
            with Image.open(path) as img:
                images.append((path, img.convert("RGB")))
        except Exception:  # noqa: BLE001 - any file PIL cannot decode is not a calibration image
            unreadable.append(path.name)
        if limit is not None and len(images) >= limit:
            break
    if not images:
        others = [p.name for p in files if p.suffix.lower() not in IMAGE_SUFFIXES]
        seen = "; ".join(f"{what}: {_first_five(names)}" for what, names in
                         (("unreadable", unreadable), (f"not named {'/'.join(sorted(IMAGE_SUFFIXES))}", others))
                         if names)
        raise CalibrationError(f"calibration folder {folder} has no readable image" + (f" ({seen})" if seen else "")
                               + ": put JPEG or PNG photos like the ones you serve in it")
    if unreadable:
        log.warning("calibration: skipped %d unreadable files in %s: %s", len(unreadable), folder,
                    ", ".join(unreadable[:5]))
    return images


def _first_five(names: list[str]) -> str:
    return ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")


def calibration_tensors(folder: Path, spec: PreprocessSpec, limit: int | None = None,
                        mirror: bool = True) -> np.ndarray:
    """(N, 3, H, W) float32: every readable image of `folder` (and its mirror image),
    preprocessed as `spec` says, with a progress bar."""
    from PIL import Image

    images = calibration_images(folder, limit)
    variants = [img for _, img in images for img in ((img, img.transpose(Image.FLIP_LEFT_RIGHT)) if mirror else (img,))]
    out = np.empty((len(variants), *spec.input_shape), np.float32)
    for i, img in enumerate(tqdm(variants, desc=f"calibration images from {Path(folder).name}/", unit="image")):
        preprocess_into(img, spec, out[i])
    return out


class _Reader:
    """onnxruntime's CalibrationDataReader over a tensor array, one image per batch."""

    def __init__(self, tensors: np.ndarray, bar: tqdm):
        self._rows: Iterator[np.ndarray] = iter(tensors)
        self._bar = bar

    def get_next(self):
        row = next(self._rows, None)
        if row is None:
            return None
        self._bar.update()
        return {CLASSIFIER_INPUT.name: row[None]}

    def rewind(self):  # not needed by MinMax calibration, present for the interface
        raise NotImplementedError


def _quantize_onnxruntime(onnx_path: Path, output: Path, tensors: np.ndarray) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    with tempfile.TemporaryDirectory(prefix="int8-", dir=output.parent) as tmp:
        # The real path: the weights (model.onnx.data) are read from beside the file itself.
        with tqdm(total=len(tensors), desc="calibrate (onnxruntime)", unit="image") as bar:
            quantize_static(os.path.realpath(onnx_path), str(Path(tmp) / "model.onnx"), _Reader(tensors, bar),
                            quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                            weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)
        (Path(tmp) / "model.onnx").replace(output)


def _quantize_nncf(onnx_path: Path, output: Path, tensors: np.ndarray) -> None:
    ov = _require("openvino", "openvino")
    nncf = _require("nncf", "openvino")
    model = ov.convert_model(os.path.realpath(onnx_path))
    bar = tqdm(total=len(tensors), desc="calibrate (nncf)", unit="image")

    def rows():
        for row in tensors:
            bar.update()
            yield row[None]

    quantized = nncf.quantize(model, nncf.Dataset(list(rows())), subset_size=len(tensors))
    bar.close()
    _save_ir(ov, quantized, output)


def _save_ir(ov, model, output: Path) -> None:
    tmp = output.with_name(output.stem + ".tmp.xml")
    ov.save_model(model, str(tmp), compress_to_fp16=False)
    tmp.with_suffix(".bin").replace(output.with_suffix(".bin"))  # the weights first: the .xml appears last
    tmp.replace(output)


def quantize(onnx_path: Path, output: Path, tensors: np.ndarray, method: str = DEFAULT_METHOD) -> None:
    """INT8 `output` from the FP32 ONNX, calibrated on `tensors`; written atomically."""
    if method not in METHODS:
        raise ValueError(f"unknown INT8 method {method!r}: choose {' or '.join(METHODS)}")
    if not Path(onnx_path).exists():
        raise FileNotFoundError(f"{onnx_path} is missing: run `python -m engine_build export` first")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    (_quantize_onnxruntime if method == "onnxruntime" else _quantize_nncf)(Path(onnx_path), output, tensors)


def convert_openvino(onnx_path: Path, output: Path) -> None:
    """The FP32 ONNX as OpenVINO IR (model.xml + model.bin), weights kept FP32."""
    ov = _require("openvino", "openvino")
    if not Path(onnx_path).exists():
        raise FileNotFoundError(f"{onnx_path} is missing: run `python -m engine_build export` first")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tqdm(total=1, desc=f"convert {Path(onnx_path).name} to OpenVINO IR", unit="step") as bar:
        _save_ir(ov, ov.convert_model(os.path.realpath(onnx_path)), output)
        bar.update()
