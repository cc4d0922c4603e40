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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence, Union

import numpy as np

from .children import ChildModel
from .device import HOST, Device
from .settings import Candidates

__all__ = ["Answer", "Batch", "ChildCallError", "ChildRequest", "Classify", "FlowError", "Infer", "NoModelReady",
           "Outputs", "Scores"]

log = logging.getLogger(__name__)

Models = Union[Candidates, str, None]  # an ordered candidate list, one model name, or None (the role is off)
Rows = Union[np.ndarray, Sequence[int], Sequence[bool], None]  # a boolean mask, row indices, or None (all)


class FlowError(RuntimeError):
    """The flow used the API wrongly (a model it did not declare, bad rows); the message says how."""


class NoModelReady(Exception):
    """Raise it from a flow when a role it cannot do without has no READY model: the runtime
    fails the pending requests with the models tried, in order."""


class ChildCallError(RuntimeError):
    """A child inference failed as a whole (model unloaded, server error, broken contract).

    unavailable: the model could not take the call at all (its stub died, it or that version
    is being unloaded): the runtime tries the call again, on the next READY candidate or on
    the same model once it is back, for up to child_retry_s, before it fails the requests.
    """

    def __init__(self, message: str, unavailable: bool = False):
        super().__init__(message)
        self.unavailable = unavailable


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


@dataclass(frozen=True)
class Infer:
    """Any model's call: its outputs by name, as Outputs."""

    models: Models
    rows: Rows = None
    flip: bool = False


def _fill(dtype: np.dtype):
    if dtype.kind == "f":
        return np.nan
    if dtype.kind in "iu":
        return -1
    if dtype.kind == "b":
        return False
    return b""


def _spread(size: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`values` for `rows`, placed in a full-length array (the other rows filled)."""
    full = np.full((size, *values.shape[1:]), _fill(values.dtype), dtype=values.dtype)
    full[rows] = values
    return full


def _mask(size: int, rows: np.ndarray) -> np.ndarray:
    mask = np.zeros(size, dtype=bool)
    mask[rows] = True
    return mask


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


class Outputs:
    """Any model's outputs for some rows: `outputs["NAME"]` is that output, one entry per row."""

    def __init__(self, model: str | None, size: int, rows: np.ndarray, values: dict[str, np.ndarray]):
        self.model, self.size, self.rows = model, size, rows
        self._values = values

    def __repr__(self) -> str:
        return f"Outputs({self.model!r}, {len(self.rows)} of {self.size} rows, {sorted(self._values)})"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._values)

    @property
    def covered(self) -> np.ndarray:
        return _mask(self.size, self.rows)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._values:
            raise FlowError(f"model {self.model} has no output {name!r}; its outputs: {', '.join(self._values)}")
        return _spread(self.size, self.rows, self._values[name])


class Answer:
    """The flow's answer, row by row: each row gets a classifier's Scores and a ROUTE, or
    ends early with a ROUTE and no labels. Later calls overwrite earlier ones, row by row."""

    _UNANSWERED, _SKIPPED = -1, -2

    def __init__(self, size: int):
        self.size = size
        self._sources: list[Scores] = []
        self._source = np.full(size, self._UNANSWERED, dtype=np.int64)  # index into _sources, or a marker
        self._routes = np.full(size, b"", dtype=object)

    @property
    def pending(self) -> np.ndarray:
        """Boolean mask of the rows not answered yet."""
        return self._source == self._UNANSWERED

    def set(self, scores: Scores | None, branch: str) -> "Answer":
        """Answer the rows `scores` covers with its labels; ROUTE "<model>:<branch>"."""
        if scores is None:
            raise FlowError(f"Answer.set(None, {branch!r}): that call found no READY model; check for None before answering with it")
        if len(scores.rows):
            self._source[scores.rows] = len(self._sources)
            self._sources.append(scores)
            self._routes[scores.rows] = f"{scores.source}:{branch}".encode()
        return self

    def skip(self, rows: Rows, route: str) -> "Answer":
        """End these rows here: no labels (empty strings, score 0, class -1), ROUTE `route`."""
        picked = _as_rows(self.size, rows)
        self._source[picked] = self._SKIPPED
        self._routes[picked] = route.encode()
        return self

    # ---- for the runtime ----------------------------------------------------------------
    def routes(self) -> np.ndarray:
        return self._routes

    def groups(self, rows: np.ndarray) -> list[tuple[np.ndarray, Scores | None]]:
        """`rows` split by where their answer came from: (positions within `rows`, Scores or
        None for skipped rows). Unanswered rows are not included."""
        out = []
        sources = self._source[rows]
        for value in np.unique(sources):
            if value == self._UNANSWERED:
                continue
            positions = np.flatnonzero(sources == value)
            out.append((positions, None if value == self._SKIPPED else self._sources[value]))
        return out


