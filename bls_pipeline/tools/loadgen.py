"""bls-bench's asyncio load: one protocol's aio client, how a request's outcome is read, a
closed loop of clients, what they saw (Tally), and what the server says it finished.

The clients are asyncio tasks in one thread (tritonclient's aio clients), so the load
generator stays light beside the server on a small machine. The overload mode
(overload.py) and the open-loop mode (openloop.py) share them.

What the server finished comes from the flow's own count of requests it answered with labels
(`bls_requests_total{code=~"OK|GONE"}` on Triton's metrics port), read the same way whether bls-bench
started the server or was given one. For a model that is not a flow the only count is
Triton's success count, and that one counts more than answers (TRITON_SUCCESS_COUNTS).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..base.messages import QUEUE_FULL, QUEUE_TIMEOUT, REQUEST_ID
from ..base.statistics import summed

__all__ = ["AioClient", "FinishedCounter", "MetricsUnreadable", "REFUSERS", "TRITON_SUCCESS_COUNTS", "Tally",
           "backoff_s",
           "closed_loop", "flow_answered", "model_statistics", "outcome_of", "outcome_of_exception", "percentile_ms",
           "read_metrics"]

ANSWERED = "bls_requests_total"  # with code="OK" or "GONE": requests the flow answered with labels
FINISHED_CODES = ("OK", "GONE")  # GONE: answered after its client had gone (adapter/metrics.py)

# Who refused a request (503 / UNAVAILABLE): Triton's queue before any model saw it, full
# ("Exceeds maximum queue size") or after the request waited out its timeout there ("Request
# timeout expired"), or the model itself (a flow's own refusal, or a child's it passed on).
REFUSERS = ("queue full", "queue timeout", "model")
# Triton's own words, the whole message (core's scheduler prefixes a request id): a flow that
# passes a child's refusal on quotes them inside its own message, and is the model refusing.
_TRITON_QUEUE = {QUEUE_FULL: "queue full", QUEUE_TIMEOUT: "queue timeout"}

# Said wherever a figure comes from Triton's success count (python_backend r24.10 reports every
# request of an execute() with one success flag, true unless execute() itself raised).
TRITON_SUCCESS_COUNTS = ("Triton's success count (nv_inference_request_success) counts every request a python model "
                         "answered, refusals and errors it answered included, as a success")


def outcome_of(status: str, message: str) -> str:
    """How a failed request reads: "gone" (its deadline passed), "refused: WHO" (503 /
    UNAVAILABLE, WHO one of REFUSERS) or "error: ..." (anything else: 400, 500, a broken
    connection). `status` is tritonclient's: "StatusCode.X" over gRPC, the HTTP code over HTTP."""
    if "DEADLINE_EXCEEDED" in status:
        return "gone"
    queue = _TRITON_QUEUE.get(REQUEST_ID.sub("", message.strip()))
    if queue is not None:
        return f"refused: {queue}"
    if "UNAVAILABLE" in status or status == "503":
        return "refused: model"
    return f"error: {status} {message[:160]}".strip()


def outcome_of_exception(exc: BaseException) -> str:
    """outcome_of for a failed tritonclient call's exception (another exception: an error)."""
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, InferenceServerException):
        return outcome_of(str(exc.status() or ""), exc.message() or "")
    return f"error: {type(exc).__name__} {str(exc)[:160]}"


