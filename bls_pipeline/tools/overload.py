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
flow's own bls_requests_total{code="OK"}, not Triton's success count, which counts a flow's
refusals too; Triton's success count for models that are not flows) and the share of it
whose client had already gone, refusals and their latency, and the cores the load generator used. The
clients are asyncio tasks in this one thread (tritonclient's aio clients), so the load
generator stays light beside the server on a small machine.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
import urllib.request
from dataclasses import dataclass, field

import numpy as np

__all__ = ["OverloadResult", "Tally", "backoff_s", "markdown", "recovery_seconds", "run_target"]

ANSWERED = "bls_requests_total"  # with code="OK": requests the flow answered with labels


@dataclass
class Tally:
    """What clients saw in one phase: latencies of answers in time, refusals, deadlines passed."""

    answered_ms: list[float] = field(default_factory=list)  # received within the deadline
    answered_at: list[float] = field(default_factory=list)  # when each came back (perf_counter)
    refused_ms: list[float] = field(default_factory=list)  # 503 / UNAVAILABLE, how fast
    refused_by_queue: int = 0  # of those, by Triton's queue (full, or its timeout) before any stub saw them
    gone: int = 0  # the deadline passed before an answer: the client moved on
    errors: int = 0  # anything else (400, 500, a broken connection)
    error_samples: list[str] = field(default_factory=list)


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
    refused_by_queue: int  # of those, by Triton's queue before any stub saw them
    refusal_p50_ms: float
    refusal_p99_ms: float
    deadlines_passed: int
    errors: int
    recovery_s: float | None  # None: not back to normal within the recovery window
    load_cores: float  # CPU the load generator used during the spike, in cores
    timeout_parameter: bool
    error_samples: list[str] = field(default_factory=list)


def backoff_s(attempt: int, rng: random.Random, base: float = 0.05, cap: float = 1.0) -> float:
    """The wait after the attempt-th refusal in a row: full jitter over an exponential, capped."""
    return rng.uniform(0, min(cap, base * 2 ** max(0, attempt - 1)))


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


# What Triton's queue says when it refuses a request, before any model sees it.
_QUEUE_REFUSALS = ("Exceeds maximum queue size", "Request timeout expired")


# ---- the clients --------------------------------------------------------------------------
class _Client:
    """One protocol's aio client and how one request's outcome is read."""

    def __init__(self, protocol: str, url: str, connections: int):
        self.protocol = protocol
        if protocol == "grpc":
            import tritonclient.grpc.aio as aio
        else:
            import tritonclient.http.aio as aio
        self.module = aio
        self.client = aio.InferenceServerClient(url, conn_limit=connections + 8) if protocol == "http" else \
            aio.InferenceServerClient(url)

    def request(self, model: str, payload: bytes, output: str):
        tc = self.module
        inp = tc.InferInput("IMAGE", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[payload]], dtype=object))
        return model, [inp], [tc.InferRequestedOutput(output)]

    async def send(self, request, deadline_s: float | None, timeout_parameter: bool) -> str:
        """"ok", "gone" (the deadline passed), "refused" (503 / UNAVAILABLE; "refused by queue":
        by Triton's queue, full or timed out) or "error: ..."."""
        from tritonclient.utils import InferenceServerException

        model, inputs, outputs = request
        timeout_us = int(deadline_s * 1e6) if deadline_s and timeout_parameter else None
        try:
            if self.protocol == "grpc":
                await self.client.infer(model, inputs, outputs=outputs, client_timeout=deadline_s, timeout=timeout_us)
            elif deadline_s:
                await asyncio.wait_for(self.client.infer(model, inputs, outputs=outputs, timeout=timeout_us), deadline_s)
            else:
                await self.client.infer(model, inputs, outputs=outputs)
            return "ok"
        except asyncio.TimeoutError:
            return "gone"
        except InferenceServerException as exc:
            status = str(exc.status() or "")
            if "DEADLINE_EXCEEDED" in status:
                return "gone"
            if any(says in str(exc) for says in _QUEUE_REFUSALS):
                return "refused by queue"
            if "UNAVAILABLE" in status or status == "503":
                return "refused"
            return f"error: {status} {exc.message()[:160]}"
        except Exception as exc:  # noqa: BLE001 - a broken connection is counted, the client goes on
            return f"error: {type(exc).__name__} {str(exc)[:160]}"

    async def close(self) -> None:
        await self.client.close()