def _as_rows(size: int, rows: Rows) -> np.ndarray:
    """Row indices, ascending, from a boolean mask, indices or None (every row)."""
    if rows is None:
        return np.arange(size)
    picked = np.asarray(rows)
    if picked.dtype == bool:
        if picked.shape != (size,):
            raise FlowError(f"a boolean row mask needs one entry per row ({size}), got shape {picked.shape}")
        return np.flatnonzero(picked)
    if picked.size == 0:
        return np.empty(0, dtype=np.int64)
    if picked.dtype.kind not in "iu" or picked.ndim != 1:
        raise FlowError(f"rows must be a boolean mask or a 1-d array of row indices, got {picked.dtype} with shape {picked.shape}")
    if picked.min() < 0 or picked.max() >= size:
        raise FlowError(f"row indices must be in 0..{size - 1}, got {picked.min()}..{picked.max()}")
    return np.unique(picked)


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

    @property
    def kind(self) -> str:
        return "classifier" if isinstance(self.call, Classify) else "model"


class RunContext(Protocol):
    """What a Batch needs from the runtime for one execute() (engine._Run)."""

    rows: int
    device: Device
    retry_s: float  # child_retry_s

    def candidates(self, models: Models) -> tuple[str, ...]: ...
    def choose(self, candidates: tuple[str, ...], tried: tuple[str, ...], kind: str) -> str | None: ...
    def version(self, model: str) -> str: ...
    def still_ready(self, candidates: tuple[str, ...], tried: tuple[str, ...], model: str) -> bool: ...
    def lost(self, model: str) -> None: ...
    def answered(self, model: str) -> None: ...
    def retry_until(self, candidates: tuple[str, ...], failed: bool) -> float | None: ...
    def now(self) -> float: ...
    def pause(self) -> None: ...
    def child(self, name: str, classifier: bool = False) -> ChildModel: ...
    def inputs(self, child: ChildModel, rows: np.ndarray): ...
    def send(self, requests: list[ChildRequest]) -> Sequence: ...