@dataclass
class Tally:
    """What clients saw: latencies of answers in time, refusals and by whom, deadlines passed."""

    answered_ms: list[float] = field(default_factory=list)  # received within the deadline
    answered_at: list[float] = field(default_factory=list)  # when each came back (perf_counter)
    refused_ms: list[float] = field(default_factory=list)  # 503 / UNAVAILABLE, how fast
    refused_by: Counter = field(default_factory=Counter)  # REFUSERS -> count
    gone: int = 0  # the deadline passed before an answer: the client moved on
    errors: int = 0  # anything else (400, 500, a broken connection)
    error_samples: list[str] = field(default_factory=list)

    @property
    def refused_by_queue(self) -> int:
        """Refusals by Triton's queue (full, or its timeout), before any model saw them."""
        return self.refused_by["queue full"] + self.refused_by["queue timeout"]

    def record(self, outcome: str, t0: float, done: float) -> None:
        """One request's outcome (outcome_of's words, or "ok"), sent at t0, back at done."""
        if outcome == "ok":
            self.answered_ms.append((done - t0) * 1e3)
            self.answered_at.append(done)
        elif outcome.startswith("refused: "):
            self.refused_ms.append((done - t0) * 1e3)
            self.refused_by[outcome.removeprefix("refused: ")] += 1
        elif outcome == "gone":
            self.gone += 1
        else:
            self.errors += 1
            if len(self.error_samples) < 3:
                self.error_samples.append(outcome)


def percentile_ms(values: list[float], q: float) -> float:
    """The q-th percentile of `values` (NaN for none)."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


def backoff_s(attempt: int, rng: random.Random, base: float = 0.05, cap: float = 1.0) -> float:
    """The wait after the attempt-th refusal in a row: full jitter over an exponential, capped."""
    return rng.uniform(0, min(cap, base * 2 ** max(0, attempt - 1)))


# ---- the client ------------------------------------------------------------------------------
class AioClient:
    """One protocol's aio client: requests built once, each sent with an optional deadline."""

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
        """"ok", or outcome_of's words. Over gRPC the deadline is the call's deadline (the client
        cancels at it); over HTTP the client stops waiting at it. With timeout_parameter, also
        Triton's `timeout` request parameter (the deadline in microseconds)."""
        model, inputs, outputs = request
        timeout_us = int(deadline_s * 1e6) if deadline_s and timeout_parameter else None
        try:
            if self.protocol == "grpc":
                await self.client.infer(model, inputs, outputs=outputs, client_timeout=deadline_s, timeout=timeout_us)
            elif deadline_s:
                await asyncio.wait_for(self.client.infer(model, inputs, outputs=outputs, timeout=timeout_us),
                                       deadline_s)
            else:
                await self.client.infer(model, inputs, outputs=outputs)
            return "ok"
        except asyncio.TimeoutError:
            return "gone"
        except Exception as exc:  # noqa: BLE001 - every failure is an outcome, the client goes on
            return outcome_of_exception(exc)

    async def close(self) -> None:
        await self.client.close()


async def closed_loop(client: AioClient, requests: list, n: int, deadline_s: float | None, timeout_parameter: bool,
                      warmup_s: float, duration_s: float, seed: int) -> tuple[Tally, float, float]:
    """n clients, each back to back: send, wait at most the deadline, send again (after a
    refusal, back off first). Outcomes of requests sent after the warm-up are recorded; the
    Tally and the recorded window (start, end: perf_counter)."""
    tally = Tally()
    start = time.perf_counter()
    record_from, stop_at = start + warmup_s, start + warmup_s + duration_s

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
            if t0 >= record_from and done <= stop_at + (deadline_s or 0):
                tally.record(outcome, t0, done)
            if outcome.startswith("refused"):
                refusals += 1
                await asyncio.sleep(backoff_s(refusals, rng))
                continue
            refusals = 0
            if outcome.startswith("error"):
                await asyncio.sleep(0.01)

    await asyncio.gather(*(one(k) for k in range(n)))
    return tally, record_from, stop_at


# ---- what the server finished -----------------------------------------------------------------
class MetricsUnreadable(RuntimeError):
    """The metrics endpoint the flows' counts come from did not answer."""


def read_metrics(metrics_url: str) -> str:
    try:
        with urllib.request.urlopen(metrics_url, timeout=10) as response:
            return response.read().decode()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise MetricsUnreadable(
            f"cannot read the server's metrics at {metrics_url} ({exc}): bls-bench counts what a flow answered from "
            f"its {ANSWERED}{{code=\"OK\"}} there; give the running server's metrics port (--metrics-port PORT, or "
            "--metrics-url URL)") from exc