async def _clients(client: _Client, requests: list, n: int, deadline_s: float | None, timeout_parameter: bool,
                   record_from: float, stop_at: float, tally: Tally, seed: int) -> None:
    """n clients, each back to back: send, wait at most the deadline, send again (after a
    refusal, back off first). Outcomes are recorded from record_from on."""

    async def one(k: int) -> None:
        rng = random.Random(seed * 100_003 + k)
        refusals = 0
        i = k
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at:
                return
            outcome = await client.send(requests[i % len(requests)], deadline_s, timeout_parameter)
            i += 1
            done = time.perf_counter()
            recording = t0 >= record_from and done <= stop_at + (deadline_s or 0)
            if outcome == "ok":
                refusals = 0
                if recording:
                    tally.answered_ms.append((done - t0) * 1e3)
                    tally.answered_at.append(done)
            elif outcome.startswith("refused"):
                refusals += 1
                if recording:
                    tally.refused_ms.append((done - t0) * 1e3)
                    tally.refused_by_queue += outcome == "refused by queue"
                await asyncio.sleep(backoff_s(refusals, rng))
            elif outcome == "gone":
                if recording:
                    tally.gone += 1
            else:
                if recording:
                    tally.errors += 1
                    if len(tally.error_samples) < 3:
                        tally.error_samples.append(outcome)
                await asyncio.sleep(0.01)

    await asyncio.gather(*(one(k) for k in range(n)))


