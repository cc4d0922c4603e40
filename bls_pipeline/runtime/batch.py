"""What a flow works with: the batch of images, calls on it, their results, the answer.

A flow sees every image of every request in one execute() as one batch of rows. Each
call below is ONE batched child request per model (chunked at the model's
max_batch_size), on all rows or on a selection; the runtime picks the first READY
candidate, feeds it its own input (encoded bytes, or pixels preprocessed its way) and
reroutes to the next candidate when the model went away mid-call.

Every per-row array a flow sees has one entry per row of the batch; rows a call did not
cover hold NaN (floats), -1 (integers), b"" (bytes) or False (booleans). So masks
combine with `&`, `|` and `~` and go straight back into `rows=`. They are numpy arrays on
the host whatever the device: on a GPU, the probabilities stay there, and only what the
flow reads (top-1, its class, a model's raw outputs) is copied out.

`batch.regions(found)` turns a detector's answer into a batch of its own (Regions): one
row per region, each knowing its image and box; every call above works on it the same
way, the runtime cutting each region from the image decoded once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol, Sequence, Union

import numpy as np

from .answer import Answer, numpy_dtype
from .rows import Rows, _as_rows, _mask, _spread
from .children import ChildModel, TensorInfo
from .device import HOST, Device
from .errors import ChildCallError, FlowError, NoModelReady
from .settings import Candidates

__all__ = ["Answer", "Batch", "ChildCallError", "ChildRequest", "Classify", "Column", "FlowError", "Infer",
           "NoModelReady", "Outputs", "Regions", "Scores"]

log = logging.getLogger(__name__)

Models = Union[Candidates, str, None]  # an ordered candidate list, one model name, or None (the role is off)
# What a call feeds a child's tensor inputs, by input name: per row of the batch, a numpy
# array (one entry per row) or a Column (another call's output, left where it is).
Inputs = Union[Mapping[str, "np.ndarray | Column"], None]


@dataclass(frozen=True)
class ChildRequest:
    """One batched request to a child model: what a transport sends."""

    model: str
    inputs: dict[str, np.ndarray]  # or CUDA tensors, on a GPU device (they cross as DLPack)
    outputs: tuple[str, ...]
    output_gpu: int | None = None  # ask for the outputs in this GPU's memory (None: wherever the child puts them)
    version: str = ""  # the model version to call ("": the one Triton picks, its newest READY)


# Sends every request (concurrently when there are several) and returns, in order, each one's
# outputs by name, or the ChildCallError it failed with.
Send = Callable[[Sequence[ChildRequest]], Sequence[Union[Mapping[str, np.ndarray], ChildCallError]]]


@dataclass(frozen=True)
class Classify:
    """A classifier call: probabilities over its labels, as Scores."""

    models: Models
    rows: Rows = None
    flip: bool = False  # feed the rows mirrored left-right (test-time augmentation)
    inputs: Inputs = None  # tensors for inputs other than the image, by name (or instead of it)
    rotate: int = 0  # 180: feed the rows upside down (a text line the flow found reversed)


@dataclass(frozen=True)
class Infer:
    """Any model's call: its outputs by name, as Outputs."""

    models: Models
    rows: Rows = None
    flip: bool = False
    inputs: Inputs = None
    rotate: int = 0


