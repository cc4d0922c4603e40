"""A detector's outputs -> region boxes on the image: pure numpy, no model, no device.

    each row's boxes (count, or padding) ─> xyxy ─> pixels of what the detector saw ─> back
    through its preprocessing (stretch, keep_aspect padding, centre crop) ─> pixels of the
    image as decoded ─> the rule below ─> kept boxes, with their score and class

The rule for bad boxes, in order (docs/extending.md says it to users):
- padding is dropped: rows past `count`, or, without a count output, all-zero boxes;
- a box with a non-finite coordinate is dropped;
- a box is clipped to the image (or to the region it was found in);
- a box with no area left after clipping (empty, inverted, or outside) is dropped;
- a box scoring under `min_score` (when the detector gives scores) is dropped.
A detector output of the wrong shape raises ChildCallError naming the model and the shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...stages.preprocess import PreprocessSpec, placement
from ..load.children import ChildModel
from ..errors import ChildCallError

__all__ = ["Found", "found_boxes", "to_xyxy"]


@dataclass(frozen=True)
class Found:
    """The boxes kept, in order of their source row, then the detector's order."""

    source: np.ndarray  # (n,) the row (of the batch the detector ran on) each box was found in
    boxes: np.ndarray  # (n, 4) float64 x0, y0, x1, y1 in the pixels of the image as decoded
    scores: np.ndarray  # (n,) float32, NaN when the detector gives none
    classes: np.ndarray  # (n,) int64, -1 when the detector gives none


def to_xyxy(boxes: np.ndarray, box_format: str) -> np.ndarray:
    b = boxes.astype(np.float64, copy=False)
    if box_format == "xywh":
        return np.stack([b[..., 0], b[..., 1], b[..., 0] + b[..., 2], b[..., 1] + b[..., 3]], axis=-1)
    if box_format == "cxcywh":
        half_w, half_h = b[..., 2] / 2, b[..., 3] / 2
        return np.stack([b[..., 0] - half_w, b[..., 1] - half_h, b[..., 0] + half_w, b[..., 1] + half_h], axis=-1)
    return b


def _shape_error(child: ChildModel, name: str, value: np.ndarray, want: str) -> ChildCallError:
    return ChildCallError(f"detector {child.name} returned {name} with shape {tuple(value.shape)}; a detector's {name} "
                          f"needs {want}", model=child.name)


def found_boxes(child: ChildModel, values: dict[str, np.ndarray], rows: np.ndarray, sources: np.ndarray,
                scales: np.ndarray, min_score: float | None = None) -> Found:
    """The boxes `child` found on `rows`. values: its outputs for those rows (host arrays);
    sources: (len(rows), 4) each row's source box in the pixels of the image as decoded (the
    whole image, or the region it ran on), which what the detector saw was made from;
    scales: each row's pixels of the image as sent per decoded pixel (a JPEG decoded at a
    reduced scale), for a detector that took the encoded image and so answers in its pixels."""
    det = child.detector
    boxes = np.asarray(values[det.boxes])
    n = len(rows)
    if boxes.ndim != 3 or boxes.shape[0] != n or boxes.shape[2] != 4:
        raise _shape_error(child, det.boxes, boxes, f"({n}, boxes, 4) for {n} rows")
    per_row = boxes.shape[1]
    extra = {}
    for name, key in ((det.scores, "scores"), (det.classes, "classes")):
        if name is not None:
            value = np.asarray(values[name])
            if value.shape != (n, per_row):
                raise _shape_error(child, name, value, f"({n}, {per_row}), one per box")
            extra[key] = value
    if det.count is not None:
        count = np.asarray(values[det.count])
        if count.shape not in ((n,), (n, 1)):
            raise _shape_error(child, det.count, count, f"({n}, 1), one count per row")
        count = count.reshape(n)
        if (count < 0).any() or (count > per_row).any():
            raise ChildCallError(f"detector {child.name} returned {det.count}={count.tolist()} for {per_row} boxes per "
                                 f"row; each count must be within 0..{per_row}", model=child.name)
        real = np.arange(per_row)[None, :] < count[:, None]
    else:
        real = ~(boxes == 0).all(axis=2)
    xyxy = to_xyxy(boxes, det.format)
    xyxy = _to_source(child, xyxy, sources, scales)
    x0, y0, x1, y1 = (sources[:, i][:, None] for i in range(4))
    keep = real & np.isfinite(xyxy).all(axis=2)
    clipped = np.stack([np.clip(xyxy[..., 0], x0, x1), np.clip(xyxy[..., 1], y0, y1),
                        np.clip(xyxy[..., 2], x0, x1), np.clip(xyxy[..., 3], y0, y1)], axis=-1)
    with np.errstate(invalid="ignore"):
        keep &= (clipped[..., 2] > clipped[..., 0]) & (clipped[..., 3] > clipped[..., 1])
    if min_score is not None:  # Batch.regions made sure the detector names its scores
        with np.errstate(invalid="ignore"):
            keep &= extra["scores"] >= min_score
    r, k = np.nonzero(keep)
    scores = extra["scores"][r, k].astype(np.float32) if "scores" in extra else np.full(len(r), np.nan, np.float32)
    classes = extra["classes"][r, k].astype(np.int64) if "classes" in extra else np.full(len(r), -1, np.int64)
    return Found(rows[r], clipped[r, k], scores, classes)


def _to_source(child: ChildModel, xyxy: np.ndarray, sources: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Boxes in what the detector saw (its input, or the image as sent) -> image pixels."""
    spec: PreprocessSpec | None = child.preprocess
    out = np.empty_like(xyxy)
    for i, (sx0, sy0, sx1, sy1) in enumerate(sources):
        w, h = sx1 - sx0, sy1 - sy0
        if spec is None:  # the detector decoded the image itself: its boxes are on the whole image
            unit_w, unit_h = (w, h) if child.detector.units == "normalized" else (1 / scales[i], 1 / scales[i])
            ax, bx, ay, by = sx0, unit_w, sy0, unit_h
        else:
            (bx0, by0, bx1, by1), (left, top, rw, rh) = placement(w, h, spec)
            unit_w, unit_h = ((spec.input_width, spec.crop) if child.detector.units == "normalized" else (1.0, 1.0))
            # x_src = bx0 + (x_in - left) * (bx1 - bx0) / rw, with x_in = x * unit
            gx, gy = (bx1 - bx0) / rw, (by1 - by0) / rh
            ax, bx = sx0 + bx0 - left * gx, unit_w * gx
            ay, by = sy0 + by0 - top * gy, unit_h * gy
        out[i, :, 0], out[i, :, 2] = ax + xyxy[i, :, 0] * bx, ax + xyxy[i, :, 2] * bx
        out[i, :, 1], out[i, :, 3] = ay + xyxy[i, :, 1] * by, ay + xyxy[i, :, 3] * by
    return out
