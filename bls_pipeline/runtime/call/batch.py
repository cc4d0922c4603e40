"""What a flow works with: the batch of images, the calls on it, the answer.

A flow sees every image of every request in one execute() as one batch of rows. Each
call below is ONE batched child request per model (chunked at the model's
max_batch_size), on all rows or on a selection; the runtime picks the first READY
candidate, feeds it its own input (encoded bytes, or pixels preprocessed its way) and
reroutes to the next candidate when the model went away mid-call (calls.py does that).
What a call gives back, Scores and Outputs, is scores.py; the answer, answer.py.

`batch.regions(found)` turns a detector's answer into a batch of its own (Regions): one
row per region, each knowing its image and box; every call works on it the same way, the
runtime cutting each region from the image decoded once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence, Union

import numpy as np

from ..answer.answer import Answer
from ..load.children import ChildModel
from ...base.tensors import TensorInfo
from ..decode.device import Device
from ..errors import ChildCallError, FlowError, NoModelReady
from .rows import Rows
from .scores import Column, Outputs, Scores
from ..load.fields import Candidates

__all__ = ["Answer", "Batch", "ChildCallError", "Classify", "Column", "FlowError", "Infer", "NoModelReady", "Outputs",
           "Regions", "RunContext", "Scores"]

# an ordered candidate list, one model name, or None (the role is off)
Models = Union[Candidates, Sequence[str], str, None]
# What a call feeds a child's tensor inputs, by input name: per row of the batch, a numpy
# array (one entry per row) or a Column (another call's output, left where it is).
Inputs = Union[Mapping[str, "np.ndarray | Column"], None]


@dataclass(frozen=True)
class Classify:
    """A classifier call: probabilities over its labels, as Scores."""

    models: Models
    rows: Rows = None
    flip: bool = False  # feed the rows mirrored left-right (test-time augmentation)
    inputs: Inputs = None  # tensors for inputs other than the image, by name (or instead of it)
    rotate: int = 0  # 180: feed the rows upside down (a text line the flow found reversed)
    # Rows the flow has answered already (True: all of them): skipped under overload, their
    # answer marked degraded (RuntimeSettings.overload; admission.py).
    optional: Rows | bool = None


@dataclass(frozen=True)
class Infer:
    """Any model's call: its outputs by name, as Outputs."""

    models: Models
    rows: Rows = None
    flip: bool = False
    inputs: Inputs = None
    rotate: int = 0
    optional: Rows | bool = None


class RunContext(Protocol):
    """What a Batch needs of the execute() it belongs to (execution.Execution): the same in
    LocalFlow and in the server, whose differences (the transport, readiness, the clock) sit
    below it."""

    rows: int  # images in the batch
    device: Device
    declared: Mapping[str, TensorInfo]  # the flow model's outputs, by name
    max_regions: int  # max_regions_per_image

    def child(self, name: str, classifier: bool = False) -> ChildModel: ...
    def together(self, batch: "Batch", calls: Sequence["Classify | Infer"]) -> list: ...
    def inputs(self, child: ChildModel, rows: np.ndarray): ...
    def images(self) -> tuple[Sequence, np.ndarray]: ...
    def crops(self, spec, images: np.ndarray, boxes: np.ndarray): ...
    def fail_images(self, rows: np.ndarray, message: str, reason: str) -> None: ...
    def fail_call(self, image_rows: np.ndarray, error: ChildCallError) -> None: ...
    def parameters(self, image_rows: np.ndarray): ...
    def time_left(self, image_rows: np.ndarray) -> np.ndarray: ...
    def request_ids(self, image_rows: np.ndarray) -> np.ndarray: ...