class Scores:
    """A classifier's answer for some rows of the batch: probabilities over its labels.

    model: the model that answered (None when the call had no rows).
    version: its version that answered ("" when not known).
    rows: the rows covered, ascending.
    """

    def __init__(self, model: str | None, labels: tuple[str, ...], size: int, rows: np.ndarray, probs,
                 device: Device = HOST, version: str = ""):
        self.model, self.labels, self.size, self.rows, self.version = model, labels, size, rows, version
        self._probs = probs  # (len(rows), classes) float32, on `device` (numpy, or a tensor)
        self._device = device

    def __repr__(self) -> str:
        return f"Scores({self.source!r}, {len(self.rows)} of {self.size} rows, {len(self.labels)} classes)"

    @property
    def source(self) -> str | None:
        """What ROUTE names: the model, and "@<version>" when a version other than 1 answered
        (e.g. resnet50_onnx@2 during a rollout); "a+b" for an average of two."""
        if self.model is None or self.version in ("", "1") or "+" in self.model:
            return self.model
        return f"{self.model}@{self.version}"

    @property
    def covered(self) -> np.ndarray:
        """Boolean mask of the rows this call answered."""
        return _mask(self.size, self.rows)

    @property
    def probs(self) -> np.ndarray:
        """(rows, classes) probabilities (copied to the host from a GPU)."""
        return _spread(self.size, self.rows, self._device.to_host(self._probs))

    @property
    def top1(self) -> np.ndarray:
        """Each row's highest probability."""
        return _spread(self.size, self.rows, self._device.top1(self._probs))

    @property
    def top1_class(self) -> np.ndarray:
        """Each row's most probable class index."""
        return _spread(self.size, self.rows, self._device.top1_class(self._probs))

    def probs_for(self, rows: np.ndarray):
        """(len(rows), classes) probabilities of these rows, all covered, on the device (for
        the runtime's top-k)."""
        return self._device.take(self._probs, np.searchsorted(self.rows, rows))

    def __getitem__(self, rows: Rows) -> "Scores":
        """These rows only (those this call covered)."""
        keep = np.isin(self.rows, _as_rows(self.size, rows))
        return Scores(self.model, self.labels, self.size, self.rows[keep], self._device.take(self._probs, np.flatnonzero(keep)),
                      self._device, self.version)

    def mean(self, other: "Scores") -> "Scores":
        """The average of two answers' probabilities, on the rows both cover. Its model is
        this one's when both came from the same model and version, else "<this>+<other>"."""
        if len(self.labels) != len(other.labels):
            raise FlowError(f"cannot average {self.model} ({len(self.labels)} classes) with {other.model} ({len(other.labels)})")
        rows = np.intersect1d(self.rows, other.rows)
        mine, theirs = np.searchsorted(self.rows, rows), np.searchsorted(other.rows, rows)
        same = other.model is None or (other.model, other.version) == (self.model, self.version)
        model, version = (self.model, self.version) if same else (f"{self.source}+{other.source}", "")
        take = self._device.take
        return Scores(model, self.labels, self.size, rows, (take(self._probs, mine) + take(other._probs, theirs)) / 2,
                      self._device, version)


class Column:
    """One output of a call, for the rows it covered, left where the call put it (on a GPU
    flow instance, in GPU memory): `inputs={"features": outputs.tensor("features")}` hands it
    to the next child as it is (DLPack, no copy to the host)."""

    def __init__(self, model: str | None, name: str, size: int, rows: np.ndarray, value):
        self.model, self.name, self.size, self.rows, self.value = model, name, size, rows, value

    def __repr__(self) -> str:
        return f"Column({self.model!r}.{self.name}, {len(self.rows)} of {self.size} rows)"


class Outputs:
    """Any model's outputs for some rows: `outputs["NAME"]` is that output, one entry per row."""

    def __init__(self, model: str | None, size: int, rows: np.ndarray, values: dict[str, np.ndarray],
                 device: Device = HOST):
        self.model, self.size, self.rows = model, size, rows
        self._values = values  # on the device (numpy on the host)
        self._device = device
        self._host: dict[str, np.ndarray] = {}

    def __repr__(self) -> str:
        return f"Outputs({self.model!r}, {len(self.rows)} of {self.size} rows, {sorted(self._values)})"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._values)

    @property
    def covered(self) -> np.ndarray:
        return _mask(self.size, self.rows)

    def _check(self, name: str) -> None:
        if name not in self._values:
            raise FlowError(f"model {self.model} has no output {name!r}; its outputs: {', '.join(self._values)}")

    def __getitem__(self, name: str) -> np.ndarray:
        self._check(name)
        if name not in self._host:
            self._host[name] = _spread(self.size, self.rows, self._device.to_host(self._values[name]))
        return self._host[name]

    def raw(self, name: str) -> np.ndarray:
        """That output for the covered rows only, on the host (len(rows) entries)."""
        self._check(name)
        return self._device.to_host(self._values[name])

    def tensor(self, name: str) -> Column:
        """That output as a Column, to feed another child's input without a copy."""
        self._check(name)
        return Column(self.model, name, self.size, self.rows, self._values[name])