# ---- what the server finished ----------------------------------------------------------------
def _answered_images(metrics_url: str, model: str) -> float:
    """The requests the flow answered with labels so far (bls_requests_total{code="OK"}, summed
    over instances): one image each here."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    pattern = re.compile(rf'^{ANSWERED}{{(?=[^}}]*model="{re.escape(model)}")(?=[^}}]*code="OK")[^}}]*}} ([0-9.e+]+)$', re.M)
    return sum(float(v) for v in pattern.findall(text))


def _success_count(url: str, protocol: str, model: str) -> float:
    from ..serve.client import tritonclient_module

    tc = tritonclient_module(protocol)
    client = tc.InferenceServerClient(url)
    try:
        stats = (client.get_inference_statistics(model_name=model, as_json=True) if protocol == "grpc"
                 else client.get_inference_statistics(model_name=model))["model_stats"]
        return float(sum(int(s["inference_stats"].get("success", {}).get("count", 0)) for s in stats))
    finally:
        client.close()


def _finished(url: str, protocol: str, metrics_url: str | None, model: str, is_flow: bool) -> float:
    return _answered_images(metrics_url, model) if is_flow and metrics_url else _success_count(url, protocol, model)


# ---- one target ------------------------------------------------------------------------------
async def _phase(client: _Client, requests: list, n: int, deadline_s: float | None, timeout_parameter: bool,
                 warmup_s: float, duration_s: float, seed: int) -> tuple[Tally, float, float]:
    tally = Tally()
    start = time.perf_counter()
    record_from, stop_at = start + warmup_s, start + warmup_s + duration_s
    await _clients(client, requests, n, deadline_s, timeout_parameter, record_from, stop_at, tally, seed)
    return tally, record_from, stop_at


def run_target(url: str, protocol: str, target: str, model: str, payloads: list[bytes], *, output: str, is_flow: bool,
               metrics_url: str | None, deadline_s: float = 0.5, factor: float = 4.0, capacity_clients: int = 8,
               capacity_s: float = 10.0, spike_s: float = 30.0, recovery_s: float = 10.0, warmup_s: float = 3.0,
               timeout_parameter: bool = True, seed: int = 0) -> OverloadResult:
    """The three phases for one target over one protocol (the server already up)."""

    async def run() -> OverloadResult:
        client = _Client(protocol, url, max(capacity_clients, 4096))
        requests = [client.request(model, p, output) for p in payloads]
        try:
            normal, t0, t1 = await _phase(client, requests, capacity_clients, None, False, warmup_s, capacity_s, seed)
            capacity = len(normal.answered_ms) / (t1 - t0)
            lat = np.array(normal.answered_ms)
            p50, p99 = (float(np.percentile(lat, 50)), float(np.percentile(lat, 99))) if len(lat) else (math.nan, math.nan)
            clients = max(capacity_clients + 1, math.ceil(factor * capacity * deadline_s))
            finished_before = _finished(url, protocol, metrics_url, model, is_flow)
            cpu0 = time.process_time()
            spike, s0, s1 = await _phase(client, requests, clients, deadline_s, timeout_parameter, 0.0, spike_s, seed + 1)
            cpu = time.process_time() - cpu0
            finished = _finished(url, protocol, metrics_url, model, is_flow) - finished_before
            after, r0, _ = await _phase(client, requests, capacity_clients, None, False, 0.0, recovery_s, seed + 2)
        finally:
            await client.close()
        in_time = len(spike.answered_ms)
        refused = np.array(spike.refused_ms)
        back = recovery_seconds(np.array(after.answered_at), np.array(after.answered_ms), r0, p99)
        wasted = max(0, int(round(finished)) - in_time)
        return OverloadResult(
            target, protocol, capacity, p50, p99, clients, deadline_s, spike_s, in_time / (s1 - s0),
            in_time / (s1 - s0) / capacity if capacity else math.nan, int(round(finished)), wasted,
            wasted / finished if finished else 0.0, len(refused), spike.refused_by_queue,
            float(np.percentile(refused, 50)) if len(refused) else math.nan,
            float(np.percentile(refused, 99)) if len(refused) else math.nan,
            spike.gone, spike.errors, back, cpu / (s1 - s0), timeout_parameter, spike.error_samples + normal.error_samples)

    return asyncio.run(run())


def markdown(results: list[OverloadResult], meta: dict) -> str:
    lines = [f"Machine: {meta.get('machine')}. Versions: {meta.get('versions')}. One 500x375 JPEG per request; "
             f"capacity: {meta.get('capacity_clients')} closed-loop clients for {meta.get('capacity_s')} s; spike: "
             f"{meta.get('factor')}x overload (clients = {meta.get('factor')} x capacity x deadline) for "
             f"{meta.get('spike_s')} s; recovery watched for {meta.get('recovery_s')} s.", "",
             "| target | protocol, client | capacity img/s | normal p50 / p99 ms | clients | deadline s | in time /s | goodput / capacity "
             "| finished by the server | of those, client gone | refused (by Triton's queue) | refusal p50 / p99 ms | deadlines passed | errors "
             "| p99 normal again after s | load generator cores |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        back = "not within the window" if r.recovery_s is None else f"{r.recovery_s:.2f}"
        refusals = "-" if not r.refused else f"{r.refusal_p50_ms:.0f} / {r.refusal_p99_ms:.0f}"
        proto = r.protocol + (", deadline + timeout parameter" if r.timeout_parameter else ", deadline only")
        lines.append(f"| {r.target} | {proto} | {r.capacity_images_per_s:.1f} | {r.normal_p50_ms:.0f} / {r.normal_p99_ms:.0f} "
                     f"| {r.clients} | {r.deadline_s:g} | {r.in_time_per_s:.1f} | {r.goodput_ratio:.2f} | {r.finished} "
                     f"| {r.finished_for_gone} ({r.gone_share:.0%}) | {r.refused} ({r.refused_by_queue}) | {refusals} "
                     f"| {r.deadlines_passed} | {r.errors} | {back} | {r.load_cores:.2f} |")
    stop = meta.get("stop")
    if stop:
        lines += ["", f"The server's stop after the runs (drain, then SIGTERM): {stop['seconds']:.1f} s, tritonserver exit code "
                      f"{stop['exit_code']}, {'drained' if stop['drained'] else 'NOT drained (models still busy when the drain gave up)'}."]
    return "\n".join(lines) + "\n"
