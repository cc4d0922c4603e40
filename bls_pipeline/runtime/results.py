"""What goes into the runtime and what comes out: one request, its answer or its error,
and what one execute() did (for the metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

__all__ = ["BAD_INPUT", "BROKEN", "ChildStats", "ImageRequest", "Prediction", "RequestError", "Timings", "UNAVAILABLE"]

# What a failed request's client is told, as gRPC status names (HTTP 400, 500, 503). Only
# UNAVAILABLE is worth sending again: the other two fail the same way every time.
BAD_INPUT = "INVALID_ARGUMENT"  # the request itself: an undecodable image, a bad TOPK, too many regions
BROKEN = "INTERNAL"  # a part of the deployment: a child breaking its contract, a flow that raised
UNAVAILABLE = "UNAVAILABLE"  # for now: no candidate READY, a child overloaded, the server draining
CODES = (BAD_INPUT, BROKEN, UNAVAILABLE)


@dataclass(frozen=True)
class ImageRequest:
    """One client request: its encoded images and its optional TOPK."""

    images: Sequence[bytes]
    # TOPK as sent: one value per image (a batched input), all equal; or None for the default
    topk: int | tuple[int, ...] | None = None
    # The outputs the client asked for; None: every one (LocalFlow). An output no request of
    # the run asks for is not built (the JSON documents).
    outputs: frozenset[str] | None = None

    @property
    def k(self) -> int | None:
        if self.topk is None or isinstance(self.topk, int):
            return self.topk
        return self.topk[0] if self.topk else None


@dataclass(frozen=True)
class RequestError:
    """Why one request failed; `message` is safe to send to the client."""

    message: str
    # What failed, for the metrics' reason label: a decode reason, "bad_request", "too_large",
    # "too_many_regions"; "flow" (the flow raised or left an image unanswered); a child's role
    # (the setting naming its candidates) or its name when a child call failed.
    reason: str
    code: str = BAD_INPUT  # one of CODES
    cause: BaseException | None = field(default=None, compare=False, repr=False)  # the flow's own exception, if it raised

    def __post_init__(self):
        if self.code not in CODES:
            raise ValueError(f"RequestError code {self.code!r}: use one of {', '.join(CODES)}")


@dataclass(frozen=True)
class Prediction:
    labels: np.ndarray  # (n, k) object (bytes "score:index:label"; b"" for a row that ended early)
    scores: np.ndarray  # (n, k) float32
    class_ids: np.ndarray  # (n, k) int32
    routes: np.ndarray  # (n, 1) object (bytes "model:branch", or the flow's own ROUTE)
    # The flow model's other outputs, by name, batch first: REGION_* (contract.py) and the
    # flow's own (answer.output), as its config.pbtxt declares them.
    outputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ChildStats:
    calls: int = 0
    images: int = 0
    seconds: float = 0.0


@dataclass
class Timings:
    """What one run did: seconds per stage, images per route, failed requests and their images
    per reason and code, calls per child. Every request that fails goes through reject()."""

    decode_preprocess: float = 0.0
    classify: float = 0.0  # the flow: its child calls and its own logic
    routes: dict[str, int] = field(default_factory=dict)
    rejected: dict[tuple[str, str], int] = field(default_factory=dict)  # (reason, code) -> images
    rejected_requests: dict[tuple[str, str], int] = field(default_factory=dict)  # (reason, code) -> requests
    children: dict[str, ChildStats] = field(default_factory=dict)
    trials: dict = field(default_factory=dict)  # (stable, candidate) -> trials.PairStats: the shadow's, since the last run

    def count(self, table: dict, key, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n

    def reject(self, error: "RequestError", images: int) -> None:
        """Count a request that failed with `error`, and its images (every one it carried)."""
        self.count(self.rejected, (error.reason, error.code), images)
        self.count(self.rejected_requests, (error.reason, error.code))