@dataclass
class _Plan:
    """One call on its way: which candidates, which rows, which model now, which failed."""

    index: int
    call: Classify | Infer
    candidates: tuple[str, ...]
    rows: np.ndarray
    tried: tuple[str, ...] = ()
    model: str | None = None
    version: str = ""
    chunks: list[ChildRequest] = field(default_factory=list)
    failure: tuple[str, ChildCallError] | None = None  # the last model that could not take the call, and why
    retry_until: float | None = None  # retrying: give up at this time (the runtime's clock)
    canary_of: str | None = None  # sent to a canary instead of this (stable) model
    no_canary: bool = False  # its canary failed: the stable model answers

    @property
    def kind(self) -> str:
        return "classifier" if isinstance(self.call, Classify) else "model"


class RunContext(Protocol):
    """What a Batch needs from the runtime for one execute() (engine._Run)."""

    rows: int
    device: Device
    retry_s: float  # child_retry_s
    max_regions: int  # max_regions_per_image
    declared: Mapping[str, TensorInfo]  # the flow model's outputs, by name

    def candidates(self, models: Models) -> tuple[str, ...]: ...
    def choose(self, candidates: tuple[str, ...], tried: tuple[str, ...], kind: str) -> str | None: ...
    def version(self, model: str) -> str: ...
    def still_ready(self, candidates: tuple[str, ...], tried: tuple[str, ...], model: str) -> bool: ...
    def role(self, candidates: tuple[str, ...]) -> str: ...
    def unready(self, candidates: tuple[str, ...]) -> None: ...
    def lost(self, model: str) -> None: ...
    def answered(self, model: str) -> None: ...
    def retry_until(self, candidates: tuple[str, ...], failed: bool) -> float | None: ...
    def now(self) -> float: ...
    def pause(self) -> None: ...
    def child(self, name: str, classifier: bool = False) -> ChildModel: ...
    def inputs(self, child: ChildModel, rows: np.ndarray): ...
    def send(self, requests: list[ChildRequest]) -> Sequence: ...
    def images(self) -> tuple[Sequence, np.ndarray]: ...
    def crops(self, spec, images: np.ndarray, boxes: np.ndarray): ...
    def fail_images(self, rows: np.ndarray, message: str, reason: str) -> None: ...
    def canary_for(self, model: str) -> Any: ...
    def shadow_for(self, model: str) -> Any: ...
    def mirror(self, shadow: Any, chunks: list[ChildRequest], to_probs: Callable[[Any], np.ndarray]) -> Any: ...


