"""One execute() of a flow model: the good requests' images as the rows of a batch, decoded
and preprocessed once (a bad image fails its own request), each child's pixels made from
them on demand, regions cut from the images decoded once, and the child calls sent and
timed (calls.py plans them). What a Batch asks of its execute() (batch.RunContext).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Mapping, Sequence

import numpy as np

from ...stages.preprocess import PreprocessSpec
from .. import hooks
from ..admit.admission import RequestClock, drop, late
from ..call.calls import Calls, ChildRequest, Send
from ..load.children import ChildModel
from ..errors import ChildCallError, FlowError
from ..load.parameters import RowParameters
from ..results import BROKEN, UNAVAILABLE, ChildStats, ImageRequest, RequestError, Timings

__all__ = ["Execution"]

log = logging.getLogger(__name__)


class Execution:
    """One execute(): its rows (the good requests' images), their pixels, its calls, what was
    tried. The Batch's RunContext (batch.py) and the calls' CallContext (calls.py).

    runtime: the flow model's FlowRuntime (engine.py); send: the transport; probe: health
    probes, answered on the stable models alone (no shadow, no canary).
    """

    def __init__(self, runtime, requests: Sequence[ImageRequest], results: list, send: Send, timings: Timings,
                 probe: bool = False, clock: RequestClock | None = None, parameters: Sequence[dict | None] = ()):
        """The execute() as it comes in: its rows are the images of the requests not failed yet,
        nothing decoded (start() decodes them)."""
        self._runtime, self.transport, self._timings = runtime, send, timings
        self._requests = requests
        self._clock = clock if clock is not None else RequestClock.start(requests, runtime.clock(), 0.0, runtime.clock)
        self._parameters = list(parameters) or [None] * len(requests)
        self._costs = runtime.admission.costs
        self.device = runtime.device
        self.children = runtime.children
        self.max_regions = runtime.options.max_regions_per_image
        self.declared = runtime.declared
        self._results = results
        # The last call that found no candidate READY: (its role, its candidates, its kind).
        self._unready: tuple[str, tuple[str, ...], str] | None = None
        self._trials = not probe
        self._probe = probe
        self.preprocess_in_flow = 0.0
        images = self._good_images()
        self._encoded = [data for imgs in images if imgs is not None for data in imgs]
        self.owners = np.array([r for r, imgs in enumerate(images) if imgs is not None for _ in imgs], dtype=np.int64)
        self._pixels: dict[PreprocessSpec, object] = {}  # the device's arrays
        self._decoded = None
        self._scales = None
        self.rows = len(self.owners)

    @classmethod
    def start(cls, runtime, requests: Sequence[ImageRequest], results: list, send: Send, timings: Timings, *,
              probe: bool = False, clock: RequestClock | None = None,
              parameters: Sequence[dict | None] = ()) -> "Execution":
        """One execute() begun: the good requests' images decoded and preprocessed once, for the
        first pixel model the flow declares; a bad image fails its own request (in `results`),
        naming it, and its request's images leave the rows."""
        run = cls(runtime, requests, results, send, timings, probe, clock, parameters)
        run._decode()
        return run

    def _good_images(self) -> list:
        """Each request's images, None for a request failed already."""
        return [req.images if self._results[r] is None else None for r, req in enumerate(self._requests)]

    def _decode(self) -> None:
        runtime, results, requests, timings = self._runtime, self._results, self._requests, self._timings
        spec = runtime.primary_spec
        if spec is None:  # every model takes the encoded bytes: nothing to decode
            return
        t0 = time.perf_counter()
        with hooks.stage("decode_preprocess"):
            decoded = self.device.decode(self._good_images(), runtime.options.decode, spec,
                                         keep_images=runtime.keep_images)
        for r, err in decoded.errors.items():  # a bad image fails its request, naming the image
            results[r] = RequestError(f"IMAGE[{decoded.bad_index[r]}]: {err}", err.reason)
            timings.reject(results[r], len(requests[r].images))  # the request's good images fail with it
        if decoded.errors:  # the failed requests' images leave the batch
            self._encoded = [data for data, k in zip(self._encoded, np.isin(self.owners, decoded.owners)) if k]
        self.owners = decoded.owners
        self._pixels[spec] = decoded.batch
        self._decoded = decoded.images
        self._scales = decoded.scales
        timings.decode_preprocess += time.perf_counter() - t0
        self._costs.observe("decode", time.perf_counter() - t0, len(self._encoded))
        self.rows = len(self.owners)

    # ---- the requests behind the rows ----------------------------------------------------
    def parameters(self, image_rows: np.ndarray) -> RowParameters:
        """The flow's request parameters, per row of a batch whose rows are on these images."""
        return RowParameters(self._runtime.parameters, self._parameters, self.owners[image_rows])

    def time_left(self, image_rows: np.ndarray) -> np.ndarray:
        """Seconds left of each row's request's deadline (inf: none)."""
        return self._clock.time_left()[self.owners[image_rows]]

    def request_ids(self, image_rows: np.ndarray) -> np.ndarray:
        return np.array([self._requests[r].id for r in self.owners[image_rows]], dtype=object)

    def keep_waiting(self, image_rows: np.ndarray, stage: str,
                     optional: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Before a stage (a child call on rows on these images): fail the requests whose client
        has gone or whose deadline passed, and those whose time left cannot cover the stage
        (admission.drop); of the `optional` rows (a mask; the flow has an answer for them),
        skip those the stage would answer after their aim (admission.late) instead. The mask
        of the rows to send, the mask of those skipped, and each skipped row's reason."""
        owners = self.owners[image_rows]
        n = len(owners)
        skipped, reasons = np.zeros(n, dtype=bool), np.full(n, "", dtype=object)
        if not n:
            return np.ones(0, dtype=bool), skipped, reasons
        optional = np.zeros(n, dtype=bool) if optional is None else optional
        now = self._runtime.clock()
        predicted = lambda k: self.predict(stage, k)  # noqa: E731
        requests, counts = np.unique(owners[~optional], return_counts=True)
        drop(self._clock, self._results, self._timings, stage, now, self._images_of,
             carried=dict(zip(requests.tolist(), counts.tolist())), predicted=predicted)
        alive = self.pending(image_rows)
        maybe = optional & alive
        if maybe.any():
            sent_anyway = alive & ~optional
            # The call must still end in time for the rows it sends anyway.
            bound = float(self._clock.time_left(now)[owners[sent_anyway]].min()) if sent_anyway.any() else math.inf
            requests, counts = np.unique(owners[maybe], return_counts=True)
            too_late = late(self._clock, now, dict(zip(requests.tolist(), counts.tolist())), int(sent_anyway.sum()),
                            bound, predicted)
            skipped = maybe & np.isin(owners, too_late)
            if skipped.any():
                need = predicted(int(alive.sum() - skipped.sum()) + 1)
                wait = self._runtime.admission.queue_wait(stage)
                left = self._clock.aim_left(now)
                for i in np.flatnonzero(skipped):
                    r = int(owners[i])
                    aim = "deadline" if math.isfinite(self._clock.deadlines[r]) else \
                        f"latency_target_ms={self._runtime.options.latency_target_ms:g}"
                    reasons[i] = (f"overloaded: this request's {aim} had passed before {stage} (by "
                                  f"{-left[r] * 1e3:.0f} ms)"
                                  if left[r] <= 0 else
                                  f"overloaded: {stage} would answer in about {need * 1e3:.0f} ms (its queue "
                                  f"{wait * 1e3:.0f} ms as Triton measured it), and {left[r] * 1e3:.0f} ms were left "
                                  f"of this request's {aim}")
        return alive & ~skipped, skipped, reasons

    def pending(self, image_rows: np.ndarray) -> np.ndarray:
        """Which of these rows belong to requests not failed yet."""
        owners = self.owners[image_rows]
        return np.fromiter((self._results[r] is None for r in owners), dtype=bool, count=len(owners))

    def degrades(self) -> bool:
        """Whether optional rows are skipped under overload (overload: degrade) rather than run."""
        return self._runtime.options.overload == "degrade" and not self._probe

    def predict(self, stage: str, rows: int) -> float:
        """Seconds a call of `rows` rows to `stage` (a child) takes now: the wait Triton last
        measured in its queue, and its own time per image, as measured here."""
        return self._runtime.admission.queue_wait(stage) + self._costs.predict(stage, rows)

    def drop_gone(self, stage: str) -> None:
        """Fail the pending requests whose client has gone or whose deadline passed."""
        drop(self._clock, self._results, self._timings, stage, self._runtime.clock(), self._images_of)

    def timeout_for(self, image_rows: np.ndarray, optional: np.ndarray | None = None) -> float | None:
        """What a child call on these rows may take at most: the most time left among their
        requests, counting an optional row's aim (None: one has neither a deadline nor an aim)."""
        left = self.time_left(image_rows)
        if optional is not None and optional.any():
            left = np.where(optional, self._clock.aim_left()[self.owners[image_rows]], left)
        return None if len(left) == 0 or not np.isfinite(left).all() else max(float(left.max()), 1e-6)

    def _images_of(self, r: int) -> int:
        return max(1, len(self._requests[r].images))

    # ---- the calls ---------------------------------------------------------------------------
    def together(self, batch, calls) -> list:
        # Made for each together(): kept, it and this would refer to each other (a cycle
        # holding the batch's pixels until the garbage collector came by).
        return Calls(self, self._runtime.router, trials=self._trials).together(batch, calls)

    def unready(self, role: str, candidates: tuple[str, ...], kind: str) -> None:
        """A call found none of its candidates READY (and waits no longer): the role that a
        NoModelReady raised now names, with these candidates (kind: "classifier" or "model")."""
        self._unready = (role, candidates, kind)

    def unready_role(self) -> str:
        return self._unready[0] if self._unready is not None else "no_model_ready"

    def unready_candidates(self) -> tuple[str, ...]:
        """The candidates of the last call that found none READY, in order."""
        return self._unready[1] if self._unready is not None else ()

    def no_model_message(self, failed_loads: Mapping[str, str]) -> str:
        """What NoModelReady says: the role that had no READY candidate and each of its
        candidates' state (failed_loads: {model: the first line of why its load failed})."""
        if self._unready is None:
            return ("no model is ready (the flow raised NoModelReady, and none of its calls found its candidates "
                    "un-READY)")
        role, candidates, kind = self._unready
        states = ", ".join(f"{m} failed to load: {failed_loads[m]}" if m in failed_loads else f"{m} not READY"
                           for m in candidates)
        return f"no {kind} is ready for {role} (its candidates, in order: {states})"

    def child(self, name: str, classifier: bool = False) -> ChildModel:
        child = self.children[name]
        if classifier and not child.is_classifier:
            raise FlowError(f"classify() needs a classifier, and {name}'s output has no label_filename in its "
                            "config.pbtxt; use infer() for its raw outputs")
        return child

    def lower_batch(self, model: str, limit: int) -> None:
        """`model` takes at most `limit` rows a request now: this call and the next are split so."""
        self._runtime.lower_batch(model, limit)

    def inputs(self, child: ChildModel, rows: np.ndarray):
        """`child`'s input for these rows: the encoded bytes, or pixels preprocessed its way
        (a numpy array, or a tensor on the device)."""
        if child.preprocess is None:
            return np.array([self._encoded[i] for i in rows], dtype=object).reshape(-1, 1)
        pixels = self._pixels_for(child.preprocess)
        return pixels if len(rows) == self.rows else self.device.take(pixels, rows)

    def _pixels_for(self, spec: PreprocessSpec):
        if spec in self._pixels:
            return self._pixels[spec]
        t0 = time.perf_counter()
        with hooks.stage("decode_preprocess"):
            renormalized = (self.device.renormalize(have, s, spec) for s, have in self._pixels.items())
            batch = next((b for b in renormalized if b is not None), None)
            if batch is None:
                if self._decoded is None:
                    raise FlowError(f"internal: no decoded images kept for {spec}")
                batch = self.device.preprocess(self._decoded, spec)
        self._pixels[spec] = batch
        elapsed = time.perf_counter() - t0
        self._timings.decode_preprocess += elapsed
        self.preprocess_in_flow += elapsed
        return batch

    def images(self):
        """The decoded images, one per row, and each one's pixels as sent per decoded pixel.
        Kept from the decode when the flow cuts regions (seen at load); else decoded again
        here, once (a flow that reaches regions() only past the load check's path)."""
        self._runtime.uses_regions = self._runtime.keep_images = True  # from the next execute() on: kept
        if self._decoded is None:
            spec = self._runtime.primary_spec
            if spec is None:
                raise FlowError("regions need pixels: declare at least one model with a pixel input")
            log.warning("flow %s: the load check did not see it cut regions, so the images are decoded again for them; "
                        "call regions() on the probe image's path to keep them from the first decode",
                        self._runtime.name)
            t0 = time.perf_counter()
            again = self.device.decode([[data] for data in self._encoded], self._runtime.options.decode, spec,
                                       keep_images=True)
            self._decoded, self._scales = again.images, again.scales
            self._timings.decode_preprocess += time.perf_counter() - t0
        return self._decoded, self._scales

    def crops(self, spec, image_rows: np.ndarray, boxes: np.ndarray):
        t0 = time.perf_counter()
        with hooks.stage("regions"):
            images, _ = self.images()
            batch = self.device.crop(images, image_rows, boxes, spec)
        elapsed = time.perf_counter() - t0
        self._timings.decode_preprocess += elapsed
        self.preprocess_in_flow += elapsed
        return batch

    def fail_images(self, rows: np.ndarray, message: str, reason: str) -> None:
        """Fail the requests these image rows belong to (their other rows are answered, unread)."""
        for row in rows:
            r = int(self.owners[row])
            if self._results[r] is None:
                index = int(row - np.flatnonzero(self.owners == r)[0])
                self._results[r] = RequestError(f"IMAGE[{index}]: {message}", reason)
                self._timings.reject(self._results[r], int((self.owners == r).sum()))

    def fail_call(self, image_rows: np.ndarray, error: ChildCallError) -> None:
        """A child call failed for good: the requests with a row in it fail with its error
        (UNAVAILABLE when temporary, else INTERNAL: a broken child, logged), those whose client
        went or whose deadline passed meanwhile as such; the rest of the execute() goes on."""
        stage = error.model or "child"
        self.drop_gone(stage)
        if not error.temporary:
            log.error("flow %s: %s", self._runtime.name, error)
        failed = RequestError(str(error), error.role or stage, UNAVAILABLE if error.temporary else BROKEN)
        for r in np.unique(self.owners[image_rows]).tolist():
            if self._results[r] is None:
                self._results[r] = failed
                self._timings.reject(failed, self._images_of(r))

    def send(self, requests: list[ChildRequest]):
        if not requests:
            return []
        # What each child's queue made calls wait, as Triton last measured it: the rest of a
        # call's time is the child's own work.
        waits = {req.model: self._runtime.admission.queue_wait(req.model) for req in requests}
        t0 = time.perf_counter()
        with hooks.stage("child_calls"):
            replies = list(self.transport(requests))
        elapsed = time.perf_counter() - t0
        if len(replies) != len(requests):
            raise ChildCallError(f"the transport answered {len(replies)} of {len(requests)} child requests")
        sent: dict[str, int] = {}
        for req in requests:
            stats = self._timings.children.setdefault(req.model, ChildStats())
            images = len(next(iter(req.inputs.values()))) if req.inputs else 0
            stats.calls += 1
            stats.images += images
            stats.seconds += elapsed
            sent[req.model] = sent.get(req.model, 0) + images
        for model, images in sent.items():  # sent together: each is charged the whole time
            # A call that mostly waited says little of the child's own work: not counted.
            if waits[model] < elapsed / 2:
                self._costs.observe(model, elapsed - waits[model], images)
        return replies
