"""From the flow's Answer to each request's Prediction: its images' rows, their top-k labels
and ROUTE, the flow's own outputs, the regions it attached (REGION_*, padded per request),
and the JSON document of each image; a request with a row left unanswered fails, naming it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ...contract import JSON, REGION_OUTPUTS, STANDARD_OUTPUTS
from .answer import Answer
from .answer_json import add_documents
from ...base.tensors import TensorInfo
from ..decode.device import Device
from ..errors import FlowError
from ..results import BROKEN, ImageRequest, Prediction, RequestError, Timings

__all__ = ["check_filled", "predictions"]


def check_filled(answer: Answer, declared: Mapping[str, TensorInfo]) -> None:
    """Every output the flow model declares is filled; none is silently absent."""
    if not declared:
        return
    regions = [n for n in declared if n in REGION_OUTPUTS]
    if regions and not answer.attached:
        raise FlowError(f"its config.pbtxt declares {', '.join(regions)}, and the answer attached no regions "
                        "(answer.attach(regions_answer)), on every path, even when there are none")
    filled = (set(answer.outputs).union(*(a.outputs for a in answer.attached)) if answer.attached
              else set(answer.outputs))
    own = [n for n in declared if n not in STANDARD_OUTPUTS and n not in REGION_OUTPUTS and n not in filled]
    if own:
        raise FlowError(f"its config.pbtxt declares output(s) {', '.join(own)}, which the answer did not fill "
                        f"(answer.output({own[0]!r}, values)) on this path; fill them on every path")


def predictions(answer: Answer, owners: np.ndarray, requests: Sequence[ImageRequest], results: list, timings: Timings,
                *, flow: str, declared: Mapping[str, TensorInfo], default_topk: int, device: Device,
                warnings: Mapping[str, str] | None = None) -> None:
    """Fill `results` (None: still pending) with each request's Prediction from the flow's
    answer: its images' rows (`owners`: each row's request), top-k labels, ROUTE, the flow's
    own outputs, its regions (REGION_*), its JSON; or fail it, naming a row left unanswered.
    warnings: {model: what an answer of it says} (children.ChildModel.warning)."""
    routes = answer.routes()
    pending, asks, fills = [], [], []  # the device computes every top-k of this run together
    attached = answer.attached
    for r, req in enumerate(requests):
        if results[r] is not None:
            continue
        rows = np.flatnonzero(owners == r)
        k = req.k or default_topk
        table = _LabelTable(len(rows), k)
        _ask(answer, rows, table, k, asks, fills)
        # Each attached regions answer: the rows of this request's images, in image order.
        regions = []
        for part in attached:
            of = part.regions_of
            mine = np.flatnonzero(np.isin(of.image, rows))
            mine = mine[np.argsort(np.searchsorted(rows, of.image[mine]), kind="stable")]
            region_table = _LabelTable(len(mine), k)
            _ask(part, mine, region_table, k, asks, fills)
            regions.append((part, mine, region_table))
        pending.append((r, rows, table, regions))
    for top, (table, positions) in zip(device.top_k(asks), fills):
        table.labels[positions], table.scores[positions] = top.labels, top.scores
        table.class_ids[positions] = top.class_ids
    for r, rows, table, regions in pending:
        unanswered = table.unanswered()
        if unanswered is None:
            unanswered = next((f"{_where(part, mine[i], rows)}" for part, mine, rt in regions
                               if (i := rt.unanswered()) is not None), None)
        else:
            unanswered = f"IMAGE[{unanswered}]"
        if unanswered is not None:
            results[r] = RequestError(f"flow {flow} left {unanswered} unanswered", "flow", BROKEN)
            timings.reject(results[r], len(rows))
            continue
        route = routes[rows].reshape(-1, 1)
        for value in route[:, 0]:
            timings.count(timings.routes, value.decode())
        notes = _notes(answer, rows, timings, warnings or {})
        outputs = {name: values[rows] for name, values in answer.outputs.items()}
        if regions:
            outputs.update(_region_outputs(rows, regions, table.k))
        results[r] = Prediction(table.labels, table.scores, table.class_ids, route,
                                {n: v for n, v in outputs.items() if n in declared}, notes)
    # Each image's answer as one JSON document, from these outputs, for the requests asking for it.
    asking = [r for r, req in enumerate(requests) if req.outputs is None or JSON.name in req.outputs]
    if JSON.name in declared and asking:
        documented = [results[r] for r in asking]
        add_documents(documented, declared, {name for part in attached for name in part.outputs})
        for r, result in zip(asking, documented):
            results[r] = result


def _notes(answer: Answer, rows: np.ndarray, timings: Timings,
           warnings: Mapping[str, str]) -> tuple[dict[str, str], ...]:
    """Per image, what its JSON answer says beside its outputs: why it was answered degraded,
    and a warning of the model that answered it (random weights); () when there is neither.
    Degraded images are counted per stage skipped and why."""
    notes = []
    for row in rows.tolist():
        note = {}
        mark = answer.degraded(row)
        if mark is not None:
            timings.count(timings.degraded, mark[:2])
            note["degraded"] = mark[2]
        said = [warnings[m] for m in answer.models(row) if m in warnings]
        if said:
            note["warning"] = "; ".join(said)
        notes.append(note)
    return tuple(notes) if any(notes) else ()


def _region_outputs(rows: np.ndarray, regions: list, k: int) -> dict[str, np.ndarray]:
    """One request's REGION_* outputs and the regions answers' own outputs: per image, its
    regions (the attached answers' in attach order), padded to the most of any image."""
    per_image: list[list[tuple]] = [[] for _ in rows]  # (answer, region row, position in its table)
    for part, mine, region_table in regions:
        images = np.searchsorted(rows, part.regions_of.image[mine])
        for position, (row, image) in enumerate(zip(mine, images)):
            per_image[image].append((part, row, region_table, position))
    most = max((len(items) for items in per_image), default=0)
    n = len(rows)
    out = {
        "REGION_COUNT": np.array([[len(items)] for items in per_image], dtype=np.int32).reshape(n, 1),
        "REGION_BOXES": np.zeros((n, most, 4), np.float32),
        "REGION_LABELS": np.full((n, most, k), b"", dtype=object),
        "REGION_SCORES": np.zeros((n, most, k), np.float32),
        "REGION_CLASS_IDS": np.full((n, most, k), -1, np.int32),
        "REGION_ROUTE": np.full((n, most), b"", dtype=object),
    }
    own = {name for part, _, _ in regions for name in part.outputs}
    for name in own:
        sample = next(part.outputs[name] for part, _, _ in regions if name in part.outputs)
        fill = b"" if sample.dtype == object else (-1 if sample.dtype.kind in "iu" else 0)
        out[name] = np.full((n, most, *sample.shape[1:]) if sample.ndim > 1 else (n, most), fill, dtype=sample.dtype)
    part_outputs = {id(part): part.outputs for part, _, _ in regions}  # a copy per property read: once each
    for i, items in enumerate(per_image):
        for j, (part, row, region_table, position) in enumerate(items):
            out["REGION_BOXES"][i, j] = part.regions_of.box[row]
            out["REGION_LABELS"][i, j] = region_table.labels[position]
            out["REGION_SCORES"][i, j] = region_table.scores[position]
            out["REGION_CLASS_IDS"][i, j] = region_table.class_ids[position]
            out["REGION_ROUTE"][i, j] = part.routes()[row]
            for name, values in part_outputs[id(part)].items():
                out[name][i, j] = values[row]
    return out


class _LabelTable:
    """One answer's top-k labels, scores and class ids for some rows, being filled."""

    def __init__(self, n: int, k: int):
        self.k = k
        self.labels = np.full((n, k), b"", dtype=object)
        self.scores = np.zeros((n, k), dtype=np.float32)
        self.class_ids = np.full((n, k), -1, dtype=np.int32)
        self.answered = np.zeros(n, dtype=bool)

    def unanswered(self) -> int | None:
        return None if self.answered.all() else int(np.flatnonzero(~self.answered)[0])


def _ask(answer: Answer, rows: np.ndarray, table: _LabelTable, k: int, asks: list, fills: list) -> None:
    """Queue the top-k of `answer` on `rows` into `table` (skipped rows stay empty)."""
    for positions, source in answer.groups(rows):
        table.answered[positions] = True
        if source is not None:
            asks.append((source, rows[positions], k))
            fills.append((table, positions))


def _where(part: Answer, row: int, image_rows: np.ndarray) -> str:
    image = int(np.searchsorted(image_rows, part.regions_of.image[row]))
    return f"a region of IMAGE[{image}] (region row {row} of {part.regions_of.detector})"