class Batch:
    """The images of every request in one execute(), as rows, and the calls on them."""

    def __init__(self, run: RunContext, size: int | None = None):
        self._run = run
        self.size = run.rows if size is None else size

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"Batch({self.size} rows)"

    def answer(self) -> Answer:
        """An empty answer for these rows, to fill with Answer.set and Answer.skip."""
        return Answer(self.size, self._run.declared)

    def classify(self, models: Models, rows: Rows = None, *, flip: bool = False, inputs: Inputs = None,
                 rotate: int = 0) -> Scores | None:
        """The first READY of `models` classifies `rows` (all when None): one batched call.
        None when no candidate is READY (or `models` is None: the role is off).
        inputs: tensors for the child's inputs by name, one entry per row (another call's
        outputs, or values the flow computed); the child's image input, if not named there,
        gets the rows' pixels as usual. rotate=180 feeds the pixels upside down."""
        return self.together(Classify(models, rows, flip, inputs, rotate))[0]

    def infer(self, models: Models, rows: Rows = None, *, flip: bool = False, inputs: Inputs = None,
              rotate: int = 0) -> Outputs | None:
        """The first READY of `models` runs on `rows`: all its outputs. None as classify()."""
        return self.together(Infer(models, rows, flip, inputs, rotate))[0]

    def regions(self, found: Outputs | None, *, margin: float = 0.0, min_size: float = 0.0,
                min_score: float | None = None) -> "Regions":
        """The regions a detector found on these rows, as a batch of their own: one row per
        region, in row order (`found` is an infer() of a model whose config names its
        boxes_output). A row with no region adds none; found=None (no detector READY) gives
        no regions at all.

        margin: each region is cut with this fraction of its width and height added on
            every side (clipped to the image); its box stays the detector's.
        min_size: a region narrower or lower than this many pixels (of the image as sent)
            is marked `too_small` and never sent to a model; answer those rows yourself.
        min_score: boxes scoring under it are dropped (needs the detector's box scores).
        Bad boxes (non-finite, empty, inverted, outside) are clipped or dropped (boxes.py);
        an image with more than max_regions_per_image regions fails its own request."""
        from .boxes import found_boxes

        if not 0 <= margin <= 1 or min_size < 0:
            raise FlowError(f"regions(): margin must be within 0..1 and min_size >= 0, got margin={margin} min_size={min_size}")
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
            raise FlowError(f"regions(min_score={min_score}) needs box scores, and {child.name}'s config.pbtxt names no "
                            "box_scores_output: name it, or filter the regions in the flow")
        values = {name: found.raw(name) for name in found.names}
        sources, scales = self._sources(found.rows)
        boxes = found_boxes(child, values, found.rows, sources, scales, min_score)
        return Regions._make(self, boxes, margin, min_size, child.name)

    def together(self, *calls: Classify | Infer) -> list[Scores | Outputs | None]:
        """Run these calls concurrently (their child requests in flight together); results
        in the same order, each as classify() or infer() would return it."""
        results: list[Scores | Outputs | None] = [None] * len(calls)
        todo = []
        for i, call in enumerate(calls):
            if not isinstance(call, (Classify, Infer)):
                raise FlowError(f"together() takes Classify(...) and Infer(...) calls, got {type(call).__name__}")
            if call.rotate not in (0, 180):
                raise FlowError(f"rotate={call.rotate!r}: write 0 or 180")
            candidates = self._run.candidates(call.models)
            rows = self._sendable(_as_rows(self.size, call.rows))
            if not candidates:
                continue
            if len(rows) == 0:
                results[i] = self._result(_Plan(i, call, candidates, rows), None)
                continue
            todo.append(_Plan(i, call, candidates, rows))
        while todo:
            sending, waiting = [], []
            for plan in todo:
                plan.model = self._run.choose(plan.candidates, plan.tried, plan.kind)
                if plan.model is not None:
                    plan.version = self._run.version(plan.model)
                    canary = None if plan.no_canary else self._run.canary_for(plan.model)
                    plan.canary_of = None
                    if canary is not None:  # this call answered by the candidate instead
                        plan.canary_of, plan.model, plan.version = plan.model, canary.model, canary.version
                    plan.chunks = self._chunks(plan)
                    sending.append(plan)
                elif self._keeps_waiting(plan):
                    waiting.append(plan)
            mirrored = {}
            try:  # inside: a mirror started (its slot taken) is always handed a stable answer
                for plan in sending:
                    mirrored[plan.index] = self._mirror(plan)
                todo = self._receive(sending, mirrored, results)
            finally:
                for handle in mirrored.values():  # a call that raised: its mirror has nothing to compare with
                    if handle is not None and not handle.done:
                        handle.stable(None, 0.0)
            if waiting:
                self._run.pause()  # nothing READY for these yet: look again in a moment
                todo += waiting
        return results

    def _receive(self, sending: list[_Plan], mirrored: dict, results: list) -> list[_Plan]:
        """Send the planned calls together; answer those that came back, return those to send again."""
        t0 = time.perf_counter()
        replies = iter(self._run.send([chunk for plan in sending for chunk in plan.chunks]))
        seconds = time.perf_counter() - t0
        todo = []
        for plan in sending:
            parts = [next(replies) for _ in plan.chunks]
            failed = next((p for p in parts if isinstance(p, Exception)), None)
            shadow = mirrored[plan.index]
            if failed is None:
                self._run.answered(plan.model)
                results[plan.index] = self._result(plan, parts)
                if shadow is not None:
                    shadow.stable(self._run.device.to_host(results[plan.index]._probs), seconds)
                continue
            if shadow is not None:
                shadow.stable(None, seconds)
            if plan.canary_of is not None:
                # A failed canary is not the stable model's failure: the call goes to it.
                log.warning("canary %s failed (%s); the call goes to %s", plan.model, failed, plan.canary_of)
                plan.no_canary, plan.model = True, None
                todo.append(plan)
            elif getattr(failed, "unavailable", False):
                # The model could not take the call (Triton 2.51 still calls a model READY
                # whose stub died): try the next READY candidate, or this one again once it
                # (or another version of it) is back.
                log.warning("%s %s could not take the call (%s); retrying", plan.kind, plan.model, failed)
                self._run.lost(plan.model)
                plan.failure = (plan.model, failed)
                if plan.retry_until is None:
                    plan.retry_until = self._run.retry_until(plan.candidates, True)
                if self._run.still_ready(plan.candidates, plan.tried, plan.model) and self._run.version(plan.model) == plan.version:
                    plan.tried += (plan.model,)
                todo.append(plan)
            elif self._run.still_ready(plan.candidates, plan.tried, plan.model):
                # Its own failure names the model (broken: INTERNAL); an overloaded one, the role.
                busy = getattr(failed, "busy", False)
                raise ChildCallError(f"{plan.kind} {plan.model} failed: {failed}", busy=busy, model=plan.model,
                                     role=self._run.role(plan.candidates) if busy else None)
            else:
                log.warning("%s %s failed (%s); routing to the next ready one", plan.kind, plan.model, failed)
                plan.tried += (plan.model,)
                todo.append(plan)
        return todo

    def _mirror(self, plan: _Plan):
        """Start the shadow's mirrored call of a classify() call to its stable model (same rows,
        same inputs), or None; the handle takes the stable answer when it is back."""
        if not isinstance(plan.call, Classify) or plan.canary_of is not None:
            return None
        shadow = self._run.shadow_for(plan.model)
        if shadow is None:
            return None
        trial = shadow.trial
        mirror = replace(plan, model=trial.model, version=trial.version, chunks=[])
        try:
            mirror.chunks = self._chunks(mirror)
        except Exception as exc:  # noqa: BLE001 - e.g. the candidate's inputs differ: counted as a failed mirror
            error = exc  # `exc` is unbound when the except block ends; the lambda runs later
            return shadow.mirror(lambda: error, lambda parts: None, background=False)
        device = self._run.device
        return self._run.mirror(shadow, mirror.chunks, lambda parts: device.to_host(self._result(mirror, parts)._probs))

    def _keeps_waiting(self, plan: _Plan) -> bool:
        """No candidate left for this call: wait for one (True), give up as "none READY" (False),
        or fail the call (raises) when its model could not take it and nothing came back in time.

        The runtime waits only for a model it saw go away, for at most child_retry_s."""
        if plan.retry_until is None:
            plan.retry_until = self._run.retry_until(plan.candidates, False)
        if plan.retry_until is not None and self._run.now() < plan.retry_until:
            plan.tried = ()  # every candidate may be back: each is looked at again
            return True
        if plan.failure is not None:
            model, error = plan.failure
            raise ChildCallError(f"{plan.kind} {model} could not take the call ({error}), and no candidate "
                                 f"({', '.join(plan.candidates)}) answered within child_retry_s={self._run.retry_s:g} s",
                                 unavailable=True, model=model, role=self._run.role(plan.candidates))
        self._run.unready(plan.candidates)
        return False

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

    # ---- the runtime's side of a call -------------------------------------------------------
    def _chunks(self, plan: _Plan) -> list[ChildRequest]:
        child = self._run.child(plan.model, classifier=isinstance(plan.call, Classify))
        device = self._run.device
        feeds = self._tensor_inputs(child, plan.call.inputs or {}, plan.rows)
        if child.image is not None and child.image.name not in feeds:
            data = self._pixels(child, plan.rows)
            if plan.call.flip or plan.call.rotate:
                if child.preprocess is None:
                    raise FlowError(f"flip=True and rotate=180 need pixels, but {child.name} takes the encoded images")
                axis = child.preprocess.width_axis
                data = device.flip(data, (axis - 1, axis) if plan.call.rotate else axis)
                if plan.call.rotate and plan.call.flip:
                    data = device.flip(data, axis)
            feeds[child.image.name] = data
        missing = [t.name for t in child.inputs if not t.optional and t.name not in feeds]
        if missing:
            raise FlowError(f"model {child.name} needs input(s) {', '.join(missing)}, which are not images: pass them "
                            f"by name, e.g. inputs={{{missing[0]!r}: outputs.tensor(...)}}")
        wanted = (child.scores_output.name,) if isinstance(plan.call, Classify) else tuple(o.name for o in child.outputs)
        # On a GPU device, outputs come back in its memory (strings cannot live there).
        strings = any(o.dtype in ("STRING", "BYTES") for o in child.outputs if o.name in wanted)
        gpu = None if strings else device.gpu
        step = child.max_batch_size
        return [ChildRequest(child.name, {name: value[i:i + step] for name, value in feeds.items()}, wanted, gpu, plan.version)
                for i in range(0, len(plan.rows), step)]

    def _tensor_inputs(self, child: ChildModel, given: Mapping, rows: np.ndarray) -> dict:
        """The flow's tensors for `child`'s inputs, these rows, checked against its config."""
        feeds = {}
        for name, value in given.items():
            info = child.input_named(name)
            if info is None:
                raise FlowError(f"inputs={{{name!r}: ...}}: model {child.name} has no input {name!r}; its inputs: "
                                f"{', '.join(t.name for t in child.inputs)}")
            if isinstance(value, Column):
                if value.size != self.size:
                    raise FlowError(f"inputs[{name!r}]: {value} is for a batch of {value.size} rows, this one has {self.size}")
                missing = np.setdiff1d(rows, value.rows)
                if len(missing):
                    raise FlowError(f"inputs[{name!r}]: {value} does not cover row(s) {missing[:10].tolist()} of this call")
                data = value.value if len(value.rows) == len(rows) and (value.rows == rows).all() else \
                    self._run.device.take(value.value, np.searchsorted(value.rows, rows))
            else:
                array = np.asarray(value)
                if array.shape[:1] != (self.size,):
                    raise FlowError(f"inputs[{name!r}]: give one entry per row of the batch ({self.size}), got shape "
                                    f"{array.shape}")
                data = array[rows]
            feeds[name] = _conform(child, info, data)
        return feeds

    def _result(self, plan: _Plan, parts: list[Mapping[str, np.ndarray]] | None) -> Scores | Outputs:
        device = self._run.device
        if parts is None:  # a call on no rows: nothing sent
            child = self._run.child(plan.candidates[0], classifier=isinstance(plan.call, Classify))
            values = {o.name: np.empty((0, *[max(d, 0) for d in o.dims]), numpy_dtype(o.dtype)) for o in child.outputs}
            model = None
        else:
            child, model = self._run.child(plan.model), plan.model
            values = {name: parts[0][name] if len(parts) == 1 else _concat(device, [p[name] for p in parts])
                      for name in plan.chunks[0].outputs}
            for o in child.outputs:
                if o.name in values:
                    _check_output(child, o, values[o.name], len(plan.rows))
        if isinstance(plan.call, Classify):
            probs = device.probabilities(values[child.scores_output.name], child.scores)
            return Scores(model, child.labels, self.size, plan.rows, probs, device, plan.version if model else "")
        return Outputs(model, self.size, plan.rows, values, device)


