"""Where one execute() of a flow model spent its time, as one JSON record: the server log's line
(`log_executions`) and what `bls-explain` joins with Triton's trace of each request.

The parts of an execute(), in order, each timed here, so that together they cover it:

    read         the requests' inputs read (pb_utils to numpy), users' and probes'
    decode_preprocess, flow (child_calls inside it), answers (request checks, top-k, the
                 answers built): the users' requests through the runtime
    probes       the watchdog's probes that came in the same execute() and were run (the
                 users' responses wait for them): only when no user's request was answered
    metrics      the users' counts added for the metrics' flusher
    responses    the pb_utils responses built

`t0_ns` and `t1_ns` bound the execute() on CLOCK_MONOTONIC, the clock of Triton's trace
timestamps, so a trace's COMPUTE_START..COMPUTE_END shows what happened outside it (the hand-over
to this stub and back). bls-serve passes a Unix datagram socket (contract.EXECUTIONS_ENV) that
RecordSink sends each record to, never waiting: a record the socket cannot take is dropped.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import Any, Callable, Mapping, Sequence

from ..runtime.results import Prediction, Timings

__all__ = ["ExecuteTimes", "RecordSink", "TimedSend", "execution_record"]

log = logging.getLogger(__name__)


class TimedSend:
    """A send (the runtime's transport) that adds up the wall time of its calls: the child calls
    of one execute(), together calls counted once."""

    def __init__(self, send: Callable[[Sequence], list]):
        self._send = send
        self.seconds = 0.0

    def __call__(self, requests: Sequence) -> list:
        started = time.perf_counter()
        try:
            return self._send(requests)
        finally:
            self.seconds += time.perf_counter() - started

    def take(self) -> float:
        """The seconds since the last take()."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds


class ExecuteTimes:
    """The parts of one execute(), lap by lap, from its start (now)."""

    def __init__(self):
        self.t0_ns = time.monotonic_ns()
        self._last = self.t0_ns
        self.ms: dict[str, float] = {}

    def lap(self, part: str | None) -> float:
        """Milliseconds since the last lap, added to `part` (None: the caller splits them)."""
        now = time.monotonic_ns()
        elapsed = (now - self._last) / 1e6
        self._last = now
        if part is not None:
            self.ms[part] = self.ms.get(part, 0.0) + elapsed
        return elapsed

    def users(self, run_ms: float, timings: Timings, child_seconds: float) -> None:
        """The users' run through the runtime (`run_ms`, a lap) in its parts: decode_preprocess,
        the flow (its child calls within it), and the rest (checks, top-k, answers)."""
        decode, flow = timings.decode_preprocess * 1e3, timings.classify * 1e3
        self.ms.update(decode_preprocess=decode, flow=flow, child_calls=child_seconds * 1e3,
                       answers=max(0.0, run_ms - decode - flow))


def execution_record(flow: str, instance: str, times: ExecuteTimes, t1_ns: int, request_ids: Sequence[str],
                     results: Sequence, timings: Timings | None, probes: int,
                     in_process: Sequence[str] = ()) -> dict[str, Any]:
    """One execute() as a record (the keys docs/reliability.md, "Tracing", shows): its users'
    requests (their ids; "#<i>" for one sent without), which of them failed, whose trace the
    child calls joined (the first's), the probes beside them, its parts and its children, in
    milliseconds."""
    ids = [rid or f"#{i}" for i, rid in enumerate(request_ids)]
    children = {} if timings is None else timings.children
    return {
        "event": "bls_execute", "flow": flow, "instance": instance, "pid": os.getpid(), "t0_ns": times.t0_ns,
        "t1_ns": t1_ns, "requests": ids, "probes": probes,
        "images": sum(len(r.routes) for r in results if isinstance(r, Prediction)),
        "failed": {rid: r.code for rid, r in zip(ids, results) if not isinstance(r, Prediction)},
        "child_calls_traced_with": ids[0] if ids else None,
        "ms": {part: round(ms, 3) for part, ms in times.ms.items()},
        "children": {child: {"calls": st.calls, "images": st.images, "ms": round(st.seconds * 1e3, 3),
                             "in_process": child in in_process} for child, st in children.items()},
    }


def line(record: Mapping[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))


class RecordSink:
    """Sends records to bls-serve's socket at `path` (None: nowhere), one datagram each."""

    def __init__(self, path: str | None):
        self._path = path
        self._socket = None
        if path:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._socket.setblocking(False)
        self.dropped = 0

    @property
    def active(self) -> bool:
        """Whether records sent go anywhere."""
        return self._socket is not None

    def send(self, text: str) -> None:
        if self._socket is None:
            return
        try:
            self._socket.sendto(text.encode(), self._path)
        except OSError:  # bls-serve's reader behind (the socket full), or gone: never wait for it
            self.dropped += 1

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
