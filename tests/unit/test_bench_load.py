"""bls-bench's asyncio load (loadgen.py, openloop.py, overload.py), its pure parts: the Poisson
schedule and that it never waits for answers, how an outcome is read and tallied, the flows'
counts read from a metrics text, and the tables."""

import asyncio
import math
import statistics
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bls_pipeline.serve.options import free_port
from bls_pipeline.tools import openloop, overload
from bls_pipeline.tools.loadgen import (TRITON_SUCCESS_COUNTS, FinishedCounter, MetricsUnreadable, Tally, flow_answered,
                                        outcome_of)
from bls_pipeline.tools.openloop import LATE_MS, OpenLoopResult, poisson_schedule

# ---- the schedule ------------------------------------------------------------------------------


def test_the_poisson_schedule_has_the_rate_asked_and_exponential_gaps():
    times = poisson_schedule(200.0, 50.0, seed=3)  # about 10,000 arrivals
    assert times == sorted(times) and 0 < times[0] and times[-1] < 50.0
    assert abs(len(times) - 10_000) < 5 * math.sqrt(10_000)  # Poisson count: sd sqrt(n)
    gaps = [b - a for a, b in zip(times, times[1:])]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 200, rel=0.05)
    assert statistics.stdev(gaps) / mean == pytest.approx(1.0, abs=0.05)  # exponential: sd = mean (periodic: 0)


def test_the_schedule_is_the_same_for_a_seed_and_another_for_another():
    assert poisson_schedule(50.0, 2.0, seed=1) == poisson_schedule(50.0, 2.0, seed=1)
    assert poisson_schedule(50.0, 2.0, seed=1) != poisson_schedule(50.0, 2.0, seed=2)
    with pytest.raises(ValueError, match="above 0"):
        poisson_schedule(0.0, 2.0, seed=1)


class _HeldClient:
    """Answers nothing until every request of the schedule was sent: a load generator that
    waited for answers before sending would never get there."""

    def __init__(self, expected: int):
        self.expected, self.started, self.released = expected, 0, asyncio.Event()

    async def send(self, request, deadline_s, timeout_parameter):
        self.started += 1
        mine = self.started
        if self.started == self.expected:
            self.released.set()
        await self.released.wait()
        return ("ok", "refused: queue full", "gone")[mine % 3]


def test_the_open_loop_sends_on_schedule_without_waiting_for_answers():
    schedule = [0.01 * k for k in range(30)]
    client = _HeldClient(len(schedule))

    async def run():
        return await asyncio.wait_for(openloop._open_loop(client, ["r"], schedule, 2.0, False), timeout=20)

    tally, lags = asyncio.run(run())
    assert client.started == 30 and len(lags) == 30 and all(lag >= 0 for lag in lags)
    assert (len(tally.answered_ms), len(tally.refused_ms), tally.gone) == (10, 10, 10)
    assert tally.refused_by == {"queue full": 10}


# ---- outcomes --------------------------------------------------------------------------------


@pytest.mark.parametrize("status, message, outcome", [
    ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded", "gone"),
    ("StatusCode.UNAVAILABLE", "[request id: <id_unknown>] Exceeds maximum queue size", "refused: queue full"),
    ("503", "Exceeds maximum queue size", "refused: queue full"),
    ("StatusCode.UNAVAILABLE", "Request timeout expired", "refused: queue timeout"),
    # a flow that passes a child's refusal on: the flow refused, not Triton's queue in front of it
    ("StatusCode.UNAVAILABLE", "classify resnet50_onnx failed: [request id: <id_unknown>] Exceeds maximum queue size",
     "refused: model"),
    ("503", "overloaded: waited 640 ms, target 500 ms", "refused: model"),
    ("400", "image 0: not an image", "error: 400 image 0: not an image"),
    ("StatusCode.INTERNAL", "boom", "error: StatusCode.INTERNAL boom"),
])
def test_a_failed_request_reads_as_gone_refused_by_whom_or_an_error(status, message, outcome):
    assert outcome_of(status, message) == outcome


def test_a_tally_counts_each_outcome_and_who_refused():
    tally = Tally()
    for outcome in ("ok", "ok", "refused: queue full", "refused: queue timeout", "refused: model", "gone",
                    "error: 400 x"):
        tally.record(outcome, 1.0, 1.25)
    assert tally.answered_ms == [250.0, 250.0] and tally.answered_at == [1.25, 1.25]
    assert len(tally.refused_ms) == 3 and tally.refused_by_queue == 2 and tally.refused_by["model"] == 1
    assert (tally.gone, tally.errors, tally.error_samples) == (1, 1, ["error: 400 x"])


# ---- what the server finished ------------------------------------------------------------------
METRICS = """# HELP bls_requests_total Users' requests the flow model finished
# TYPE bls_requests_total counter
bls_requests_total{code="OK",model="classify_bls",instance="classify_bls_0_0"} 40
bls_requests_total{model="classify_bls",instance="classify_bls_0_1",code="OK"} 2
bls_requests_total{code="UNAVAILABLE",model="classify_bls",instance="classify_bls_0_0"} 300
bls_requests_total{code="GONE",model="classify_bls",instance="classify_bls_0_1"} 5
bls_requests_total{code="OK",model="classify_bls_default",instance="classify_bls_default_0_0"} 7
nv_inference_request_success{model="classify_bls",version="1"} 342
"""


def test_a_flows_answers_are_its_ok_and_gone_series_summed_over_instances():
    # Answered for a client still there (OK) or one gone meanwhile (GONE): not its refusals, not Triton's 342.
    assert flow_answered(METRICS, "classify_bls") == 47
    assert flow_answered(METRICS, "classify_bls_default") == 7
    assert flow_answered(METRICS, "ensemble_resnet50") is None  # not a flow


