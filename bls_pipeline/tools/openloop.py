"""`bls-bench --open-loop 0.5,0.8,0.95`: what a target does for arrivals below its capacity.

Per target, protocol and client kind, against one server:

    capacity   closed loop, `capacity_clients` clients, no deadline (as --overload measures
               it): requests/s, one image each; or the capacity given (--capacity)
    loads      for each fraction L: Poisson arrivals at L x capacity, `warmup_s` not counted,
               then `duration_s` counted. Each request is sent at its scheduled time whether or
               not earlier ones were answered (open loop), with a deadline: over gRPC the
               call's deadline, over HTTP the client's own timeout; with the `timeout` client
               kind also Triton's `timeout` request parameter. The photos are sent in turn.

Reported per load: requests sent, answered in time, refused (by Triton's queue, full or timed
out, or by the model), deadlines passed, errors, p50/p99 of the answers, p99 of the
refusals, what the server finished and how much of it for clients already gone (the flow's
own count, loadgen.FinishedCounter), and whether the load generator kept to its schedule:
sends more than LATE_MS behind their time are counted, and a load where over 1% were is
marked. The clients are loadgen.py's: asyncio tasks in this one thread.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field

import numpy as np

from .loadgen import REFUSERS, TRITON_SUCCESS_COUNTS, AioClient, FinishedCounter, Tally, closed_loop, percentile_ms

__all__ = ["LATE_MS", "OpenLoopResult", "markdown", "poisson_schedule", "run_target"]

LATE_MS = 10.0  # a send this far behind its scheduled time counts as late
LATE_SHARE = 0.01  # a load with more late sends than this is marked: the generator fell behind


@dataclass
class OpenLoopResult:
    target: str
    protocol: str
    timeout_parameter: bool  # also Triton's `timeout` request parameter
    capacity_per_s: float  # requests/s (one image each) of the closed loop, or as given
    capacity_measured: bool
    load: float  # the fraction of capacity offered
    rate_per_s: float  # the arrival rate scheduled
    duration_s: float
    deadline_s: float
    sent: int
    sent_per_s: float
    answered: int  # within the deadline
    answer_p50_ms: float
    answer_p99_ms: float
    refused: int
    refused_by: dict[str, int]  # loadgen.REFUSERS -> count
    refusal_p99_ms: float
    deadlines_passed: int
    errors: int
    finished: int  # what the server finished of the counted requests
    finished_for_gone: int  # of those, answers no client was still waiting for
    finished_counted_by: str  # FinishedCounter.source
    late_sends: int  # sent more than LATE_MS behind schedule
    lag_p99_ms: float  # how far behind schedule sends were, p99
    load_cores: float  # CPU the load generator used, in cores
    error_samples: list[str] = field(default_factory=list)

    @property
    def fell_behind(self) -> bool:
        return self.late_sends > LATE_SHARE * max(self.sent, 1)


def poisson_schedule(rate_per_s: float, duration_s: float, seed: int) -> list[float]:
    """Arrival times (seconds from the start, increasing, all below duration_s) of a Poisson
    process at rate_per_s: independent exponential gaps of mean 1 / rate_per_s."""
    if rate_per_s <= 0:
        raise ValueError(f"an arrival rate must be above 0 per second, got {rate_per_s}")
    rng = random.Random(seed)
    times, t = [], rng.expovariate(rate_per_s)
    while t < duration_s:
        times.append(t)
        t += rng.expovariate(rate_per_s)
    return times


async def _open_loop(client: AioClient, requests: list, schedule: list[float], deadline_s: float,
                     timeout_parameter: bool) -> tuple[Tally, list[float]]:
    """Send request k (the payloads in turn) at schedule[k] seconds from now, not waiting for answers; the
    Tally of their outcomes and how late each was sent (seconds)."""
    tally, lags = Tally(), []

    async def one(k: int, at: float) -> None:
        t0 = time.perf_counter()
        lags.append(t0 - at)
        outcome = await client.send(requests[k % len(requests)], deadline_s, timeout_parameter)
        tally.record(outcome, t0, time.perf_counter())

    start = time.perf_counter()
    tasks = []
    for k, offset in enumerate(schedule):
        wait = start + offset - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(one(k, start + offset)))
    await asyncio.gather(*tasks)
    return tally, lags


def run_target(url: str, protocol: str, target: str, model: str, payloads: list[bytes], *, output: str,
               loads: tuple[float, ...], is_flow: bool | None, metrics_url: str | None, deadline_s: float = 2.0,
               duration_s: float = 15.0, warmup_s: float = 3.0, capacity_clients: int = 8, capacity_s: float = 10.0,
               capacity: float | None = None, timeout_parameter: bool = False, seed: int = 0) -> list[OpenLoopResult]:
    """Capacity (measured unless given), then each load in turn; one result per load. The
    warm-up at each load's rate is sent and answered before the counted part starts, so the
    server's counts cover exactly the counted requests."""
    counter = FinishedCounter.for_model(model, metrics_url, url, protocol, is_flow)

    async def run() -> list[OpenLoopResult]:
        client = AioClient(protocol, url, 4096)
        requests = [client.request(model, p, output) for p in payloads]
        results = []
        try:
            rate = capacity
            if rate is None:
                closed, t0, t1 = await closed_loop(client, requests, capacity_clients, None, False, warmup_s,
                                                   capacity_s, seed)
                rate = len(closed.answered_ms) / (t1 - t0)
                if not rate:
                    raise RuntimeError(f"{target} over {protocol}: no answer in {capacity_s} s of closed loop "
                                       f"({closed.errors} errors, e.g. {closed.error_samples[:1]}): no capacity to "
                                       "load it at")
            for n, load in enumerate(loads):
                arrivals = load * rate
                if warmup_s > 0:
                    await _open_loop(client, requests, poisson_schedule(arrivals, warmup_s, seed + 1 + 2 * n),
                                     deadline_s, timeout_parameter)
                schedule = poisson_schedule(arrivals, duration_s, seed + 2 + 2 * n)
                before = counter.read_settled()
                cpu0, wall0 = time.process_time(), time.perf_counter()
                tally, lags = await _open_loop(client, requests, schedule, deadline_s, timeout_parameter)
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                finished = int(round(counter.read_settled(before + len(tally.answered_ms)) - before))
                lag_ms = np.array(lags) * 1e3
                results.append(OpenLoopResult(
                    target, protocol, timeout_parameter, rate, capacity is None, load, arrivals, duration_s, deadline_s,
                    len(schedule), len(schedule) / duration_s, len(tally.answered_ms),
                    percentile_ms(tally.answered_ms, 50),
                    percentile_ms(tally.answered_ms, 99), len(tally.refused_ms),
                    {who: tally.refused_by[who] for who in REFUSERS},
                    percentile_ms(tally.refused_ms, 99), tally.gone, tally.errors, finished,
                    max(0, finished - len(tally.answered_ms)), counter.source, int((lag_ms > LATE_MS).sum()),
                    percentile_ms(list(lag_ms), 99), cpu / wall if wall else math.nan, tally.error_samples))
        finally:
            await client.close()
        return results

    return asyncio.run(run())


