"""`bls-bench --overload`: what a target does for its clients past its capacity.

Per target and protocol, three phases against one server:

    capacity   closed loop, `capacity_clients` clients, no deadline: images/s, p50, p99
    spike      clients = factor x capacity x deadline (4x overload by default), each with a
               deadline: sends, waits at most the deadline, sends again at once when it
               passed; after a refusal (503 / UNAVAILABLE) it backs off (exponential, full
               jitter, capped at 1 s, as gRPC's retry policy). Over gRPC the deadline is the
               call's deadline (the client cancels at it); over HTTP the client stops waiting
               at it. Both also send Triton's `timeout` request parameter (the deadline in
               microseconds), unless --no-timeout-parameter.
    recovery   the capacity clients again, at once: seconds until p99 is back to normal

Reported per spike: goodput (answers received within their deadline, per second, and as a
share of capacity), what the server finished in the spike (answers a client could use: the
flow's own bls_requests_total{code=~"OK|GONE"} from the metrics port, with --url as without;
Triton's success count only for models that are not flows, and the table says that it counts
refusals too) and the share of it whose client had already gone, refusals (by Triton's queue,
full or timed out, or by the model) and their latency, and the cores the load generator used.
Several factors in one run share one capacity measurement, each spike its own row. The
clients are loadgen.py's: asyncio tasks in this one thread.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

import numpy as np

from .loadgen import TRITON_SUCCESS_COUNTS, AioClient, FinishedCounter, closed_loop, percentile_ms

__all__ = ["OverloadResult", "markdown", "recovery_seconds", "run_factors", "run_target"]


@dataclass
class OverloadResult:
    target: str
    protocol: str
    capacity_images_per_s: float
    normal_p50_ms: float
    normal_p99_ms: float
    clients: int
    deadline_s: float
    spike_s: float
    in_time_per_s: float  # goodput
    goodput_ratio: float  # goodput / capacity
    finished: int  # images the server finished during the spike
    finished_for_gone: int  # of those, answers no client was still waiting for
    gone_share: float
    refused: int
    refused_by_queue: int  # of those, by Triton's queue (full, or its timeout) before any model saw them
    refusal_p50_ms: float
    refusal_p99_ms: float
    deadlines_passed: int
    errors: int
    recovery_s: float | None  # None: not back to normal within the recovery window
    load_cores: float  # CPU the load generator used during the spike, in cores
    timeout_parameter: bool
    error_samples: list[str] = field(default_factory=list)
    factor: float = 4.0  # clients = factor x capacity x deadline
    refused_by: dict[str, int] = field(default_factory=dict)  # loadgen.REFUSERS -> count
    finished_counted_by: str = ""  # FinishedCounter.source: the flow's own count, or Triton's success count


def recovery_seconds(done_at: np.ndarray, latency_ms: np.ndarray, start: float, normal_p99_ms: float,
                     window_s: float = 1.0, step_s: float = 0.25) -> float | None:
    """Seconds from `start` until every window of answers completing from then on has its p99
    within 1.5x the normal p99 (20 ms of slack on a tiny one); None if that never happens."""
    limit = max(1.5 * normal_p99_ms, normal_p99_ms + 20.0)
    if len(done_at) == 0:
        return None
    end = float(done_at.max())
    t = start
    while t + window_s <= end + 1e-9:
        ok = True
        probe = t
        while probe + window_s <= end + 1e-9:
            inside = latency_ms[(done_at >= probe) & (done_at < probe + window_s)]
            if len(inside) and np.percentile(inside, 99) > limit:
                ok = False
                break
            probe += step_s
        if ok:
            return t - start
        t += step_s
    return None


def run_factors(url: str, protocol: str, target: str, model: str, payloads: list[bytes], *, output: str,
                is_flow: bool | None, metrics_url: str | None, deadline_s: float = 0.5,
                factors: tuple[float, ...] = (4.0,),
                capacity_clients: int = 8, capacity_s: float = 10.0, spike_s: float = 30.0, recovery_s: float = 10.0,
                warmup_s: float = 3.0, timeout_parameter: bool = True, seed: int = 0) -> list[OverloadResult]:
    """One target over one protocol (the server already up): its capacity, then for each
    factor a spike and the recovery after it; one result per factor. What the server finished
    is the flow's own count (is_flow None: a flow when metrics_url has its series), else
    Triton's success count (loadgen.FinishedCounter)."""
    counter = FinishedCounter.for_model(model, metrics_url, url, protocol, is_flow)

    async def run() -> list[OverloadResult]:
        client = AioClient(protocol, url, max(capacity_clients, 4096))
        requests = [client.request(model, p, output) for p in payloads]
        results = []
        try:
            normal, t0, t1 = await closed_loop(client, requests, capacity_clients, None, False, warmup_s, capacity_s,
                                               seed)
            capacity = len(normal.answered_ms) / (t1 - t0)
            p50, p99 = percentile_ms(normal.answered_ms, 50), percentile_ms(normal.answered_ms, 99)
            for n, factor in enumerate(factors):
                clients = max(capacity_clients + 1, math.ceil(factor * capacity * deadline_s))
                finished_before = counter.read()
                cpu0 = time.process_time()
                spike, s0, s1 = await closed_loop(client, requests, clients, deadline_s, timeout_parameter, 0.0,
                                                  spike_s, seed + 1 + 2 * n)
                cpu = time.process_time() - cpu0
                finished = counter.read() - finished_before
                after, r0, _ = await closed_loop(client, requests, capacity_clients, None, False, 0.0, recovery_s,
                                                 seed + 2 + 2 * n)
                in_time = len(spike.answered_ms)
                back = recovery_seconds(np.array(after.answered_at), np.array(after.answered_ms), r0, p99)
                wasted = max(0, int(round(finished)) - in_time)
                results.append(OverloadResult(
                    target, protocol, capacity, p50, p99, clients, deadline_s, spike_s, in_time / (s1 - s0),
                    in_time / (s1 - s0) / capacity if capacity else math.nan, int(round(finished)), wasted,
                    wasted / finished if finished else 0.0, len(spike.refused_ms), spike.refused_by_queue,
                    percentile_ms(spike.refused_ms, 50), percentile_ms(spike.refused_ms, 99),
                    spike.gone, spike.errors, back, cpu / (s1 - s0), timeout_parameter,
                    spike.error_samples + normal.error_samples, factor, dict(spike.refused_by), counter.source))
        finally:
            await client.close()
        return results

    return asyncio.run(run())