class _Metrics(BaseHTTPRequestHandler):
    texts: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        body = (self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_endpoint():
    """A metrics endpoint answering the texts in _Metrics.texts in turn (the last one for good)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def test_a_flow_is_counted_from_the_metrics_and_a_model_that_is_not_from_tritons_success(metrics_endpoint):
    _Metrics.texts = [METRICS]
    flow = FinishedCounter.for_model("classify_bls", metrics_endpoint, "127.0.0.1:1", "grpc")
    assert flow.by_flow and flow.read() == 47 and flow.source == 'bls_requests_total{code=~"OK|GONE"}'
    other = FinishedCounter.for_model("ensemble_resnet50", metrics_endpoint, "127.0.0.1:1", "grpc")
    assert not other.by_flow and other.source == "Triton's success count"


def test_no_quiet_fall_back_when_the_flows_counts_cannot_be_read(metrics_endpoint):
    nowhere = f"http://127.0.0.1:{free_port()}/metrics"
    with pytest.raises(MetricsUnreadable, match=rf"cannot read the server's metrics at {nowhere}.*--metrics-port"):
        FinishedCounter.for_model("classify_bls", nowhere, "127.0.0.1:1", "grpc")
    # another server's, no flows
    _Metrics.texts = ['nv_inference_request_success{model="classify_bls",version="1"} 342\n']
    with pytest.raises(MetricsUnreadable, match="has no bls_requests_total.*classify_bls"):
        FinishedCounter.for_model("classify_bls", metrics_endpoint, "127.0.0.1:1", "grpc", is_flow=True)
    with pytest.raises(MetricsUnreadable, match="is a flow"):
        FinishedCounter.for_model("classify_bls", None, "127.0.0.1:1", "grpc", is_flow=True)


def test_a_settled_read_waits_for_the_flows_flushed_counts(metrics_endpoint):
    """The flows' counters reach the endpoint a flush later: the read waits until the count
    holds and covers what the clients were answered."""
    _Metrics.texts = [METRICS.replace(" 40\n", f" {n}\n") for n in (10, 20, 30, 40)]
    counter = FinishedCounter.for_model("classify_bls", metrics_endpoint, "127.0.0.1:1", "grpc")
    assert counter.read_settled(at_least=47, quiet_s=0.3) == 47


# ---- the tables --------------------------------------------------------------------------------
def _open_result(**changes) -> OpenLoopResult:
    fields = dict(target="classify_bls", protocol="grpc", timeout_parameter=False, capacity_per_s=100.0,
                  capacity_measured=True,
                  load=0.8, rate_per_s=80.0, duration_s=10.0, deadline_s=2.0, sent=800, sent_per_s=80.0, answered=790,
                  answer_p50_ms=20.0, answer_p99_ms=180.0, refused=8,
                  refused_by={"queue full": 6, "queue timeout": 0, "model": 2}, refusal_p99_ms=3.0, deadlines_passed=2,
                  errors=0, finished=792, finished_for_gone=2, finished_counted_by='bls_requests_total{code="OK"}',
                  late_sends=0, lag_p99_ms=1.0, load_cores=0.05)
    return OpenLoopResult(**{**fields, **changes})


def test_the_open_loop_table_has_a_row_per_load_and_says_who_refused():
    table = openloop.markdown([_open_result(), _open_result(load=0.95, rate_per_s=95.0, late_sends=20)],
                              {"image_set": "12 JPEGs", "served": "max_queue_size 16", "capacity": "measured"})
    rows = [ln for ln in table.splitlines() if ln.startswith("| classify_bls |")]
    assert len(rows) == 2
    assert "| 0.8x | 80.0 (100.0) | 800 | 790 | 8 (1.0%) | 6 / 0 / 2 | 2 | 0 | 20 / 180 | 3 |" in rows[0]
    assert "FELL BEHIND" not in rows[0] and "20 (p99 1 ms) FELL BEHIND" in rows[1]  # 20 of 800 late: over 1%
    assert "12 JPEGs" in table and "max_queue_size 16" in table and f"{LATE_MS:g} ms behind" in table
    assert TRITON_SUCCESS_COUNTS not in table
    counted_by_triton = openloop.markdown([_open_result(target="ensemble_resnet50",
                                                        finished_counted_by="Triton's success count")], {})
    assert "| 792 * (2) |" in counted_by_triton and TRITON_SUCCESS_COUNTS in counted_by_triton


def test_the_overload_table_has_a_row_per_factor():
    base = dict(target="classify_bls", protocol="http", capacity_images_per_s=100.0, normal_p50_ms=30.0,
                normal_p99_ms=90.0,
                deadline_s=0.5, spike_s=30.0, finished_for_gone=10, gone_share=0.01, refused=50, refused_by_queue=40,
                refusal_p50_ms=2.0, refusal_p99_ms=60.0, deadlines_passed=10, errors=0, recovery_s=1.5, load_cores=0.2,
                timeout_parameter=False, refused_by={"queue full": 40, "model": 10},
                finished_counted_by='bls_requests_total{code="OK"}')
    results = [overload.OverloadResult(**base, clients=200, in_time_per_s=85.0, goodput_ratio=0.85, finished=2560,
                                       factor=4.0),
               overload.OverloadResult(**base, clients=400, in_time_per_s=70.0, goodput_ratio=0.70, finished=2110,
                                       factor=8.0)]
    table = overload.markdown(results, {"image_set": "12 JPEGs"})
    assert ("| classify_bls | http, deadline only | 4 | 100.0 |" in table
            and "| classify_bls | http, deadline only | 8 | 100.0 |" in table)
    assert "| 50 (40 / 0 / 10) |" in table and "4x, 8x overload" in table and TRITON_SUCCESS_COUNTS not in table
