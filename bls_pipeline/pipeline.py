"""The classify_bls flow, as plain Python over an injected `infer` call.

All images of all requests in one execute() call travel together:

    decode + preprocess (thread pool) ─> one (N,3,H,W) batch
    cascade on and its cheap model ready?
      yes: cheap model ─> top-1 >= cascade_threshold: done          ROUTE <cheap>:confident
                       └> unsure rows, ONE call to the main model    ROUTE <main>:escalated
                          (no main model ready: keep the cheap answer ROUTE <cheap>:degraded)
      no:  main model  ─> top-1 >= tta_threshold: done               ROUTE <main>:direct
                       └> unsure rows, ONE call on the flipped rows,
                          probabilities averaged                     ROUTE <main>:flip_tta
    softmax + top-k per request

`infer(model, batch)` is one child request (models/classify_bls/1/model.py makes it a
pb_utils.InferenceRequest with DLPack tensors); everything here is pure and tested
without a server. "Main" and "cheap" are each the first READY model of an ordered list
(routing.ClassifierChooser). To add a branch, add a step to `Pipeline.run`: it sees
every image of the call at once, so it can select rows and batch them too.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from . import routing
from .batching import decode_to_batch
from .config import ClassifierInfo, PipelineConfig
from .postprocess import softmax, top_k
from .preprocess import PreprocessSpec, renormalize

__all__ = ["ChildCallError", "ImageRequest", "Pipeline", "Prediction", "RequestError"]

log = logging.getLogger(__name__)


class ChildCallError(RuntimeError):
    """A child inference failed as a whole (model unloaded, server error)."""


@dataclass(frozen=True)
class ImageRequest:
    """One client request: its encoded images and its optional TOPK."""

    images: Sequence[bytes]
    # TOPK as sent: one value per image (a batched input), all equal; or None for the default
    topk: int | tuple[int, ...] | None = None

    @property
    def k(self) -> int | None:
        if self.topk is None or isinstance(self.topk, int):
            return self.topk
        return self.topk[0] if self.topk else None


@dataclass(frozen=True)
class RequestError:
    """Why one request failed; `message` is safe to send to the client."""

    message: str
    reason: str  # short tag for metrics: decode reasons, "bad_request", "too_large", "classifier"


@dataclass(frozen=True)
class Prediction:
    labels: np.ndarray  # (n, k) object (bytes "score:index:label")
    scores: np.ndarray  # (n, k) float32
    class_ids: np.ndarray  # (n, k) int32
    routes: np.ndarray  # (n, 1) object (bytes "classifier:branch")


@dataclass
class Timings:
    """What one run did: seconds per stage, images per route, rejections per reason."""

    decode_preprocess: float = 0.0
    classify: float = 0.0
    routes: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)

    def count(self, table: dict[str, int], key: str, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n


Infer = Callable[[str, np.ndarray], np.ndarray]  # (model, (N,3,H,W) float32) -> (N,C) logits


class _Batch:
    """The decoded images of one run, preprocessed for whichever classifier asks.

    Decoded once, with the first classifier's spec; a classifier with another mean/std
    but the same resize/crop gets the same pixels re-normalised (no second decode).
    """

    def __init__(self, pipeline: "Pipeline", requests: Sequence[ImageRequest], results: list, timings: Timings):
        self._pipeline, self._requests, self._results, self._timings = pipeline, requests, results, timings
        self._by_spec: dict[PreprocessSpec, np.ndarray] = {}
        self.owners: np.ndarray | None = None

    def for_spec(self, spec: PreprocessSpec) -> np.ndarray:
        if spec in self._by_spec:
            return self._by_spec[spec]
        for have, batch in self._by_spec.items():
            converted = renormalize(batch, have, spec)
            if converted is not None:
                self._by_spec[spec] = converted
                return converted
        self._by_spec[spec] = batch = self._decode(spec)
        return batch

    def _decode(self, spec: PreprocessSpec) -> np.ndarray:
        t0 = time.perf_counter()
        images = [req.images if self._results[r] is None else None for r, req in enumerate(self._requests)]
        decoded = decode_to_batch(images, self._pipeline.config.decode, spec, self._pipeline._pool)
        for r, err in decoded.errors.items():  # a bad image fails its request, naming the image
            self._results[r] = RequestError(f"IMAGE[{decoded.bad_index[r]}]: {err}", err.reason)
            self._timings.count(self._timings.rejected, err.reason)
        self.owners = decoded.owners if self.owners is None else self.owners
        self._timings.decode_preprocess += time.perf_counter() - t0
        return decoded.batch


class Pipeline:
    def __init__(self, config: PipelineConfig, classifiers: dict[str, ClassifierInfo], labels: list[str],
                 is_ready: Callable[[str], bool], instances: int = 1):
        missing = [m for m in config.classifiers + config.cascade_classifiers if m not in classifiers]
        if missing:
            raise ValueError(f"no ClassifierInfo for {missing}")
        self.config = config
        self.classifiers = classifiers
        self.labels = labels
        self.main = routing.ClassifierChooser(config.classifiers, is_ready, config.route_recheck_s)
        self.cheap = (routing.ClassifierChooser(config.cascade_classifiers, is_ready, config.route_recheck_s)
                      if config.cascade_classifiers else None)
        threads = config.decode_threads or max(1, (os.cpu_count() or 1) // max(1, instances))
        # One thread: decode in execute()'s own thread; a one-worker pool only adds handoffs.
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="decode") if threads > 1 else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # ---- the flow -----------------------------------------------------------------------
    def run(self, requests: Sequence[ImageRequest], infer: Infer) -> tuple[list[Prediction | RequestError], Timings]:
        timings = Timings()
        results: list[Prediction | RequestError | None] = [self._check_request(r, timings) for r in requests]
        batch = _Batch(self, requests, results, timings)
        t0 = time.perf_counter()
        try:
            answer = self._cascade(batch, infer) if self.cheap is not None else None
            if answer is None:
                answer = self._main_with_flip(batch, infer)
        except ChildCallError as exc:
            return self._fail_pending(requests, results, str(exc), "classifier", timings), timings
        timings.classify = time.perf_counter() - t0 - timings.decode_preprocess
        if answer is None:
            tried = ", ".join(self.config.cascade_classifiers + self.config.classifiers)
            return self._fail_pending(requests, results, f"no classifier is ready (tried, in order: {tried})", "classifier", timings), timings
        probs, routes = answer
        for route in routes:
            timings.count(timings.routes, route.decode())
        self._split(requests, results, batch.owners, probs, routes)
        return results, timings  # type: ignore[return-value]

    def _cascade(self, batch: _Batch, infer: Infer):
        """Cheap model for everything; unsure rows escalated to the main model in one call."""
        first = self._infer_first_ready(self.cheap, batch, None, infer)
        if first is None:
            return None  # no cheap model ready: the main path answers (ROUTE shows it)
        cheap, logits = first
        probs = softmax(logits)
        routes = np.full(len(probs), routing.route_label(cheap, routing.CONFIDENT).encode(), dtype=object)
        unsure = np.flatnonzero(routing.low_confidence(probs, self.config.cascade_threshold))
        if len(unsure):
            second = self._infer_first_ready(self.main, batch, unsure, infer)
            if second is None:
                routes[unsure] = routing.route_label(cheap, routing.DEGRADED).encode()
            else:
                main, logits = second
                probs[unsure] = softmax(logits)
                routes[unsure] = routing.route_label(main, routing.ESCALATED).encode()
        return probs, routes

    def _main_with_flip(self, batch: _Batch, infer: Infer):
        """Main model for everything; unsure rows get a flipped second pass, averaged."""
        first = self._infer_first_ready(self.main, batch, None, infer)
        if first is None:
            return None
        model, logits = first
        probs = softmax(logits)
        routes = np.full(len(probs), routing.route_label(model, routing.DIRECT).encode(), dtype=object)
        unsure = np.flatnonzero(routing.low_confidence(probs, self.config.tta_threshold))
        if len(unsure):
            rows = batch.for_spec(self.classifiers[model].preprocess)[unsure]
            flipped = np.ascontiguousarray(rows[..., ::-1])
            probs[unsure] = (probs[unsure] + softmax(self._infer(model, flipped, infer))) / 2
            routes[unsure] = routing.route_label(model, routing.FLIP_TTA).encode()
        return probs, routes

    # ---- steps --------------------------------------------------------------------------
    def _infer_first_ready(self, chooser: routing.ClassifierChooser, batch: _Batch, rows: np.ndarray | None,
                           infer: Infer) -> tuple[str, np.ndarray] | None:
        """Logits from the first READY model of `chooser`, or None if none is ready.

        A failed call re-checks readiness: a model that went away is skipped and the next
        one answers (nothing lost); a model still READY failed for real (ChildCallError).
        """
        tried: tuple[str, ...] = ()
        while (model := chooser.choose(exclude=tried)) is not None:
            data = batch.for_spec(self.classifiers[model].preprocess)
            try:
                return model, self._infer(model, data if rows is None else data[rows], infer)
            except ChildCallError as exc:
                chooser.invalidate()
                if chooser.choose(exclude=tried) == model:
                    raise ChildCallError(f"classifier {model} failed: {exc}") from None
                log.warning("classifier %s failed (%s); routing to the next ready one", model, exc)
                tried += (model,)
        return None

    def _infer(self, model: str, batch: np.ndarray, infer: Infer) -> np.ndarray:
        """Child call(s), chunked at the classifier's max batch, with the batch contract checked."""
        if len(batch) == 0:
            return np.empty((0, len(self.labels)), np.float32)
        limit = self.classifiers[model].max_batch_size
        parts = [infer(model, batch[i:i + limit]) for i in range(0, len(batch), limit)]
        logits = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if logits.shape != (len(batch), len(self.labels)):
            raise ChildCallError(f"{model} returned shape {logits.shape} for a batch of {len(batch)}; expected ({len(batch)}, {len(self.labels)})")
        return logits

    def _check_request(self, req: ImageRequest, timings: Timings) -> RequestError | None:
        error = None
        total = sum(len(b) for b in req.images)
        if len(req.images) == 0:
            error = RequestError("IMAGE is empty: send at least one encoded image", "bad_request")
        elif total > self.config.max_request_bytes:
            error = RequestError(f"IMAGE: the request carries {total} bytes of images, over the {self.config.max_request_bytes}-byte limit", "too_large")
        elif isinstance(req.topk, tuple) and len(set(req.topk)) > 1:
            error = RequestError(f"TOPK differs between the images of one request ({sorted(set(req.topk))}): send one value", "bad_request")
        elif req.k is not None and not 1 <= req.k <= len(self.labels):
            error = RequestError(f"TOPK={req.k} is out of range: use 1..{len(self.labels)}", "bad_request")
        if error is not None:
            timings.count(timings.rejected, error.reason, max(len(req.images), 1))
        return error

    def _split(self, requests, results, owners: np.ndarray | None, probs: np.ndarray, routes: np.ndarray) -> None:
        for r, req in enumerate(requests):
            if results[r] is not None:
                continue
            rows = np.flatnonzero(owners == r)
            top = top_k(probs[rows], req.k or self.config.default_topk, self.labels)
            results[r] = Prediction(top.labels, top.scores, top.class_ids, routes[rows].reshape(-1, 1))

    @staticmethod
    def _fail_pending(requests, results, message: str, reason: str, timings: Timings) -> list[Prediction | RequestError]:
        for r, res in enumerate(results):
            if res is None:
                results[r] = RequestError(message, reason)
                timings.count(timings.rejected, reason, len(requests[r].images))
        return results  # type: ignore[return-value]