def _concat(device: Device, parts: list):
    """Chunks of one output back together; outputs of varying dims (a detector's boxes per
    row) are padded to the largest with zeros first."""
    shapes = {tuple(getattr(p, "shape", ())[1:]) for p in parts}
    if len(shapes) > 1 and all(isinstance(p, np.ndarray) for p in parts):
        widest = tuple(max(s[i] for s in shapes) for i in range(len(next(iter(shapes)))))
        parts = [np.pad(p, [(0, 0)] + [(0, w - d) for w, d in zip(widest, p.shape[1:])]) for p in parts]
    return device.concat(parts)


def _size(image) -> tuple[int, int]:
    """(width, height) of a decoded image: a PIL image, or a (C, H, W) tensor."""
    if hasattr(image, "width") and not hasattr(image, "shape"):
        return image.width, image.height
    return int(image.shape[-1]), int(image.shape[-2])


_KINDS = {"FP": "f", "IN": "iu", "UI": "iu", "BO": "b"}


def _conform(child: ChildModel, info: TensorInfo, data):
    """A tensor input as `child`'s config declares it: its dims, its dtype (a value of the
    same kind is cast, e.g. float64 to FP32; another kind is refused)."""
    shape = tuple(data.shape[1:])
    if len(shape) != len(info.dims) or any(d >= 0 and d != s for d, s in zip(info.dims, shape)):
        raise FlowError(f"inputs[{info.name!r}] has dims {list(shape)} per row; model {child.name} declares "
                        f"{list(info.dims)} (TYPE_{info.dtype})")
    if not isinstance(data, np.ndarray):  # a tensor left on the device (torch): its dtype must match already
        if str(data.dtype).replace("torch.", "") != np.dtype(numpy_dtype(info.dtype)).name:
            raise FlowError(f"inputs[{info.name!r}] is {data.dtype}; model {child.name} declares TYPE_{info.dtype}")
        return data
    if info.dtype in ("STRING", "BYTES"):
        if data.dtype.kind not in "OSU":
            raise FlowError(f"inputs[{info.name!r}] is {data.dtype}; model {child.name} declares TYPE_{info.dtype} (bytes or str)")
        return np.array([v.encode() if isinstance(v, str) else v for v in data.reshape(-1)], dtype=object).reshape(data.shape)
    want = np.dtype(numpy_dtype(info.dtype))
    if data.dtype == want:
        return data
    if data.dtype.kind not in _KINDS.get(info.dtype[:2], want.kind):
        raise FlowError(f"inputs[{info.name!r}] is {data.dtype}; model {child.name} declares TYPE_{info.dtype}: "
                        f"convert it (e.g. .astype(np.{want.name}))")
    return data.astype(want)


