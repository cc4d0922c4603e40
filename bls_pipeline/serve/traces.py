"""Triton's request traces, as bls-serve reads them: the per-trace files Triton writes
(`--trace-config triton,file=F`, `log-frequency=1`: F.0, F.1, ... one JSON list each), each
entry's timestamps merged by trace id.

A flow's request trace carries REQUEST_START, QUEUE_START, COMPUTE_START, COMPUTE_END and
REQUEST_END (and the protocol's receive and send); the child calls the flow made for the
execute() it was the first request of are entries with its id as `parent_id`. A request
Triton refused in its queue (full, or waited out its timeout) has no COMPUTE_START. The
timestamps are nanoseconds on CLOCK_MONOTONIC, the clock of time.monotonic_ns() in every
process on the machine.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["RequestTrace", "TraceFiles", "parse"]

log = logging.getLogger(__name__)


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
    def refused(self) -> bool:
        """Refused before the model saw it: queued, never computed (Triton's queue full or its timeout)."""
        return "QUEUE_START" in self.ns and "COMPUTE_START" not in self.ns


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
