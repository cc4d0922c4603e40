"""Text lines in an image: PP-OCRv4's DB text detector (model.onnx) and its postprocessing,
in numpy (no OpenCV).

    image    (n, 3, H, W) float32: RGB scaled to fit keeping its aspect ratio, padded
             bottom/right, (x/255 - 0.5) / 0.5 (config.pbtxt: 640x640)
    BOXES    (n, k, 4) float32: x0, y0, x1, y1 of each text line, 0..1 of the input's width
             and height, in reading order; each row padded with zeros to the most boxes of
             any image in the batch
    SCORES   (n, k) float32: each box's mean text probability (0 for the padding)
    COUNT    (n, 1) int32: the real number of boxes of each image

The postprocessing is PaddleOCR's DBPostProcess at the settings rapidocr ships (below),
with axis-aligned boxes instead of rotated rectangles: the probability map is thresholded,
dilated by 2x2, split into 8-connected components; each component's bounding box scores
the mean probability inside it ("fast" mode), and a box that keeps is grown by
area * UNCLIP_RATIO / perimeter on each side (the detector was trained on shrunk lines).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from bls_pipeline.engines.onnx import OnnxModel, OpenVinoModel

THRESH = 0.3  # probability above which a pixel is text
BOX_THRESH = 0.5  # a box's mean probability below which it is dropped
UNCLIP_RATIO = 1.6
MIN_SIZE = 3  # px of the input: boxes with a shorter side are dropped
MAX_BOXES = 100  # per image: the highest-scoring ones are kept
LINE_TOLERANCE = 10  # px: boxes whose tops are this close are one line, read left to right
DILATE = True

_MODEL_FILE = Path(__file__).resolve().parent / "model.onnx"
_IR_FILE = _MODEL_FILE.with_suffix(".xml")  # the same network as an OpenVINO IR (engine_build ocr)
_THREADS = min(4, os.cpu_count() or 1)
_model: OnnxModel | OpenVinoModel | None = None
log = logging.getLogger("bls_pipeline.models.text_detector")


def setup() -> None:
    """At load (engines/functions.py): the network, so a missing or broken file fails the
    load, not a request. Its OpenVINO IR in FP32 where engine_build wrote one and openvino is
    installed (the same boxes as the ONNX, faster on the CPU: docs/performance.md), else the
    ONNX by onnxruntime; the log says which."""
    global _model
    if _IR_FILE.is_file():
        try:
            _model = OpenVinoModel(_IR_FILE, ["image"], ["prob_map"], threads=_THREADS, precision="f32")
            return
        except ImportError:
            log.warning("text_detector: %s is here but openvino is not installed: running %s by onnxruntime",
                        _IR_FILE.name, _MODEL_FILE.name)
    _model = OnnxModel(_MODEL_FILE, ["image"], ["prob_map"], intra_op_threads=_THREADS)


def detect(inputs: dict) -> dict:
    # The batch goes through the network one image at a time: on the CPU the DB network is
    # slower per image in a batch (2 cores: 80 ms an image at 8 against 57 ms at 1), and
    # onnxruntime's arena keeps the activations of the largest batch (1009 MiB at 8, 161 at 1).
    images = np.ascontiguousarray(inputs["image"], dtype=np.float32)
    return pack([boxes_from_map(_model.run({"image": image[None]})["prob_map"][0, 0]) for image in images])


def pack(found: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    """Per-image (boxes, scores), boxes already 0..1, as the model's padded outputs."""
    most = max((len(s) for _, s in found), default=0)
    boxes = np.zeros((len(found), most, 4), np.float32)
    scores = np.zeros((len(found), most), np.float32)
    for i, (b, s) in enumerate(found):
        boxes[i, :len(s)], scores[i, :len(s)] = b, s
    return {"BOXES": boxes, "SCORES": scores, "COUNT": np.array([[len(s)] for _, s in found], np.int32).reshape(-1, 1)}


