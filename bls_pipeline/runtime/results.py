"""What goes into the runtime and what comes out: one request, its answer or its error,
and what one execute() did (for the metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

__all__ = ["BAD_INPUT", "BROKEN", "CANCELLED", "ChildStats", "ImageRequest", "Prediction", "RequestError", "Timings",
           "UNAVAILABLE"]

# What a failed request's client is told, as gRPC status names (HTTP 400, 500, 503). Only
# UNAVAILABLE is worth sending again: the other two fail the same way every time. CANCELLED
# answers a request whose client cancelled it (a gRPC deadline passing cancels it too): no
# client reads it.
BAD_INPUT = "INVALID_ARGUMENT"  # the request itself: an undecodable image, a bad TOPK, too many regions
BROKEN = "INTERNAL"  # a part of the deployment: a child breaking its contract, a flow that raised
# for now: no candidate READY, a child overloaded, a deadline too short, the server draining
UNAVAILABLE = "UNAVAILABLE"
CANCELLED = "CANCELLED"  # the client went away
CODES = (BAD_INPUT, BROKEN, UNAVAILABLE, CANCELLED)


@dataclass(frozen=True)
class ImageRequest:
    """One client request: its encoded images, its optional TOPK, and what else it carries.

    id: the request id the client sent ("" when none).
    parameters: its request parameters as sent (KServe v2 `parameters`), by name; the flow's
        declared Parameters are read from them, Triton's own pass by.
    timeout_s: the client's deadline, seconds from when it sent the request (Triton's
        `timeout` request parameter), or None: it gave none.
    cancelled: asks whether the client has gone (a cancelled gRPC call); None: it cannot tell.
    """

    images: Sequence[bytes]
    # TOPK as sent: one value per image (a batched input), all equal; or None for the default
    topk: int | tuple[int, ...] | None = None
    # The outputs the client asked for; None: every one (LocalFlow). An output no request of
    # the run asks for is not built (the JSON documents).
    outputs: frozenset[str] | None = None
    id: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float | None = None
    cancelled: Callable[[], bool] | None = field(default=None, compare=False, repr=False)

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
    # the flow's own exception, if it raised
    cause: BaseException | None = field(default=None, compare=False, repr=False)

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
    # Per image, what its JSON answer says beside the outputs ({"degraded": why}); () for none.
    notes: tuple[Mapping[str, str], ...] = ()


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
    # Images of requests dropped before they finished, (why, stage, code) -> images: why is
    # cancelled, expired or no_time (admission.py), stage where it happened (admission,
    # decode, a child model's name).
    dropped: dict[tuple[str, str, str], int] = field(default_factory=dict)
    # Images answered degraded, (stage, why) -> images: the optional stage (a child model)
    # skipped under overload, why: late (it would have answered after their aim) or busy (it
    # refused the call).
    degraded: dict[tuple[str, str], int] = field(default_factory=dict)
    queue_wait_s: float | None = None  # the longest a request of this run may have waited in the queue (admission.py)
    answered_gone: int = 0  # requests answered after their client had gone (asked as the run ended)
    rejected_requests: dict[tuple[str, str], int] = field(default_factory=dict)  # (reason, code) -> requests
    children: dict[str, ChildStats] = field(default_factory=dict)
    # (stable, candidate) -> trials.PairStats: the shadow's, since the last run
    trials: dict = field(default_factory=dict)

    def count(self, table: dict, key, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n

    def reject(self, error: "RequestError", images: int) -> None:
        """Count a request that failed with `error`, and its images (every one it carried)."""
        self.count(self.rejected, (error.reason, error.code), images)
        self.count(self.rejected_requests, (error.reason, error.code))
