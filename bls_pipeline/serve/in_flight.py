"""Whether anything is in flight in a draining tritonserver, from what Triton reports.

The drain (server.py) unloads the models in stages and waits for each stage to be destroyed,
which Triton does once no request holds the model. On Triton 2.51 a gRPC call whose
cancellation raced its response can keep a model from being destroyed with nothing in flight
(docs/reliability.md, "Stopping bls-serve"): the model stays UNLOADING until tritonserver's
exit timeout. A Snapshot is what Triton and the kernel say at one moment:

- `pending`: Triton's nv_inference_pending_request_count gauge, summed over every model (the
  requests waiting in a scheduler's queue; metrics port);
- `answered`: per model, the requests Triton counted as finished (the statistics extension's
  inference_stats success + fail), so an execute() that answers anything shows;
- `cpu_ticks`: per python stub, the CPU time it used (/proc), so an execute() that computes,
  or a child computing for it, shows.

Nothing is in flight (`quiet`) when, over a whole interval, nothing was pending, no request
was answered, and no stub used more than a tick or two of CPU. A request still executing
would be answered, or compute, within that interval; one that does neither for that long is
not told apart from a reference nobody holds for a request (that is the known limit)."""

from __future__ import annotations

import json
import re
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..base.statistics import summed

__all__ = ["PENDING_GAUGE", "QUIET_S", "HeldStubs", "QuietWatch", "Snapshot", "answered_counts", "pending_count",
           "quiet", "read_snapshot", "stub_cpu_ticks"]

PENDING_GAUGE = "nv_inference_pending_request_count"
# CPU a stub may use in an interval and still count as idle (its threads wake now and then:
# the parent's health check, a summary line); one execute() of the smallest flow uses more.
IDLE_TICKS = 2
# How long Triton must report nothing in flight before a model still unloading counts as held
# by no request: every stop that meets such a model waits this long; a request executing
# answers, or computes, sooner.
QUIET_S = 1.5

_PENDING = re.compile(rf"^{PENDING_GAUGE}{{[^}}]*}} ([0-9.e+]+)$", re.M)


@dataclass(frozen=True)
class Snapshot:
    at: float  # time.monotonic()
    pending: float | None  # None: Triton did not say (no metrics port, or the gauge absent)
    answered: dict[str, int]
    cpu_ticks: dict[int, int]  # stub pid -> utime + stime (clock ticks)


def pending_count(metrics_text: str) -> float | None:
    """The sum of nv_inference_pending_request_count over every model; None if absent."""
    values = _PENDING.findall(metrics_text)
    return sum(float(v) for v in values) if values else None


def answered_counts(stats: dict) -> dict[str, int]:
    """{model: requests finished (success + fail)} from /v2/models/stats, versions added up."""
    failed = summed(stats, "fail")
    return {model: count + failed[model] for model, count in summed(stats, "success").items()}


def stub_cpu_ticks(pids) -> dict[int, int]:
    """pid -> the CPU it used so far (user + system, clock ticks); pids gone are left out."""
    ticks = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks[pid] = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        except (OSError, IndexError, ValueError):
            continue
    return ticks


def read_snapshot(now: float, http_url: str, metrics_url: str | None, stub_pids) -> Snapshot:
    """What tritonserver (HTTP statistics, metrics) and the kernel say now; raises OSError or
    ValueError where tritonserver does not answer."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/stats", timeout=2) as r:
        answered = answered_counts(json.loads(r.read()))
    pending = None
    if metrics_url:
        with urllib.request.urlopen(metrics_url, timeout=2) as r:
            pending = pending_count(r.read().decode())
    return Snapshot(now, pending, answered, stub_cpu_ticks(stub_pids))


def quiet(first: Snapshot, last: Snapshot) -> bool:
    """Nothing in flight from `first` to `last`: Triton reported nothing pending at both, no
    request answered in between, and no stub (alive at both) used more than IDLE_TICKS."""
    if first.pending is None or last.pending is None or first.pending or last.pending:
        return False
    if any(last.answered.get(model, count) != count for model, count in first.answered.items()):
        return False
    return all(last.cpu_ticks[pid] - ticks <= IDLE_TICKS for pid, ticks in first.cpu_ticks.items()
               if pid in last.cpu_ticks)



class QuietWatch:
    """Snapshots taken one after another (`read`, at most one per `every_s`); says when Triton
    has reported nothing in flight for a whole `interval_s` (quiet from the first snapshot of
    the run to the latest one)."""

    def __init__(self, read: Callable[[], Snapshot], interval_s: float = QUIET_S, every_s: float = 0.25):
        self.read, self.interval_s, self.every_s = read, interval_s, every_s
        self.first: Snapshot | None = None
        self.last: Snapshot | None = None

    def quiet_for(self, now: float) -> float:
        """How long nothing has been in flight, as of the latest snapshot (0.0: something is,
        or it cannot be told); takes a new snapshot once `every_s` has passed."""
        if self.last is None or now - self.last.at >= self.every_s:
            try:
                self.last = self.read()
            except (OSError, ValueError):  # tritonserver did not answer: nothing can be told
                self.first = self.last = None
                return 0.0
            if self.first is None or not quiet(self.first, self.last):
                self.first = self.last
        return self.last.at - self.first.at

    def held(self, now: float) -> bool:
        """Nothing in flight for `interval_s` at least."""
        return self.quiet_for(now) >= self.interval_s


class HeldStubs:
    """The python stubs of models the drain judged held, watched after tritonserver's SIGTERM.

    A model truly held keeps its stubs alive and idle until tritonserver is killed. One that
    was only slow to unload (on a busy machine each python instance's destruction starts with
    the backend's 1 s health check, its stub idle, and can outlast QUIET_S) shows it: a stub
    of its exits, or computes (its finalize(), the interpreter's teardown)."""

    def __init__(self, stubs: dict[int, str], model_of: Callable[[str], str | None]):
        self.model = {pid: model_of(instance) for pid, instance in stubs.items()}  # pid -> model
        self.ticks = stub_cpu_ticks(stubs)

    def stirred(self) -> set[str]:
        """The models one of whose stubs exited, or used more than IDLE_TICKS, since the watch began."""
        now = stub_cpu_ticks(self.ticks)
        return {self.model[pid] for pid, ticks in self.ticks.items() if pid not in now or now[pid] - ticks > IDLE_TICKS}