def flow_answered(metrics_text: str, model: str) -> float | None:
    """The requests `model` answered with labels so far, for a client still there or one gone
    meanwhile (bls_requests_total{code="OK"} and {code="GONE"}, summed over its series); None
    when the text has no OK series (the model is not a flow)."""
    values = {}
    for code in FINISHED_CODES:
        pattern = re.compile(rf'^{ANSWERED}{{(?=[^}}]*model="{re.escape(model)}")(?=[^}}]*code="{code}")[^}}]*}} '
                             r'([0-9.e+]+)$', re.M)
        values[code] = pattern.findall(metrics_text)
    if not values["OK"]:
        return None
    return sum(float(v) for found in values.values() for v in found)


def model_statistics(client, protocol: str, model: str) -> dict:
    """Triton's statistics of `model` (a tritonclient of `protocol`), as the JSON dict: the gRPC
    client returns them as JSON only when asked, the HTTP one takes no such argument."""
    if protocol == "grpc":
        return client.get_inference_statistics(model_name=model, as_json=True)
    return client.get_inference_statistics(model_name=model)


def _triton_success(url: str, protocol: str, model: str) -> float:
    from ..serve.client import tritonclient_module

    tc = tritonclient_module(protocol)
    client = tc.InferenceServerClient(url)
    try:
        return float(sum(summed(model_statistics(client, protocol, model), "success").values()))
    finally:
        client.close()


@dataclass(frozen=True)
class FinishedCounter:
    """How many requests a model finished so far, and from which count: the flow's own
    (`by_flow`: bls_requests_total{code=~"OK|GONE"} on metrics_url) or Triton's success count."""

    model: str
    by_flow: bool
    metrics_url: str | None
    url: str
    protocol: str

    @classmethod
    def for_model(cls, model: str, metrics_url: str | None, url: str, protocol: str,
                  is_flow: bool | None = None) -> "FinishedCounter":
        """A flow's own count when `is_flow`; None: a flow when the metrics have its series.
        A flow needs metrics_url, and its series there (MetricsUnreadable otherwise): no quiet
        fall back to Triton's success count, which counts refusals."""
        if is_flow is False:
            return cls(model, False, None, url, protocol)
        if metrics_url is None:
            raise MetricsUnreadable(f"{model} is a flow: bls-bench reads what it answered from the server's metrics "
                                    "(--metrics-port PORT or --metrics-url URL)")
        present = flow_answered(read_metrics(metrics_url), model) is not None
        if is_flow and not present:
            raise MetricsUnreadable(f"{metrics_url} has no {ANSWERED}{{model=\"{model}\",code=\"OK\"}}: is it the "
                                    f"metrics port of the server that serves {model} (--metrics-port PORT, "
                                    "--metrics-url URL)?")
        return cls(model, present, metrics_url if present else None, url, protocol)

    @property
    def source(self) -> str:
        return f'{ANSWERED}{{code=~"OK|GONE"}}' if self.by_flow else "Triton's success count"

    def read_settled(self, at_least: float = 0.0, quiet_s: float = 0.6, timeout_s: float = 10.0) -> float:
        """read() once the count holds still for quiet_s and is at least `at_least`, with no
        request in flight: a flow's counters reach the endpoint from a flusher thread in each
        instance (every 0.25 s, adapter/metrics.py), so a read just after the last answer can
        miss it. After timeout_s, the last read."""
        value, since = self.read(), time.monotonic()
        give_up = since + timeout_s
        while time.monotonic() < give_up:
            time.sleep(0.1)
            again = self.read()
            if again != value:
                value, since = again, time.monotonic()
            elif time.monotonic() - since >= quiet_s and value >= at_least:
                break
        return value

    def read(self) -> float:
        if self.by_flow:
            count = flow_answered(read_metrics(self.metrics_url), self.model)
            if count is None:
                raise MetricsUnreadable(f"{self.metrics_url} no longer has {ANSWERED} for {self.model}")
            return count
        return _triton_success(self.url, self.protocol, self.model)