def _check_output(child: ChildModel, output, value, rows: int) -> None:
    """The batch contract: one output row per input row, with the dims and the data type the
    config declares. A child that breaks it is broken, not busy: its callers fail as INTERNAL."""
    expected = (rows, *output.dims)
    fits = value.ndim == len(expected) and all(e < 0 or e == v for e, v in zip(expected, value.shape))
    if not fits:
        raise ChildCallError(f"{child.name} returned {output.name} with shape {tuple(value.shape)} for a batch of {rows}; "
                             f"its config.pbtxt declares dims {list(output.dims)}, so expected {tuple(expected)}",
                             model=child.name)
    got = _dtype_name(value)
    if got != ("STRING" if output.dtype == "BYTES" else output.dtype):
        raise ChildCallError(f"{child.name} returned {output.name} as {got}; its config.pbtxt declares TYPE_{output.dtype}",
                             model=child.name)


def _dtype_name(value) -> str:
    """A returned array's data type in Triton's words (FP32, STRING...), numpy or torch."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "OSU":
        return "STRING"
    name = value.dtype.name if isinstance(value, np.ndarray) else str(value.dtype).replace("torch.", "")
    return _TRITON_TYPES.get(name, name)


_TRITON_TYPES = {"float32": "FP32", "float16": "FP16", "float64": "FP64", "bfloat16": "BF16", "int8": "INT8",
                 "int16": "INT16", "int32": "INT32", "int64": "INT64", "uint8": "UINT8", "uint16": "UINT16",
                 "uint32": "UINT32", "uint64": "UINT64", "bool": "BOOL"}


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
                 scale: np.ndarray, score: np.ndarray, class_id: np.ndarray, too_small: np.ndarray, detector: str | None):
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
                         np.minimum(boxes[:, 2] + margin * w, size[:, 0]), np.minimum(boxes[:, 3] + margin * h, size[:, 1])],
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
