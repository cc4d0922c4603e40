"""How a flow's calls reach its children: planned, chunked, sent together, received, rerouted,
retried, mirrored. What the flow sees of it is batch.py; this is the machinery under it.

One call (a Classify or an Infer on some rows of a batch) becomes one batched child
request, chunked at the child's max_batch_size; the calls of one `together` are sent at
once. The first READY candidate answers (routing.Router); a call whose model could not take
it is sent again to the next READY candidate, or to the same model once it is back, for up
to child_retry_s; a canary may answer instead of the stable model, a shadow mirror it.
Outputs are checked against the child's config (one row per row sent, its dims and data
type) before the flow sees them. A call that fails for good (a broken child, an overloaded
one, none back in time) fails the requests with a row in it and no others; the flow gets
its result on no rows and goes on for the rest.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Protocol, Sequence, Union

import numpy as np

from ..admit.admission import Skipped
from ...base.dtypes import numpy_dtype, triton_dtype
from ...base.messages import BATCH_LIMIT, first_line
from ..load.children import ChildModel
from ...base.tensors import TensorInfo
from ..decode.device import Device
from ..errors import ChildCallError, FlowError
from .routing import Router
from .batch import Classify, Infer, Models
from .rows import _as_rows
from .scores import Column, Outputs, Scores

__all__ = ["Calls", "ChildRequest", "Send"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChildRequest:
    """One batched request to a child model: what a transport sends."""

    model: str
    inputs: dict[str, np.ndarray]  # or CUDA tensors, on a GPU device (they cross as DLPack)
    outputs: tuple[str, ...]
    output_gpu: int | None = None  # ask for the outputs in this GPU's memory (None: in host memory)
    version: str = ""  # the model version to call ("": the one Triton picks, its newest READY)
    # The most time left among the requests it serves (None: one has no deadline): sent as the
    # request's timeout, so a child's queue lets it go once nobody waits for it.
    timeout_s: float | None = None


# Sends every request (concurrently when there are several) and returns, in order, each one's
# outputs by name, or the ChildCallError it failed with.
Send = Callable[[Sequence[ChildRequest]], Sequence[Union[Mapping[str, np.ndarray], ChildCallError]]]

class CallTarget(Protocol):
    """The batch a call is on: its size, which rows may be sent, and their image input for a child."""

    size: int

    def _sendable(self, rows: np.ndarray) -> np.ndarray: ...
    def _pixels(self, child: ChildModel, rows: np.ndarray): ...
    def _image_rows(self, rows: np.ndarray) -> np.ndarray: ...


class CallContext(Protocol):
    """What the calls need of the execute() they belong to (execution.Execution)."""

    device: Device
    children: Mapping[str, ChildModel]
    transport: Send  # the server's (or LocalFlow's) send, untimed: mirrored calls use it

    def child(self, name: str, classifier: bool = False) -> ChildModel: ...
    def lower_batch(self, model: str, limit: int) -> None: ...
    def send(self, requests: list[ChildRequest]) -> Sequence: ...
    def unready(self, role: str, candidates: tuple[str, ...], kind: str) -> None: ...
    def fail_call(self, image_rows: np.ndarray, error: ChildCallError) -> None: ...
    def keep_waiting(self, image_rows: np.ndarray, stage: str,
                     optional: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
    def pending(self, image_rows: np.ndarray) -> np.ndarray: ...
    def degrades(self) -> bool: ...
    def timeout_for(self, image_rows: np.ndarray, optional: np.ndarray | None = None) -> float | None: ...


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
    retry_until: float | None = None  # retrying: give up at this time (the router's clock)
    canary_of: str | None = None  # sent to a canary instead of this (stable) model
    no_canary: bool = False  # its canary failed: the stable model answers
    optional: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # rows it may skip under overload
    skipped: list[Skipped] = field(default_factory=list)  # optional rows it left out, and why

    @property
    def kind(self) -> str:
        return "classifier" if isinstance(self.call, Classify) else "model"

    def optional_mask(self) -> np.ndarray:
        """Which of its rows (now) it may skip."""
        return np.isin(self.rows, self.optional)


class Calls:
    """The child calls of one execute(). trials: a shadow and a canary apply (not to probes)."""

    def __init__(self, execution: CallContext, router: Router, trials: bool = True):
        self._exec, self._router, self._trials = execution, router, trials
        self._device = execution.device

    def together(self, batch: CallTarget, calls: Sequence[Classify | Infer]) -> list[Scores | Outputs | None]:
        """Run these calls on `batch` concurrently (their child requests in flight together);
        results in the same order: Scores, Outputs, or None (no candidate READY, or the role off)."""
        results: list[Scores | Outputs | None] = [None] * len(calls)
        todo = []
        for i, call in enumerate(calls):
            if not isinstance(call, (Classify, Infer)):
                raise FlowError(f"together() takes Classify(...) and Infer(...) calls, got {type(call).__name__}")
            if call.rotate not in (0, 180):
                raise FlowError(f"rotate={call.rotate!r}: write 0 or 180")
            candidates = self._candidates(call.models)
            rows = batch._sendable(_as_rows(batch.size, call.rows))
            if not candidates:
                continue
            plan = _Plan(i, call, candidates, rows)
            if len(rows) == 0:
                results[i] = self._result(batch, plan, None)
                continue
            if self._exec.degrades():
                plan.optional = np.intersect1d(rows, _optional_rows(batch.size, call.optional))
            todo.append(plan)
        while todo:
            sending, waiting = [], []
            for plan in todo:
                plan.model = self._router.chooser(plan.candidates).choose(exclude=plan.tried)
                if plan.model is not None:
                    plan.version = self._router.serving_version(plan.model)
                    canary = None if plan.no_canary or not self._trials else self._router.canary_for(plan.model)
                    plan.canary_of = None
                    if canary is not None:  # this call answered by the candidate instead
                        plan.canary_of, plan.model, plan.version = plan.model, canary.model, canary.version
                    # No work for a client that has gone, nor for one whose time runs out first;
                    # optional rows that the call would answer too late keep their answer.
                    keep, late, reasons = self._exec.keep_waiting(batch._image_rows(plan.rows), plan.model,
                                                                   plan.optional_mask())
                    if late.any():
                        plan.skipped.append(Skipped(plan.rows[late], plan.model, "late", reasons[late]))
                    plan.rows = plan.rows[keep]
                    if len(plan.rows) == 0:
                        results[plan.index] = self._result(batch, plan, None)
                        continue
                    plan.chunks = self._chunks(batch, plan)
                    sending.append(plan)
                elif self._keeps_waiting(plan):
                    waiting.append(plan)
                elif plan.failure is not None:  # its model could not take it, and none came back in time
                    results[plan.index] = self._failed(batch, plan, self._gave_up(plan))
                else:
                    self._exec.unready(self._router.role(plan.candidates), plan.candidates, plan.kind)
            mirrored = {}
            try:  # inside: a mirror started (its slot taken) is always handed a stable answer
                for plan in sending:
                    mirrored[plan.index] = self._mirror(batch, plan)
                todo = self._receive(batch, sending, mirrored, results)
            finally:
                for handle in mirrored.values():  # a call that raised: its mirror has nothing to compare with
                    if handle is not None and not handle.done:
                        handle.stable(None, 0.0)
            if waiting:
                self._router.pause()  # nothing READY for these yet: look again in a moment
                todo += waiting
        return results

    def _candidates(self, models: Models) -> tuple[str, ...]:
        if models is None:
            return ()
        names = (models,) if isinstance(models, str) else tuple(models)
        for m in names:
            if m not in self._exec.children:
                declared = ", ".join(self._exec.children) or "none"
                raise FlowError(f"the flow calls model {m!r}, which it did not declare; declare it in a Candidates "
                                f"setting of its Settings (declared: {declared})")
        return names

    def _receive(self, batch: CallTarget, sending: list[_Plan], mirrored: dict, results: list) -> list[_Plan]:
        """Send the planned calls together; answer those that came back, return those to send again."""
        router = self._router
        t0 = time.perf_counter()
        replies = iter(self._exec.send([chunk for plan in sending for chunk in plan.chunks]))
        seconds = time.perf_counter() - t0
        todo = []
        for plan in sending:
            parts = [next(replies) for _ in plan.chunks]
            failed = next((p for p in parts if isinstance(p, Exception)), None)
            shadow = mirrored[plan.index]
            if failed is None:
                router.answered(plan.model)
                try:
                    results[plan.index] = self._result(batch, plan, parts)
                except ChildCallError as broken:  # outputs that break its config's contract
                    failed = broken
            if failed is None:
                if shadow is not None:
                    shadow.stable(self._device.to_host(results[plan.index]._probs), seconds)
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
                router.lost(plan.model)
                plan.failure = (plan.model, failed)
                if plan.retry_until is None:
                    plan.retry_until = router.retry_until(plan.candidates, True)
                if (router.still_ready(plan.candidates, plan.tried, plan.model)
                        and router.serving_version(plan.model) == plan.version):
                    plan.tried += (plan.model,)
                todo.append(plan)
            elif ((limit := _batch_limit(failed, plan.model)) is not None
                  and limit < self._exec.child(plan.model).max_batch_size):
                # Loaded again with a smaller max_batch_size since (Model Analyzer's search does):
                # the call goes again, split at the limit the server named.
                log.warning("%s %s now takes at most %d rows a request (%s); splitting its calls at %d",
                            plan.kind, plan.model, limit, failed, limit)
                self._exec.lower_batch(plan.model, limit)
                todo.append(plan)
            elif router.still_ready(plan.candidates, plan.tried, plan.model):
                # Its own failure names the model (broken: INTERNAL); an overloaded one, the role.
                busy = getattr(failed, "busy", False)
                error = ChildCallError(f"{plan.kind} {plan.model} failed: {failed}", busy=busy, model=plan.model,
                                       role=router.role(plan.candidates) if busy else None)
                results[plan.index] = self._failed(batch, plan, error)
            else:
                log.warning("%s %s failed (%s); routing to the next ready one", plan.kind, plan.model, failed)
                plan.tried += (plan.model,)
                todo.append(plan)
        return todo

    def _mirror(self, batch: CallTarget, plan: _Plan):
        """Start the shadow's mirrored call of a classify() call to its stable model (same rows,
        same inputs), or None; the handle takes the stable answer when it is back."""
        if not self._trials or not isinstance(plan.call, Classify) or plan.canary_of is not None:
            return None
        shadow = self._router.shadow_for(plan.model)
        if shadow is None:
            return None
        trial = shadow.trial
        mirror = replace(plan, model=trial.model, version=trial.version, chunks=[])
        try:
            mirror.chunks = self._chunks(batch, mirror)
        except Exception as exc:  # noqa: BLE001 - e.g. the candidate's inputs differ: counted as a failed mirror
            error = exc  # `exc` is unbound when the except block ends; the lambda runs later
            return shadow.mirror(lambda: error, lambda parts: None, background=False)
        # Its own transport (the adapter's), on the shadow's thread now; or, with none
        # (LocalFlow), this execute()'s, once the stable answer is handed over.
        send = self._router.mirror_send or self._exec.transport

        def run_call():
            try:
                parts = list(send(mirror.chunks))
            except Exception as exc:  # noqa: BLE001 - the shadow's failure is only counted
                return exc
            return next((p for p in parts if isinstance(p, Exception)), parts)

        to_probs = lambda parts: self._device.to_host(self._result(batch, mirror, parts)._probs)  # noqa: E731
        return shadow.mirror(run_call, to_probs, background=self._router.mirror_send is not None)

    def _keeps_waiting(self, plan: _Plan) -> bool:
        """No candidate left for this call: wait for one (True) or give up (False).

        The runtime waits only for a model it saw go away, for at most child_retry_s."""
        router = self._router
        if plan.retry_until is None:
            plan.retry_until = router.retry_until(plan.candidates, False)
        if plan.retry_until is not None and router.now() < plan.retry_until:
            plan.tried = ()  # every candidate may be back: each is looked at again
            return True
        return False

    def _gave_up(self, plan: _Plan) -> ChildCallError:
        """Why a call whose model could not take it fails: nothing came back in time."""
        model, error = plan.failure
        return ChildCallError(f"{plan.kind} {model} could not take the call ({error}), and no candidate "
                              f"({', '.join(plan.candidates)}) answered within "
                              f"child_retry_s={self._router.options.child_retry_s:g} s",
                              unavailable=True, model=model, role=self._router.role(plan.candidates))

    def _failed(self, batch: CallTarget, plan: _Plan, error: ChildCallError) -> Scores | Outputs:
        """A call that failed for good fails the requests with a row in it, and no others
        (Execution.fail_call); the flow goes on with the call's result on no rows, as for a
        call whose requests all went away: their rows are out of every later call and answer.
        A temporary failure (the model refused the call for overload, or none took it in
        time) skips its optional rows instead: their answer stands, degraded."""
        rows = plan.rows
        if error.temporary and len(plan.optional):
            optional = plan.optional_mask() & self._exec.pending(batch._image_rows(rows))
            if optional.any():
                model = error.model or plan.model or plan.candidates[0]
                reason = f"overloaded: {first_line(str(error))}"
                plan.skipped.append(Skipped(rows[optional], model, "busy",
                                            np.full(int(optional.sum()), reason, dtype=object)))
                rows = rows[~optional]
        if len(rows):
            self._exec.fail_call(batch._image_rows(rows), error)
        return self._result(batch, replace(plan, rows=plan.rows[:0]), None)

    # ---- one call's requests and what comes back ---------------------------------------------
    def _chunks(self, batch: CallTarget, plan: _Plan) -> list[ChildRequest]:
        child = self._exec.child(plan.model, classifier=isinstance(plan.call, Classify))
        device = self._device
        feeds = self._tensor_inputs(batch, child, plan.call.inputs or {}, plan.rows)
        if child.image is not None and child.image.name not in feeds:
            data = batch._pixels(child, plan.rows)
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
        wanted = ((child.scores_output.name,) if isinstance(plan.call, Classify)
                  else tuple(o.name for o in child.outputs))
        # On a GPU device, outputs come back in its memory (strings cannot live there).
        strings = any(o.dtype in ("STRING", "BYTES") for o in child.outputs if o.name in wanted)
        gpu = None if strings else device.gpu
        step = child.max_batch_size
        timeout = self._exec.timeout_for(batch._image_rows(plan.rows), plan.optional_mask())
        return [ChildRequest(child.name, {name: value[i:i + step] for name, value in feeds.items()}, wanted, gpu,
                             plan.version, timeout)
                for i in range(0, len(plan.rows), step)]

    def _tensor_inputs(self, batch: CallTarget, child: ChildModel, given: Mapping, rows: np.ndarray) -> dict:
        """The flow's tensors for `child`'s inputs, these rows, checked against its config."""
        feeds = {}
        for name, value in given.items():
            info = child.input_named(name)
            if info is None:
                raise FlowError(f"inputs={{{name!r}: ...}}: model {child.name} has no input {name!r}; its inputs: "
                                f"{', '.join(t.name for t in child.inputs)}")
            if isinstance(value, Column):
                if value.size != batch.size:
                    raise FlowError(f"inputs[{name!r}]: {value} is for a batch of {value.size} rows, this one has "
                                    f"{batch.size}")
                missing = np.setdiff1d(rows, value.rows)
                if len(missing):
                    raise FlowError(f"inputs[{name!r}]: {value} does not cover row(s) {missing[:10].tolist()} of this "
                                    "call")
                data = value.value if len(value.rows) == len(rows) and (value.rows == rows).all() else \
                    self._device.take(value.value, np.searchsorted(value.rows, rows))
            else:
                array = np.asarray(value)
                if array.shape[:1] != (batch.size,):
                    raise FlowError(f"inputs[{name!r}]: give one entry per row of the batch ({batch.size}), got shape "
                                    f"{array.shape}")
                data = array[rows]
            feeds[name] = _conform(child, info, data)
        return feeds

    def _result(self, batch: CallTarget, plan: _Plan, parts: list[Mapping[str, np.ndarray]] | None) -> Scores | Outputs:
        device = self._device
        if parts is None:  # a call on no rows: nothing sent
            child = self._exec.child(plan.candidates[0], classifier=isinstance(plan.call, Classify))
            values = {o.name: np.empty((0, *[max(d, 0) for d in o.dims]), numpy_dtype(o.dtype)) for o in child.outputs}
            model = None
        else:
            child, model = self._exec.child(plan.model), plan.model
            values = {name: parts[0][name] if len(parts) == 1 else _concat(device, [p[name] for p in parts])
                      for name in plan.chunks[0].outputs}
            for o in child.outputs:
                if o.name in values:
                    _check_output(child, o, values[o.name], len(plan.rows))
        skipped = tuple(plan.skipped)
        if isinstance(plan.call, Classify):
            probs = device.probabilities(values[child.scores_output.name], child.scores)
            return Scores(model, child.labels, batch.size, plan.rows, probs, device, plan.version if model else "",
                          skipped)
        return Outputs(model, batch.size, plan.rows, values, device, skipped)


def _optional_rows(size: int, optional) -> np.ndarray:
    """A call's `optional`: None or False, no row; True, every row; else rows of the batch."""
    if optional is None or optional is False:
        return np.empty(0, np.int64)
    if optional is True:
        return np.arange(size)
    return _as_rows(size, optional)