def markdown(results: list[OpenLoopResult], meta: dict) -> str:
    lines = [f"Machine: {meta.get('machine')}. Versions: {meta.get('versions')}. Images: {meta.get('image_set')}; one "
             f"per request, in turn. Served: {meta.get('served')}. Capacity: {meta.get('capacity')}. Each load: "
             f"Poisson arrivals, {meta.get('warmup_s')} s not counted, then {meta.get('duration_s')} s counted; each "
             "request with a "
             f"{meta.get('deadline_s')} s deadline.", "",
             "| target | protocol, client | load | arrivals /s (capacity) | sent | answered in time | refused "
             "| refused: queue full / queue timeout / model | deadlines passed | errors | answer p50 / p99 ms "
             "| refusal p99 ms | finished by the server (client gone) | sent late | load generator cores |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        proto = r.protocol + (", deadline + timeout parameter" if r.timeout_parameter else ", deadline only")
        by = " / ".join(str(r.refused_by.get(who, 0)) for who in REFUSERS)
        refusal = "-" if not r.refused else f"{r.refusal_p99_ms:.0f}"
        answers = "-" if not r.answered else f"{r.answer_p50_ms:.0f} / {r.answer_p99_ms:.0f}"
        late = f"{r.late_sends} (p99 {r.lag_p99_ms:.0f} ms)" + (" FELL BEHIND" if r.fell_behind else "")
        mark = "" if r.finished_counted_by.startswith("bls_") else " *"
        lines.append(f"| {r.target} | {proto} | {r.load:g}x | {r.rate_per_s:.1f} ({r.capacity_per_s:.1f}) | {r.sent} | "
                     f"{r.answered} | {r.refused} ({r.refused / max(r.sent, 1):.1%}) | {by} | {r.deadlines_passed} | "
                     f"{r.errors} | {answers} | {refusal} | {r.finished}{mark} ({r.finished_for_gone}) | {late} | "
                     f"{r.load_cores:.2f} |")
    lines += ["", 'Finished by the server: a flow\'s own bls_requests_total{code=~"OK|GONE"} (the requests it answered '
                  'with labels, its client there or gone). '
                  f"Sent late: sends more than {LATE_MS:g} ms behind their scheduled time; FELL BEHIND: over "
                  f"{LATE_SHARE:.0%} of them, the arrivals were not the Poisson process asked for (a busy machine, or "
                  "too high a rate for one thread of clients)."]
    if any(not r.finished_counted_by.startswith("bls_") for r in results):
        lines[-1] += f" * Not a flow: {TRITON_SUCCESS_COUNTS}, so this figure can be too high."
    return "\n".join(lines) + "\n"