def boxes_from_map(prob: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One (H, W) probability map -> boxes (k, 4) as x0, y0, x1, y1 in 0..1 of W and H, in
    reading order, and their scores (k,)."""
    height, width = prob.shape
    mask = prob > THRESH
    if DILATE:  # OpenCV's dilate with a 2x2 kernel (anchor at its centre): one pixel down and right
        mask[1:] |= mask[:-1].copy()
        mask[:, 1:] |= mask[:, :-1].copy()
    boxes = components(mask).astype(np.float64)  # pixel edges: x0, y0, x1, y1 (exclusive)
    boxes = boxes[np.minimum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]) >= MIN_SIZE]
    scores = _box_means(prob, boxes.astype(np.int64))
    boxes, scores = boxes[scores >= BOX_THRESH], scores[scores >= BOX_THRESH]
    best = np.argsort(-scores, kind="stable")[:MAX_BOXES]
    boxes, scores = boxes[best], scores[best]
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    grow = (w * h * UNCLIP_RATIO / (2 * (w + h)))[:, None]
    boxes = np.clip(boxes + grow * np.array([-1, -1, 1, 1]), 0, [width, height, width, height])
    order = reading_order(boxes)
    return (boxes[order] / [width, height, width, height]).astype(np.float32), scores[order].astype(np.float32)


def reading_order(boxes: np.ndarray) -> np.ndarray:
    """Indices of boxes (x0, y0, x1, y1) top to bottom, and left to right within a line
    (tops within LINE_TOLERANCE of the line's first box)."""
    by_top = np.lexsort((boxes[:, 0], boxes[:, 1]))
    line, line_top = np.zeros(len(boxes), np.int64), None
    for rank, i in enumerate(by_top):
        if line_top is None or boxes[i, 1] - line_top >= LINE_TOLERANCE:
            line_top = boxes[i, 1]
            line[rank:] = rank
    return by_top[np.lexsort((boxes[by_top, 0], line))]


def components(mask: np.ndarray) -> np.ndarray:
    """The 8-connected components of a boolean (H, W) mask, as bounding boxes (k, 4) int64:
    x0, y0, x1, y1 with x1, y1 exclusive, in no particular order.

    Run-length labelling: each row's runs of True, runs in adjacent rows that touch
    (diagonals included) joined by a vectorised union-find, then a box per root."""
    height, width = mask.shape
    padded = np.zeros((height, width + 2), np.int8)
    padded[:, 1:-1] = mask
    change = np.diff(padded, axis=1)  # +1 where a run starts, -1 one past where it ends
    rows, starts = np.nonzero(change == 1)
    ends = np.nonzero(change == -1)[1]  # row-major like the starts: the i-th end closes the i-th run
    if not len(rows):
        return np.zeros((0, 4), np.int64)
    # Runs are sorted by row, then column, so the runs of row r-1 touching run b (end >= b's
    # start, start <= b's end) are one contiguous slice [lo, hi) of them.
    stride = width + 2
    lo = np.searchsorted(rows * stride + ends, (rows - 1) * stride + starts, side="left")
    hi = np.searchsorted(rows * stride + starts, (rows - 1) * stride + ends, side="right")
    counts = np.maximum(hi - lo, 0)
    b = np.repeat(np.arange(len(rows)), counts)
    a = np.repeat(lo, counts) + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    root = _union(len(rows), a, b)
    labels, run_label = np.unique(root, return_inverse=True)
    boxes = np.empty((len(labels), 4), np.int64)
    boxes[:, :2] = [width, height]
    boxes[:, 2:] = 0
    np.minimum.at(boxes[:, 0], run_label, starts)
    np.minimum.at(boxes[:, 1], run_label, rows)
    np.maximum.at(boxes[:, 2], run_label, ends)
    np.maximum.at(boxes[:, 3], run_label, rows + 1)
    return boxes


def _union(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each of n items' root (the smallest item of its group) given the edges a[i]-b[i]:
    every round hooks each differing edge's larger root under its smaller one, then
    flattens the trees, until every edge joins items of one root."""
    parent = np.arange(n)
    while len(a):
        ra, rb = parent[a], parent[b]
        differ = ra != rb
        if not differ.any():
            break
        a, b, ra, rb = a[differ], b[differ], ra[differ], rb[differ]
        np.minimum.at(parent, np.maximum(ra, rb), np.minimum(ra, rb))
        while True:
            flat = parent[parent]
            if np.array_equal(flat, parent):
                break
            parent = flat
    return parent


def _box_means(prob: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Mean of prob inside each box (x0, y0, x1, y1 pixel edges), from a summed-area table."""
    table = np.zeros((prob.shape[0] + 1, prob.shape[1] + 1), np.float64)
    table[1:, 1:] = prob.cumsum(axis=0, dtype=np.float64).cumsum(axis=1)
    x0, y0, x1, y1 = boxes.T
    area = np.maximum((x1 - x0) * (y1 - y0), 1)
    return (table[y1, x1] - table[y0, x1] - table[y1, x0] + table[y0, x0]) / area
