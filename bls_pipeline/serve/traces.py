"""Triton's request traces, as bls-serve reads them: the per-trace files Triton writes
(`--trace-config triton,file=F`, `log-frequency=1`: F.0, F.1, ... one JSON list each), each
entry's timestamps merged by trace id.

A flow's request trace carries REQUEST_START, QUEUE_START, COMPUTE_START, COMPUTE_END and
REQUEST_END (and the protocol's receive and send); the child calls the flow made for the
execute() it was the first request of are entries with its id as `parent_id`. A request
that left Triton's queue without reaching the model has no COMPUTE_START, and the rest of
its trace says how it left (RequestTrace.unserved). The
timestamps are nanoseconds on CLOCK_MONOTONIC, the clock of time.monotonic_ns() in every
process on the machine.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CANCELLED", "QUEUE_FULL", "QUEUE_TIMEOUT", "RequestTrace", "TraceFiles", "parse"]

log = logging.getLogger(__name__)

# How a request the model never saw left Triton's queue (RequestTrace.unserved).
QUEUE_FULL = "queue_full"  # refused as it came: "Exceeds maximum queue size" (503)
QUEUE_TIMEOUT = "queue_timeout"  # refused once it waited out its timeout: "Request timeout expired" (503)
CANCELLED = "cancelled"  # its client had gone (it cancelled, or its gRPC deadline passed): no answer sent


@dataclass
class RequestTrace:
    id: int
    model: str = ""
    version: str = ""
    request_id: str = ""
    parent_id: int | None = None
    ns: dict[str, int] = field(default_factory=dict)  # timestamp name -> ns
    children: list["RequestTrace"] = field(default_factory=list)  # the calls made under it

    def span_ms(self, start: str, end: str) -> float | None:
        """Milliseconds from one timestamp to another, or None where either is missing."""
        if start in self.ns and end in self.ns:
            return (self.ns[end] - self.ns[start]) / 1e6
        return None

    @property
    def unserved(self) -> str | None:
        """How a request that entered Triton's queue and never reached the model left it, as
        Triton 2.51 traces it over HTTP and gRPC alike (tests/integration/test_outcomes.py):
        QUEUE_FULL: the queue refused it as it came, and Triton never took it (no REQUEST_END);
        QUEUE_TIMEOUT: released once it waited out its timeout, its 503 sent (REQUEST_END and the
        frontend's INFER_RESPONSE_COMPLETE); CANCELLED: released with no response, because its
        client had gone (the gRPC frontend sends nothing on a cancelled call). None: it reached
        the model (COMPUTE_START), or never entered a queue."""
        if "QUEUE_START" not in self.ns or "COMPUTE_START" in self.ns:
            return None
        if "REQUEST_END" not in self.ns:
            return QUEUE_FULL
        return QUEUE_TIMEOUT if "INFER_RESPONSE_COMPLETE" in self.ns else CANCELLED

    @property
    def refused(self) -> bool:
        """Refused by Triton's queue (full, or its timeout: 503) before the model saw it; a
        request whose client had gone is not (unserved: CANCELLED)."""
        return self.unserved in (QUEUE_FULL, QUEUE_TIMEOUT)


def parse(text: str) -> list[RequestTrace]:
    """The traces in one file's JSON list, each with its children (entries with a parent_id
    in the same file); ValueError for text that is not (yet) such a list."""
    entries = json.loads(text)
    if not isinstance(entries, list):
        raise ValueError("a trace file holds a JSON list")
    traces: dict[int, RequestTrace] = {}
    for entry in entries:
        trace = traces.setdefault(entry["id"], RequestTrace(entry["id"]))
        if "model_name" in entry:
            trace.model = entry["model_name"]
            trace.version = str(entry.get("model_version", ""))
            trace.request_id = entry.get("request_id", "")
            trace.parent_id = entry.get("parent_id")
        for stamp in entry.get("timestamps", ()):
            trace.ns[stamp["name"]] = int(stamp["ns"])
    for trace in traces.values():
        if trace.parent_id is not None and trace.parent_id in traces:
            traces[trace.parent_id].children.append(trace)
    return [t for t in traces.values() if t.parent_id is None or t.parent_id not in traces]


class TraceFiles:
    """The files Triton writes under `prefix` (prefix.0, prefix.1, ...), each read once when
    whole. `remove`: delete each once read (bls-serve's own folder); else leave it (the user's
    --trace). A file that does not parse is being written: tried again at the next read, and
    given up after `patience_s` (counted in `unreadable`)."""

    def __init__(self, prefix: Path, remove: bool, patience_s: float = 10.0):
        self.prefix = Path(prefix)
        self.remove = remove
        self.patience_s = patience_s
        self._done: set[str] = set()
        self._first_seen: dict[str, float] = {}
        self.unreadable = 0

    def read_new(self) -> list[RequestTrace]:
        found = []
        for path in sorted(self.prefix.parent.glob(f"{self.prefix.name}.*")):
            if path.name in self._done or not path.name.rsplit(".", 1)[-1].isdigit():
                continue
            try:
                traces = parse(path.read_text())
            except (OSError, ValueError, KeyError, TypeError):
                first = self._first_seen.setdefault(path.name, time.monotonic())
                if time.monotonic() - first > self.patience_s:
                    log.warning("trace file %s did not parse for %.0f s: skipped", path, self.patience_s)
                    self.unreadable += 1
                    self._finish(path)
                continue
            found.extend(traces)
            self._finish(path)
        return found

    def _finish(self, path: Path) -> None:
        self._first_seen.pop(path.name, None)
        if self.remove:
            path.unlink(missing_ok=True)
        else:
            self._done.add(path.name)