class Batch:
    """The images of every request in one execute(), as rows, and the calls on them."""

    def __init__(self, run: RunContext, size: int | None = None):
        self._run = run
        self.size = run.rows if size is None else size
        self._params = None

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"Batch({self.size} rows)"

    # ---- what each row's request carries ---------------------------------------------------
    @property
    def params(self):
        """The request parameters the flow declares (a Parameters class in flow.py), per row:
        `batch.params.NAME` is a numpy array, each row's request's value (or the default)."""
        if self._params is None:
            self._params = self._run.parameters(self._image_rows(np.arange(self.size)))
        return self._params

    def time_left(self) -> np.ndarray:
        """Seconds left, now, until each row's request's deadline (inf where it gave none). The
        runtime already drops rows whose time ran out; a flow reads this to skip an optional
        stage for rows short of time."""
        return self._run.time_left(self._image_rows(np.arange(self.size)))

    @property
    def request_id(self) -> np.ndarray:
        """Each row's request id, as the client sent it ("" when it sent none)."""
        return self._run.request_ids(self._image_rows(np.arange(self.size)))

    def answer(self) -> Answer:
        """An empty answer for these rows, to fill with Answer.set and Answer.skip."""
        return Answer(self.size, self._run.declared)

    def classify(self, models: Models, rows: Rows = None, *, flip: bool = False, inputs: Inputs = None,
                 rotate: int = 0, optional: Rows | bool = None) -> Scores | None:
        """The first READY of `models` classifies `rows` (all when None): one batched call.
        None when no candidate is READY (or `models` is None: the role is off).
        inputs: tensors for the child's inputs by name, one entry per row (another call's
        outputs, or values the flow computed); the child's image input, if not named there,
        gets the rows' pixels as usual. rotate=180 feeds the pixels upside down.
        optional: rows of `rows` the flow has answered already (True: all). Under overload
        (the call would end after their deadline, or latency_target_ms after their arrival;
        or the model refused the call for overload), the runtime skips them: the result does
        not cover them (`.skipped` says which), and where the flow answers with it
        (answer.set), their earlier answer stands, its ROUTE "<model>:degraded" and the
        reason in the JSON answer. With the flow's `overload` set to "refuse", no row is
        optional."""
        return self.together(Classify(models, rows, flip, inputs, rotate, optional))[0]

    def infer(self, models: Models, rows: Rows = None, *, flip: bool = False, inputs: Inputs = None,
              rotate: int = 0, optional: Rows | bool = None) -> Outputs | None:
        """The first READY of `models` runs on `rows`: all its outputs. None as classify()."""
        return self.together(Infer(models, rows, flip, inputs, rotate, optional))[0]

    def regions(self, found: Outputs | None, *, margin: float = 0.0, min_size: float = 0.0,
                min_score: float | None = None) -> "Regions":
        """The regions a detector found on these rows, as a batch of their own: one row per
        region, in row order (`found` is an infer() of a model whose config names its
        boxes_output). A row with no region adds none; found=None (no detector READY) gives
        no regions at all. Boxes that break a detector's contract (a bad shape or count) fail
        the requests of `found`'s rows, as a failed call would, and give no regions.

        margin: each region is cut with this fraction of its width and height added on
            every side (clipped to the image); its box stays the detector's.
        min_size: a region narrower or lower than this many pixels (of the image as sent)
            is marked `too_small` and never sent to a model; answer those rows yourself.
        min_score: boxes scoring under it are dropped (needs the detector's box scores).
        Bad boxes (non-finite, empty, inverted, outside) are clipped or dropped (boxes.py);
        an image with more than max_regions_per_image regions fails its own request."""
        from ..decode.boxes import found_boxes

        if not 0 <= margin <= 1 or min_size < 0:
            raise FlowError(f"regions(): margin must be within 0..1 and min_size >= 0, got margin={margin} "
                            f"min_size={min_size}")
        if found is None:
            return Regions._empty(self)
        if not isinstance(found, Outputs):
            raise FlowError(f"regions() takes a detector's Outputs (batch.infer(detector)), got {type(found).__name__}")
        if found.size != self.size:
            raise FlowError(f"regions(): those outputs are for a batch of {found.size} rows, this one has {self.size}")
        if found.model is None:
            return Regions._empty(self)
        child = self._run.child(found.model)
        if child.detector is None:
            raise FlowError(f"regions() needs a detector, and {child.name}'s config.pbtxt names no boxes_output "
                            "(with boxes_units, and box_scores_output / count_output if it has them)")
        if min_score is not None and child.detector.scores is None:
            raise FlowError(f"regions(min_score={min_score}) needs box scores, and {child.name}'s config.pbtxt names "
                            "no box_scores_output: name it, or filter the regions in the flow")
        values = {name: found.raw(name) for name in found.names}
        sources, scales = self._sources(found.rows)
        try:
            boxes = found_boxes(child, values, found.rows, sources, scales, min_score)
        except ChildCallError as exc:  # boxes that break a detector's contract: as a failed call
            self._run.fail_call(self._image_rows(found.rows), exc)
            return Regions._empty(self)
        return Regions._make(self, boxes, margin, min_size, child.name)

    def together(self, *calls: Classify | Infer) -> list[Scores | Outputs | None]:
        """Run these calls concurrently (their child requests in flight together); results
        in the same order, each as classify() or infer() would return it."""
        return self._run.together(self, calls)

    # ---- what the rows are made of (Regions overrides these) ---------------------------------
    def _sendable(self, rows: np.ndarray) -> np.ndarray:
        """The rows a call may send: all of them (regions leave out the too small)."""
        return rows

    def _pixels(self, child: ChildModel, rows: np.ndarray):
        """`child`'s image input for these rows (bytes, or pixels preprocessed its way)."""
        return self._run.inputs(child, rows)

    def _sources(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's box in the pixels of its image as decoded (here the whole image), and
        that image's pixels as sent per decoded pixel."""
        images, scales = self._run.images()
        sizes = np.array([_size(images[r]) for r in rows], dtype=np.float64).reshape(-1, 2)
        return np.concatenate([np.zeros_like(sizes), sizes], axis=1), scales[rows]

    def _image_rows(self, rows: np.ndarray) -> np.ndarray:
        """The image (row of the images' batch) each of these rows is on."""
        return rows


def _size(image) -> tuple[int, int]:
    """(width, height) of a decoded image: a PIL image, or a (C, H, W) tensor."""
    if hasattr(image, "width") and not hasattr(image, "shape"):
        return image.width, image.height
    return int(image.shape[-1]), int(image.shape[-2])


class Regions(Batch):
    """What a detector found, as a batch: one row per region. Every call works on it as on
    images (classify, infer, together, rows=, answer); the runtime cuts each region from its
    image (decoded once), preprocesses it the called model's own way, and sends every region
    of every image of the execute() in one batched request.

    image: the image (row of the images' batch) each region is on.
    parent: the row of the batch it was found in (its image, or a region: regions of regions).
    box: (n, 4) x0, y0, x1, y1 in the pixels of the image as sent (upright).
    score, class_id: the detector's, per region (NaN / -1 when it gives none).
    too_small: narrower or lower than min_size: never sent to a model.
    detector: the model that found them.
    """

    def __init__(self, parent: Batch, image: np.ndarray, parent_rows: np.ndarray, box: np.ndarray, crop: np.ndarray,
                 scale: np.ndarray, score: np.ndarray, class_id: np.ndarray, too_small: np.ndarray,
                 detector: str | None):
        super().__init__(parent._run, len(image))
        self.image, self.parent, self.box = image, parent_rows, box.astype(np.float32)
        self.score, self.class_id, self.too_small, self.detector = score, class_id, too_small, detector
        self._crop = crop  # (n, 4) float64: what is cut, in the pixels of the image as decoded
        self._scale = scale  # (n,) pixels as sent per decoded pixel
        self._cut: dict = {}  # spec -> the sendable rows' pixels for it

    def __repr__(self) -> str:
        return f"Regions({self.size} rows from {self.detector}, {int(self.too_small.sum())} too small)"

    @property
    def width(self) -> np.ndarray:
        return self.box[:, 2] - self.box[:, 0]

    @property
    def height(self) -> np.ndarray:
        return self.box[:, 3] - self.box[:, 1]

    def answer(self) -> Answer:
        return Answer(self.size, self._run.declared, regions=self)

    @classmethod
    def _empty(cls, parent: Batch) -> "Regions":
        none = np.empty(0, np.int64)
        return cls(parent, none, none, np.empty((0, 4)), np.empty((0, 4)), np.empty(0), np.empty(0, np.float32), none,
                   np.empty(0, bool), None)

    @classmethod
    def _make(cls, parent: Batch, found, margin: float, min_size: float, detector: str) -> "Regions":
        image = parent._image_rows(found.source)
        images, all_scales = parent._run.images()
        scale = all_scales[image]
        # Bounded: an image with more regions than max_regions_per_image fails its own request.
        limit = parent._run.max_regions
        counts = np.bincount(image, minlength=parent._run.rows) if len(image) else np.zeros(0, np.int64)
        over = np.flatnonzero(counts > limit)
        keep = ~np.isin(image, over)
        for img in over:
            parent._run.fail_images(np.array([img]), f"{detector} found {counts[img]} regions on it, over "
                                    f"max_regions_per_image={limit}", "too_many_regions")
        boxes = found.boxes[keep]
        size = np.array([_size(images[i]) for i in image[keep]], dtype=np.float64).reshape(-1, 2)
        w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        crop = np.stack([np.maximum(boxes[:, 0] - margin * w, 0), np.maximum(boxes[:, 1] - margin * h, 0),
                         np.minimum(boxes[:, 2] + margin * w, size[:, 0]),
                         np.minimum(boxes[:, 3] + margin * h, size[:, 1])],
                        axis=1)
        shown = boxes * scale[keep][:, None]
        too_small = ((shown[:, 2] - shown[:, 0]) < min_size) | ((shown[:, 3] - shown[:, 1]) < min_size)
        return cls(parent, image[keep], found.source[keep], shown, crop, scale[keep], found.scores[keep],
                   found.classes[keep], too_small, detector)

    # ---- what the rows are made of -----------------------------------------------------------
    def _sendable(self, rows: np.ndarray) -> np.ndarray:
        return rows[~self.too_small[rows]]

    def _image_rows(self, rows: np.ndarray) -> np.ndarray:
        return self.image[rows]

    def _sources(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._crop[rows], self._scale[rows]

    def _pixels(self, child: ChildModel, rows: np.ndarray):
        spec = child.preprocess
        if spec is None:
            raise FlowError(f"regions are cut from the decoded image, and {child.name} takes encoded bytes: give it a "
                            "pixel input (TYPE_FP32/FP16/UINT8 dims [C,H,W] or [H,W,C])")
        sendable = np.flatnonzero(~self.too_small)
        if spec not in self._cut:
            self._cut[spec] = self._run.crops(spec, self.image[sendable], self._crop[sendable])
        cut = self._cut[spec]
        if len(rows) == len(sendable):
            return cut
        return self._run.device.take(cut, np.searchsorted(sendable, rows))