def run_target(url: str, protocol: str, target: str, model: str, payloads: list[bytes], *, output: str,
               is_flow: bool | None,
               metrics_url: str | None, deadline_s: float = 0.5, factor: float = 4.0, **kwargs) -> OverloadResult:
    """run_factors at one factor."""
    (result,) = run_factors(url, protocol, target, model, payloads, output=output, is_flow=is_flow,
                            metrics_url=metrics_url, deadline_s=deadline_s, factors=(factor,), **kwargs)
    return result


def markdown(results: list[OverloadResult], meta: dict) -> str:
    factors = ", ".join(f"{f:g}x" for f in dict.fromkeys(r.factor for r in results)) or f"{meta.get('factor')}x"
    lines = [f"Machine: {meta.get('machine')}. Versions: {meta.get('versions')}. Images: {meta.get('image_set')}; one "
             f"per request. Served: {meta.get('served')}. Capacity: {meta.get('capacity_clients')} closed-loop clients "
             f"for {meta.get('capacity_s')} s; spikes: {factors} overload (clients = factor x capacity x deadline), "
             f"{meta.get('spike_s')} s each; recovery watched for {meta.get('recovery_s')} s after each.", "",
             "| target | protocol, client | factor | capacity img/s | normal p50 / p99 ms | clients | deadline s | in "
             "time /s | goodput / capacity | finished by the server | of those, client gone | refused: queue full / "
             "queue timeout / model | refusal p50 / p99 ms | deadlines passed | errors | p99 normal again after s | "
             "load generator cores |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    triton_counted = False
    for r in results:
        back = "not within the window" if r.recovery_s is None else f"{r.recovery_s:.2f}"
        refusals = "-" if not r.refused else f"{r.refusal_p50_ms:.0f} / {r.refusal_p99_ms:.0f}"
        proto = r.protocol + (", deadline + timeout parameter" if r.timeout_parameter else ", deadline only")
        by = r.refused_by
        mark = "" if r.finished_counted_by.startswith("bls_") else " *"
        triton_counted |= bool(mark)
        lines.append(f"| {r.target} | {proto} | {r.factor:g} | {r.capacity_images_per_s:.1f} | {r.normal_p50_ms:.0f} / "
                     f"{r.normal_p99_ms:.0f} | {r.clients} | {r.deadline_s:g} | {r.in_time_per_s:.1f} | "
                     f"{r.goodput_ratio:.2f} | {r.finished}{mark} | {r.finished_for_gone} ({r.gone_share:.0%}) | "
                     f"{r.refused} ({by.get('queue full', 0)} / "
                     f"{by.get('queue timeout', 0)} / {by.get('model', 0)}) | {refusals} "
                     f"| {r.deadlines_passed} | {r.errors} | {back} | {r.load_cores:.2f} |")
    lines += ["",
              'Finished by the server: a flow\'s own bls_requests_total{code=~"OK|GONE"} (the requests it answered '
              'with labels, its client there or gone).']
    if triton_counted:
        lines[-1] += (f" * Not a flow: {TRITON_SUCCESS_COUNTS}, so this figure and the client-gone share can be too "
                      "high.")
    stop = meta.get("stop")
    if stop:
        lines += ["",
                  f"The server's stop after the runs (drain, then SIGTERM): {stop['seconds']:.1f} s, tritonserver exit "
                  f"code {stop['exit_code']}, "
                  f"{'drained' if stop['drained'] else 'NOT drained (models still busy when the drain gave up)'}."]
    return "\n".join(lines) + "\n"