def _batch_limit(error: Exception, model: str) -> int | None:
    """The max batch size `model` was refused a call for, per the server's message; None for
    another error (or a limit under 1: that model takes no batches a flow can send)."""
    m = BATCH_LIMIT.search(str(error))
    return int(m.group(1)) if m and m.group(2) == model and int(m.group(1)) >= 1 else None


def _concat(device: Device, parts: list):
    """Chunks of one output back together; outputs of varying dims (a detector's boxes per
    row) are padded to the largest with zeros first."""
    shapes = {tuple(getattr(p, "shape", ())[1:]) for p in parts}
    if len(shapes) > 1 and all(isinstance(p, np.ndarray) for p in parts):
        widest = tuple(max(s[i] for s in shapes) for i in range(len(next(iter(shapes)))))
        parts = [np.pad(p, [(0, 0)] + [(0, w - d) for w, d in zip(widest, p.shape[1:])]) for p in parts]
    return device.concat(parts)


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
            raise FlowError(f"inputs[{info.name!r}] is {data.dtype}; model {child.name} declares TYPE_{info.dtype} "
                            "(bytes or str)")
        return np.array([v.encode() if isinstance(v, str) else v for v in data.reshape(-1)],
                        dtype=object).reshape(data.shape)
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
        raise ChildCallError(f"{child.name} returned {output.name} with shape {tuple(value.shape)} for a batch of "
                             f"{rows}; its config.pbtxt declares dims {list(output.dims)}, so expected "
                             f"{tuple(expected)}", model=child.name)
    got = _dtype_name(value)
    if got != ("STRING" if output.dtype == "BYTES" else output.dtype):
        raise ChildCallError(f"{child.name} returned {output.name} as {got}; its config.pbtxt declares "
                             f"TYPE_{output.dtype}", model=child.name)


def _dtype_name(value) -> str:
    """A returned array's data type in Triton's words (FP32, STRING...), numpy or torch."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "OSU":
        return "STRING"
    return triton_dtype(value.dtype.name if isinstance(value, np.ndarray) else str(value.dtype).replace("torch.", ""))