class Batch:
    """The images of every request in one execute(), as rows, and the calls on them."""

    def __init__(self, run: RunContext):
        self._run = run
        self.size = run.rows

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"Batch({self.size} rows)"

    def answer(self) -> Answer:
        """An empty answer for these rows, to fill with Answer.set and Answer.skip."""
        return Answer(self.size)

    def classify(self, models: Models, rows: Rows = None, *, flip: bool = False) -> Scores | None:
        """The first READY of `models` classifies `rows` (all when None): one batched call.
        None when no candidate is READY (or `models` is None: the role is off)."""
        return self.together(Classify(models, rows, flip))[0]

    def infer(self, models: Models, rows: Rows = None, *, flip: bool = False) -> Outputs | None:
        """The first READY of `models` runs on `rows`: all its outputs. None as classify()."""
        return self.together(Infer(models, rows, flip))[0]

    def together(self, *calls: Classify | Infer) -> list[Scores | Outputs | None]:
        """Run these calls concurrently (their child requests in flight together); results
        in the same order, each as classify() or infer() would return it."""
        results: list[Scores | Outputs | None] = [None] * len(calls)
        todo = []
        for i, call in enumerate(calls):
            if not isinstance(call, (Classify, Infer)):
                raise FlowError(f"together() takes Classify(...) and Infer(...) calls, got {type(call).__name__}")
            candidates = self._run.candidates(call.models)
            rows = _as_rows(self.size, call.rows)
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
                    plan.chunks = self._chunks(plan)
                    sending.append(plan)
                elif self._keeps_waiting(plan):
                    waiting.append(plan)
            replies = iter(self._run.send([chunk for plan in sending for chunk in plan.chunks]))
            todo = []
            for plan in sending:
                parts = [next(replies) for _ in plan.chunks]
                failed = next((p for p in parts if isinstance(p, Exception)), None)
                if failed is None:
                    self._run.answered(plan.model)
                    results[plan.index] = self._result(plan, parts)
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
                    raise ChildCallError(f"{plan.kind} {plan.model} failed: {failed}")
                else:
                    log.warning("%s %s failed (%s); routing to the next ready one", plan.kind, plan.model, failed)
                    plan.tried += (plan.model,)
                    todo.append(plan)
            if waiting:
                self._run.pause()  # nothing READY for these yet: look again in a moment
                todo += waiting
        return results

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
                                 f"({', '.join(plan.candidates)}) answered within child_retry_s={self._run.retry_s:g} s")
        return False

    # ---- the runtime's side of a call -------------------------------------------------------
    def _chunks(self, plan: _Plan) -> list[ChildRequest]:
        child = self._run.child(plan.model, classifier=isinstance(plan.call, Classify))
        data = self._run.inputs(child, plan.rows)
        device = self._run.device
        if plan.call.flip:
            if child.preprocess is None:
                raise FlowError(f"flip=True needs pixels, but {child.name} takes the encoded images")
            data = device.flip(data, child.preprocess.width_axis)
        wanted = (child.scores_output.name,) if isinstance(plan.call, Classify) else tuple(o.name for o in child.outputs)
        # On a GPU device, outputs come back in its memory (strings cannot live there).
        strings = any(o.dtype in ("STRING", "BYTES") for o in child.outputs if o.name in wanted)
        gpu = None if strings else device.gpu
        step = child.max_batch_size
        return [ChildRequest(child.name, {child.input.name: data[i:i + step]}, wanted, gpu, plan.version)
                for i in range(0, len(data), step)]

    def _result(self, plan: _Plan, parts: list[Mapping[str, np.ndarray]] | None) -> Scores | Outputs:
        device = self._run.device
        if parts is None:  # a call on no rows: nothing sent
            child = self._run.child(plan.candidates[0], classifier=isinstance(plan.call, Classify))
            values = {o.name: np.empty((0, *[max(d, 0) for d in o.dims]), np.float32) for o in child.outputs}
            model = None
        else:
            child, model = self._run.child(plan.model), plan.model
            values = {name: parts[0][name] if len(parts) == 1 else device.concat([p[name] for p in parts])
                      for name in plan.chunks[0].outputs}
            for o in child.outputs:
                if o.name in values:
                    _check_output(child, o, values[o.name], len(plan.rows))
        if isinstance(plan.call, Classify):
            probs = device.probabilities(values[child.scores_output.name], child.scores)
            return Scores(model, child.labels, self.size, plan.rows, probs, device, plan.version if model else "")
        return Outputs(model, self.size, plan.rows, {name: device.to_host(v) for name, v in values.items()})


def _check_output(child: ChildModel, output, value, rows: int) -> None:
    """The batch contract: one output row per input row, with the dims the config declares."""
    expected = (rows, *output.dims)
    fits = value.ndim == len(expected) and all(e < 0 or e == v for e, v in zip(expected, value.shape))
    if not fits:
        raise ChildCallError(f"{child.name} returned {output.name} with shape {tuple(value.shape)} for a batch of {rows}; "
                             f"expected {tuple(expected)}")
