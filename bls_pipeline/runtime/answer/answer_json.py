"""Each image's answer as one JSON document: the JSON output a flow model may declare
(contract.JSON), for clients that read JSON rather than tensors (curl and jq, a browser).

The runtime writes it from the outputs it has just made for the request (predictions.py), so it
says what the tensors say; `bls-classify --json` builds the same document from the tensors
of a model that does not declare JSON. Per image, UTF-8, no NaN (a non-finite number is
null); a key is there when the model declares the outputs it comes from:

    {"route": "efficientnet_lite0_onnx:confident",   ROUTE
     "labels": ["coffee mug", "cup"],               LABELS' label names, best first; [] when the
     "scores": [0.931, 0.012],                        image was answered without labels (ROUTE
     "class_ids": [504, 968],                         says why); SCORES; CLASS_IDS
     "outputs": {"TEXT": "..."},                    the flow's own outputs (answer.output): dims
                                                      [1] a value, others a list; bytes as text
     "degraded": "overloaded: ...",                 an image answered degraded: why an optional
                                                      stage was skipped (runtime; no tensor)
     "regions": [                                   with REGION_COUNT: the image's own regions,
       {"box": [92.5, 81.5, 384.5, 126.5],            not padded ([] when it has none); box
        "route": "text_orientation:upright",          x0, y0, x1, y1 in pixels of the image
        "labels": ["0"], "scores": [1.0], "class_ids": [0],       as sent
        "outputs": {"REGION_TEXT": "TRITON AVE", "REGION_CONFIDENCE": 0.98}}]}

Per-region outputs are the regions answers' own (runtime); a reader with tensors alone takes
those named REGION_* beside the runtime's as per region (the name read_text's follow).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Collection, Mapping, Sequence

import numpy as np

from ...contract import (CLASS_IDS, JSON, LABELS, REGION_BOXES, REGION_CLASS_IDS, REGION_COUNT, REGION_LABELS,
                         REGION_OUTPUTS, REGION_ROUTE, REGION_SCORES, ROUTE, SCORES, STANDARD_OUTPUTS)
from ..results import Prediction

__all__ = ["add_documents", "documents", "encode"]


def documents(tensors: Mapping[str, np.ndarray], dims: Mapping[str, Sequence[int]] | None = None,
              per_region: Collection[str] | None = None) -> list[dict[str, Any]]:
    """One document per image of one response. tensors: its outputs by name, batch first (as
    a client reads them); dims: each output's declared dims without the batch (a [1] output
    is a value, not a list); per_region: the outputs that hold one value per region (None:
    the REGION_* ones beside the runtime's)."""
    dims = dict(dims or {})
    if per_region is None:
        per_region = [n for n in tensors if n.startswith("REGION_") and n not in REGION_OUTPUTS]
    per_region = [n for n in tensors if n in set(per_region)]
    own = [n for n in tensors if n not in STANDARD_OUTPUTS and n not in REGION_OUTPUTS and n not in per_region]
    count = len(next(iter(tensors.values()))) if tensors else 0
    return [_image(tensors, i, dims, own, per_region) for i in range(count)]


def encode(document: Mapping[str, Any]) -> bytes:
    """A document as the JSON output holds it: compact UTF-8 (NaN refused: documents() has none)."""
    return json.dumps(document, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def add_documents(results: list, declared: Mapping[str, Any], per_region: Collection[str]) -> None:
    """Give each Prediction of `results` its JSON output (one row per image), in place.
    declared: the flow model's outputs by name (TensorInfo, with .dims); per_region: the
    regions answers' own outputs."""
    dims = {name: tuple(info.dims) for name, info in declared.items()}
    for r, result in enumerate(results):
        if isinstance(result, Prediction):
            made = {LABELS.name: result.labels, SCORES.name: result.scores, CLASS_IDS.name: result.class_ids,
                    ROUTE.name: result.routes, **result.outputs}
            tensors = {n: made[n] for n in declared if n in made and n != JSON.name}  # in the config's order
            docs = documents(tensors, dims, per_region)
            for doc, note in zip(docs, result.notes):
                doc.update(note)
            rows = [encode(d) for d in docs]
            results[r] = replace(result,
                                 outputs={**result.outputs, JSON.name: np.array(rows, dtype=object).reshape(-1, 1)})


def _image(t: Mapping[str, np.ndarray], i: int, dims: dict, own: list[str], per_region: list[str]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if ROUTE.name in t:
        doc["route"] = _text(np.asarray(t[ROUTE.name][i]).reshape(-1)[0])
    if LABELS.name in t:
        doc.update(_top(t[LABELS.name][i], _row(t, SCORES.name, i), _row(t, CLASS_IDS.name, i)))
    if own:
        doc["outputs"] = {n: _value(t[n][i], dims.get(n)) for n in own}
    if REGION_COUNT.name in t:
        count = int(np.asarray(t[REGION_COUNT.name][i]).reshape(-1)[0])
        doc["regions"] = [_region(t, i, j, dims, per_region) for j in range(count)]
    return doc


def _region(t: Mapping[str, np.ndarray], i: int, j: int, dims: dict, per_region: list[str]) -> dict[str, Any]:
    region: dict[str, Any] = {}
    if REGION_BOXES.name in t:
        region["box"] = _plain(t[REGION_BOXES.name][i, j])
    if REGION_ROUTE.name in t:
        region["route"] = _text(t[REGION_ROUTE.name][i, j])
    if REGION_LABELS.name in t:
        region.update(_top(t[REGION_LABELS.name][i, j], _row(t, REGION_SCORES.name, i, j),
                           _row(t, REGION_CLASS_IDS.name, i, j)))
    if per_region:
        region["outputs"] = {n: _value(t[n][i, j], tuple(dims[n])[1:] if n in dims else None) for n in per_region}
    return region


def _row(t: Mapping[str, np.ndarray], name: str, *index: int) -> np.ndarray | None:
    return np.asarray(t[name][index]) if name in t else None


def _top(labels: np.ndarray, scores: np.ndarray | None, class_ids: np.ndarray | None) -> dict[str, list]:
    """A row's top-k ("score:index:label" each, b"" past a row answered without labels) as
    three lists, the numbers from SCORES and CLASS_IDS when declared, else from the label."""
    out: dict[str, list] = {"labels": [], "scores": [], "class_ids": []}
    for k, item in enumerate(np.asarray(labels).reshape(-1)):
        text = _text(item)
        if not text:
            continue
        score, index, label = text.split(":", 2)
        out["labels"].append(label)
        out["scores"].append(_number(scores.reshape(-1)[k]) if scores is not None else _number(float(score)))
        out["class_ids"].append(int(class_ids.reshape(-1)[k]) if class_ids is not None else int(index))
    return out


def _value(value, dims: Sequence[int] | None) -> Any:
    """One output's value for one image (or region): a [1] output (or one with no dims left)
    as a value, anything else as a (nested) list."""
    array = np.asarray(value)
    plain = _plain(array)
    one = array.size == 1 and (dims is None and array.shape == (1,) or dims is not None and tuple(dims) in ((), (1,)))
    return plain[0] if one and isinstance(plain, list) else plain


def _plain(array) -> Any:
    """An array as JSON values, nested as it is: text for bytes, null for non-finite numbers,
    float32 scores at float32's precision (0.93, not 0.9300000071525879)."""
    array = np.asarray(array)
    if array.dtype == object or array.dtype.kind in "SU":
        flat = [_text(v) for v in array.reshape(-1)]
    elif array.dtype.kind == "f":
        flat = [_number(v) for v in array.reshape(-1)]
    elif array.dtype.kind == "b":
        flat = [bool(v) for v in array.reshape(-1)]
    else:
        flat = [int(v) for v in array.reshape(-1)]
    if array.ndim == 0:
        return flat[0]
    nested = np.empty(len(flat), dtype=object)
    nested[:] = flat
    return nested.reshape(array.shape).tolist()


def _number(value) -> float | None:
    if not np.isfinite(value):
        return None
    if isinstance(value, np.floating) and value.dtype.itemsize < 8:
        return float(str(value))  # numpy prints the shortest digits that give the same float32
    return float(value)


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
