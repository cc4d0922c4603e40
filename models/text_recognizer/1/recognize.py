"""The text of one line per image: PP-OCRv4's CTC recogniser (model.onnx) and greedy decoding.

    image        (n, 3, 48, W) float32: a text line scaled to fit keeping its aspect ratio,
                 padded bottom/right with 127.5 (0 after normalising), (x/255 - 0.5) / 0.5
                 (config.pbtxt: W = 320)
    TEXT         (n, 1) bytes, UTF-8, without spaces at either end
    CONFIDENCE   (n, 1) float32: mean of the kept steps' probabilities (0 for no text)

The model's output is (n, steps, classes) probabilities. Its classes follow PaddleOCR's CTC
convention: 0 is the blank, 1.. the characters of characters.txt (one per line, written
by `python -m engine_build ocr` from the model's metadata), and the last one a space,
which the file does not hold.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from bls_pipeline.engines.onnx import OnnxModel

_FOLDER = Path(__file__).resolve().parent
_THREADS = min(4, os.cpu_count() or 1)
_model: OnnxModel | None = None
_classes: tuple[str, ...] = ()


def setup() -> None:
    """At load (engines/functions.py): the character list and the ONNX session, so a missing
    or broken file fails the load, not a request."""
    global _model, _classes
    _classes = read_classes(_FOLDER / "characters.txt")
    _model = OnnxModel(_FOLDER / "model.onnx", ["image"], ["probs"], intra_op_threads=_THREADS)


def recognize(inputs: dict) -> dict:
    probs = _model.run({"image": np.ascontiguousarray(inputs["image"], dtype=np.float32)})["probs"]
    texts, confidence = ctc_decode(probs, _classes)
    return {"TEXT": np.array([[t.encode("utf-8")] for t in texts], dtype=object).reshape(-1, 1),
            "CONFIDENCE": confidence.reshape(-1, 1)}


def read_classes(path: Path) -> tuple[str, ...]:
    """The model's classes: the blank (""), the file's characters, then a space."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: write it (with model.onnx) with python -m engine_build ocr")
    return ("", *path.read_text(encoding="utf-8").rstrip("\n").split("\n"), " ")


def ctc_decode(probs: np.ndarray, classes: tuple[str, ...]) -> tuple[list[str], np.ndarray]:
    """Greedy CTC: the likeliest class per step, repeats collapsed, blanks (class 0) dropped,
    then spaces at either end (PP-OCRv4 often reads the margin before a line as one).
    Returns the texts and their confidences (n,) float32: the mean probability of the steps
    that made the text."""
    if probs.shape[-1] != len(classes):
        raise ValueError(f"the model scores {probs.shape[-1]} classes but the character list gives {len(classes)} "
                         "(blank, characters, space): rebuild both with python -m engine_build ocr")
    best, best_p = probs.argmax(axis=-1), probs.max(axis=-1)
    kept = best != 0
    kept[:, 1:] &= best[:, 1:] != best[:, :-1]
    texts, confidence = [], np.zeros(len(best), np.float32)
    for i, (row, keep) in enumerate(zip(best, kept)):
        steps = np.flatnonzero(keep)
        chars = [classes[c] for c in row[steps]]
        start, end = 0, len(chars)
        while start < end and chars[start].isspace():
            start += 1
        while end > start and chars[end - 1].isspace():
            end -= 1
        texts.append("".join(chars[start:end]))
        if end > start:
            confidence[i] = best_p[i, steps[start:end]].mean()
    return texts, confidence
