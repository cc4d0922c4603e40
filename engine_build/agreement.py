"""How far a CPU engine's answers are from the FP32 ONNX it was built from, on real images.

    python -m engine_build agreement --model efficientnet_lite0 [--engine int8|openvino] [--images DIR]

The images are the folder's photos (.jpg; samples/ by default) and their variants: crops
(centre and corners), mirror images and rescales, each preprocessed as the served model's
config.pbtxt says. Reported: top-1 agreement (the same class first) and top-5 overlap (the
share of FP32's five best classes among the engine's five). Only meaningful with real
weights (efficientnet_lite0 ships them; resnet50 exported with random weights cannot judge).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bls_pipeline.contract import CLASSIFIER_INPUT, CLASSIFIER_OUTPUT
from bls_pipeline.stages.preprocess import PreprocessSpec, preprocess_into

__all__ = ["Agreement", "agreement", "image_variants"]

# (left, top, right, bottom) as fractions of the image: the whole, centre crops, four corners.
CROPS = ((0, 0, 1, 1), (0.1, 0.1, 0.9, 0.9), (0.2, 0.2, 0.8, 0.8),
         (0, 0, 0.7, 0.7), (0.3, 0, 1, 0.7), (0, 0.3, 0.7, 1), (0.3, 0.3, 1, 1))
SCALES = (1.0, 0.5, 0.3)  # of the crop's size, before the model's own resize


@dataclass(frozen=True)
class Agreement:
    images: int
    top1_agreement: float  # share of images whose top-1 class is the same
    top5_overlap: float  # mean share of the reference's top 5 found in the candidate's top 5


def image_variants(folder: Path, spec: PreprocessSpec, pattern: str = "*.jpg") -> np.ndarray:
    """(N, 3, H, W): every photo of `folder` matching `pattern`, cropped, mirrored and rescaled
    (len(CROPS) x 2 x len(SCALES) variants each), preprocessed as `spec` says."""
    from PIL import Image

    sources = sorted(Path(folder).glob(pattern))
    if not sources:
        raise FileNotFoundError(f"no {pattern} in {folder}")
    out = np.empty((len(sources) * len(CROPS) * 2 * len(SCALES), *spec.input_shape), np.float32)
    i = 0
    for src in tqdm(sources, desc="image variants", unit="photo"):
        img = Image.open(src).convert("RGB")
        w, h = img.size
        for left, top, right, bottom in CROPS:
            crop = img.crop((round(left * w), round(top * h), round(right * w), round(bottom * h)))
            for flipped in (crop, crop.transpose(Image.FLIP_LEFT_RIGHT)):
                for scale in SCALES:
                    size = (max(1, round(flipped.width * scale)), max(1, round(flipped.height * scale)))
                    preprocess_into(flipped.resize(size, Image.BILINEAR) if scale != 1.0 else flipped, spec, out[i])
                    i += 1
    return out


def agreement(reference, candidate, tensors: np.ndarray, batch: int = 8) -> Agreement:
    """Compare two `run(batch) -> logits` callables on `tensors`."""
    top1, top5 = [], []
    for start in tqdm(range(0, len(tensors), batch), desc="compare", unit="batch"):
        x = tensors[start:start + batch]
        ref, got = np.asarray(reference(x)), np.asarray(candidate(x))
        ref5, got5 = np.argsort(-ref, axis=1)[:, :5], np.argsort(-got, axis=1)[:, :5]
        top1 += list(ref5[:, 0] == got5[:, 0])
        top5 += [len(set(a) & set(b)) / 5 for a, b in zip(ref5, got5)]
    return Agreement(len(tensors), float(np.mean(top1)), float(np.mean(top5)))


def runner(path: Path):
    """`run(batch) -> logits` for an ONNX file (onnxruntime) or an IR (OpenVINO), as served."""
    from bls_pipeline.engines.onnx import open_engine

    model = open_engine(path, [CLASSIFIER_INPUT.name], [CLASSIFIER_OUTPUT.name], {})  # default settings
    return lambda x: model.run({CLASSIFIER_INPUT.name: x})[CLASSIFIER_OUTPUT.name]
