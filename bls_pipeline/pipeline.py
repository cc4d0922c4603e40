"""The classify_bls flow, as plain Python over an injected `infer` call.

    requests ──decode+preprocess (thread pool)──> one (N,3,H,W) batch
             ──infer(chosen classifier)──> probabilities
             ──low confidence? infer(flipped) and average──> top-k per request

`infer(model, batch)` sends ONE child request (models/classify_bls/1/model.py makes
it a pb_utils.InferenceRequest with DLPack tensors); everything else here is pure and
tested without a server. To add a branch, add a step to `Pipeline.run` next to the
flip step: it sees every image of the execute() call at once, so it can batch too.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from . import routing
from .config import ClassifierInfo, PipelineConfig
from .batching import decode_to_batch
from .postprocess import softmax, top_k

__all__ = ["ChildCallError", "ImageRequest", "Pipeline", "Prediction", "RequestError"]

log = logging.getLogger(__name__)


class ChildCallError(RuntimeError):
    """A child inference failed as a whole (model unloaded, server error)."""


@dataclass(frozen=True)
class ImageRequest:
    """One client request: its encoded images and its optional TOPK."""

    images: Sequence[bytes]
    topk: int | None = None


@dataclass(frozen=True)
class RequestError:
    """Why one request failed; `message` is safe to send to the client."""

    message: str
    reason: str  # short tag for metrics: decode reasons, "bad_request", "classifier"


@dataclass(frozen=True)
class Prediction:
    labels: np.ndarray  # (n, k) object (bytes "score:index:label")
    scores: np.ndarray  # (n, k) float32
    class_ids: np.ndarray  # (n, k) int32
    routes: np.ndarray  # (n, 1) object (bytes "classifier:branch")


@dataclass
class Timings:
    """Seconds spent per stage in one run (for metrics and the bench)."""

    decode_preprocess: float = 0.0
    classify: float = 0.0
    routes: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)


Infer = Callable[[str, np.ndarray], np.ndarray]  # (model, (N,3,H,W) float32) -> (N,C) logits


class Pipeline:
    def __init__(self, config: PipelineConfig, classifiers: dict[str, ClassifierInfo], labels: list[str],
                 is_ready: Callable[[str], bool]):
        missing = [m for m in config.classifiers if m not in classifiers]
        if missing:
            raise ValueError(f"no ClassifierInfo for {missing}")
        self.config = config
        self.classifiers = classifiers
        self.labels = labels
        self.chooser = routing.ClassifierChooser(config.classifiers, is_ready, config.route_recheck_s)
        self._pool = ThreadPoolExecutor(max_workers=config.decode_threads, thread_name_prefix="decode")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # ---- the flow -----------------------------------------------------------------
    def run(self, requests: Sequence[ImageRequest], infer: Infer) -> tuple[list[Prediction | RequestError], Timings]:
        timings = Timings()
        results: list[Prediction | RequestError | None] = [self._check_request(r) for r in requests]

        tried: tuple[str, ...] = ()
        while True:
            model = self.chooser.choose(exclude=tried)
            if model is None:
                reason = f"no classifier is ready (tried, in order: {', '.join(self.config.classifiers)})"
                return self._fail_pending(results, reason, "classifier", timings), timings
            info = self.classifiers[model]
            t0 = time.perf_counter()
            batch, owners = self._decode_batch(requests, results, info, timings)
            timings.decode_preprocess += time.perf_counter() - t0
            if len(batch) == 0:
                return results, timings  # type: ignore[return-value]  # every request already failed
            try:
                t0 = time.perf_counter()
                probs, branches = self._classify(model, batch, infer)
                timings.classify += time.perf_counter() - t0
                break
            except ChildCallError as exc:
                # Model went away? Look again and retry on the next READY one; a model that
                # is still ready failed for real, and the requests fail with its message.
                self.chooser.invalidate()
                if self.chooser.choose(exclude=tried) == model:
                    return self._fail_pending(results, f"classifier {model} failed: {exc}", "classifier", timings), timings
                log.warning("classifier %s failed (%s); routing to the next ready one", model, exc)
                tried += (model,)

        routes = np.array([routing.route_label(model, b).encode() for b in branches], dtype=object)
        for route in routes:
            timings.routes[route.decode()] = timings.routes.get(route.decode(), 0) + 1
        self._split(requests, results, owners, probs, routes)
        return results, timings  # type: ignore[return-value]

    def _classify(self, model: str, batch: np.ndarray, infer: Infer) -> tuple[np.ndarray, list[str]]:
        probs = softmax(self._infer(model, batch, infer))
        branches = [routing.DIRECT] * len(batch)
        # Branch: low-confidence images get a horizontally flipped second pass, all in one call.
        unsure = np.flatnonzero(routing.low_confidence(probs, self.config.tta_threshold))
        if len(unsure):
            flipped = np.ascontiguousarray(batch[unsure][..., ::-1])
            probs[unsure] = (probs[unsure] + softmax(self._infer(model, flipped, infer))) / 2
            for i in unsure:
                branches[i] = routing.FLIP_TTA
        return probs, branches

    # ---- steps ----------------------------------------------------------------------
    def _check_request(self, req: ImageRequest) -> RequestError | None:
        if len(req.images) == 0:
            return RequestError("IMAGE is empty: send at least one encoded image", "bad_request")
        total = sum(len(b) for b in req.images)
        if total > self.config.max_request_bytes:
            return RequestError(f"request carries {total} bytes of images, over the {self.config.max_request_bytes}-byte limit", "too_large")
        if req.topk is not None and not 1 <= req.topk <= len(self.labels):
            return RequestError(f"TOPK={req.topk} is out of range: use 1..{len(self.labels)}", "bad_request")
        return None

    def _decode_batch(self, requests, results, info: ClassifierInfo, timings: Timings) -> tuple[np.ndarray, np.ndarray]:
        """One batch from every image of the still-valid requests; a request with an
        undecodable image fails as a whole, naming that image's index and the reason."""
        images = [req.images if results[r] is None else None for r, req in enumerate(requests)]
        decoded = decode_to_batch(images, self.config.decode, info.preprocess, self._pool)
        for r, err in decoded.errors.items():
            results[r] = RequestError(f"IMAGE[{decoded.bad_index[r]}]: {err}", err.reason)
            timings.rejected[err.reason] = timings.rejected.get(err.reason, 0) + 1
        return decoded.batch, decoded.owners

    def _infer(self, model: str, batch: np.ndarray, infer: Infer) -> np.ndarray:
        """Child call(s), chunked at the classifier's max batch, with the batch contract checked."""
        limit = self.classifiers[model].max_batch_size
        parts = [infer(model, batch[i:i + limit]) for i in range(0, len(batch), limit)]
        logits = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if logits.shape != (len(batch), len(self.labels)):
            raise ChildCallError(f"{model} returned shape {logits.shape} for a batch of {len(batch)}; expected ({len(batch)}, {len(self.labels)})")
        return logits

    def _split(self, requests, results, owners: np.ndarray, probs: np.ndarray, routes: np.ndarray) -> None:
        for r, req in enumerate(requests):
            if results[r] is not None:
                continue
            rows = np.flatnonzero(owners == r)
            k = req.topk or self.config.default_topk
            top = top_k(probs[rows], min(k, len(self.labels)), self.labels)
            results[r] = Prediction(top.labels, top.scores, top.class_ids, routes[rows].reshape(-1, 1))

    @staticmethod
    def _fail_pending(results, message: str, reason: str, timings: Timings) -> list[Prediction | RequestError]:
        for r, res in enumerate(results):
            if res is None:
                results[r] = RequestError(message, reason)
                timings.rejected[reason] = timings.rejected.get(reason, 0) + 1
        return results  # type: ignore[return-value]
