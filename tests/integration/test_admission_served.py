"""Admission as users get it: classify_bls with its shipped settings (batches of 8, a queue of
32, overload "degrade" with latency_target_ms 400; resnet50 served, so unsure images are
escalated), on a real server started by bls-serve's launcher (which hands the flows Triton's
measured queue waits).

- Clients that wait for their answers are never refused: a closed loop of 16, heavy images
  among them, on a busy machine.
- Arrivals below capacity (Poisson, at 0.8x of a capacity measured first) are never refused.
- Past the cascade's capacity the unsure images are answered by the cheap model, saying so,
  rather than refused or answered late.
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import threading
import time
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from bls_pipeline.contract import IMAGE, JSON, LABELS, ROUTE
from bls_pipeline.serve.client import tritonclient_module

pytestmark = pytest.mark.integration

MODEL = "classify_bls"


@pytest.fixture(scope="module")
def shipped(model_repo, tmp_path_factory, server_factory):
    server = server_factory(model_repo, tmp_path_factory.mktemp("admission-logs"), models=(MODEL,))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def main_job(model_repo, tmp_path_factory, server_factory):
    """classify_bls as the main job serves it here: no resnet50 (its weights cannot be had), so
    the unsure images are answered by efficientnet alone (ROUTE ...:degraded)."""
    server = server_factory(model_repo, tmp_path_factory.mktemp("admission-main-logs"), models=(MODEL,),
                            exclude={"resnet50_onnx": "as the main job serves classify_bls without resnet50's weights"})
    yield server
    server.stop()


def _burn(seconds: float) -> subprocess.Popen:
    """A CPU-bound process beside the server: a busy machine."""
    return subprocess.Popen([sys.executable, "-c",
                             f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"])


def _heavy_jpeg() -> bytes:
    """A 12-megapixel photo-sized JPEG (4000x3000), as a phone takes them."""
    rng = np.random.default_rng(0)
    pixels = (rng.random((300, 400, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).resize((4000, 3000), Image.BILINEAR).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.mark.timing
def test_a_closed_loop_of_16_with_heavy_images_on_a_busy_machine_is_never_refused(shipped, sample_images):
    """A batch job as a data scientist writes it: a thread pool of plain tritonclient calls, no
    deadline, the sample photos and a 12-megapixel JPEG, two CPU-bound processes beside the
    server. A client that waits for its answer cannot overload a server: nothing is refused."""
    tc = tritonclient_module("http")
    images = [*sample_images.values(), _heavy_jpeg()]
    outcomes: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + 15.0

    def client(k: int) -> None:
        conn = tc.InferenceServerClient(shipped.url("http"), network_timeout=120)
        try:
            i = k
            while time.monotonic() < stop_at:
                inp = tc.InferInput(IMAGE.name, [1, 1], "BYTES")
                inp.set_data_from_numpy(np.array([[images[i % len(images)]]], dtype=object))
                i += 1
                try:
                    conn.infer(MODEL, [inp], outputs=[tc.InferRequestedOutput(LABELS.name)])
                    outcome = "ok"
                except Exception as exc:  # noqa: BLE001 - every outcome is counted, and shown if not ok
                    outcome = f"{type(exc).__name__}: {exc}"
                with lock:
                    outcomes.append(outcome)
        finally:
            conn.close()

    burners = [_burn(16.0) for _ in range(2)]
    try:
        threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for b in burners:
            b.kill()
            b.wait()
    failed = [o for o in outcomes if o != "ok"]
    print(f"closed loop of 16 with heavy images beside two busy processes: {len(outcomes)} requests, {len(failed)} "
          "failed")
    assert outcomes and not failed, failed[:5]


@pytest.mark.timing
def test_poisson_arrivals_at_eight_tenths_of_capacity_are_never_refused(main_job, sample_images):
    """classify_bls as the main job serves it: its capacity measured with 8 closed-loop clients,
    then 20 s of Poisson arrivals at 0.8x of it, each request with a 2 s gRPC deadline. Bursts
    of a Poisson process queue up for a moment; the queue holds them, and none is refused."""
    from bls_pipeline.tools import openloop

    (result,) = openloop.run_target(main_job.url("grpc"), "grpc", MODEL, MODEL, list(sample_images.values()),
                                    output=LABELS.name, loads=(0.8,), is_flow=True, metrics_url=main_job.metrics_url,
                                    deadline_s=2.0, duration_s=20.0, warmup_s=3.0, capacity_s=8.0)
    print(f"Poisson arrivals at 0.8x of {result.capacity_per_s:.0f} requests/s: {result.sent} sent, {result.answered} "
          f"answered in time (p50 {result.answer_p50_ms:.0f} ms, p99 {result.answer_p99_ms:.0f} ms), "
          f"{result.refused} refused, "
          f"{result.deadlines_passed} past their deadline; sent late: {result.late_sends}")
    assert result.sent > 0 and result.errors == 0, result.error_samples
    assert result.refused == 0, result.refused_by


async def _spike(url: str, image: bytes, clients: int, seconds: float, deadline_s: float) -> list[tuple[str, str, str]]:
    """`clients` gRPC clients back to back, each call with its own deadline only (no timeout
    parameter): (outcome, ROUTE, the JSON answer's "degraded") per request."""
    import tritonclient.grpc.aio as aio
    from tritonclient.utils import InferenceServerException

    client = aio.InferenceServerClient(url)
    results: list[tuple[str, str, str]] = []
    stop_at = time.monotonic() + seconds

    async def one() -> None:
        while time.monotonic() < stop_at:
            inp = aio.InferInput(IMAGE.name, [1, 1], "BYTES")
            inp.set_data_from_numpy(np.array([[image]], dtype=object))
            try:
                got = await client.infer(MODEL, [inp], outputs=[aio.InferRequestedOutput(ROUTE.name),
                                                                aio.InferRequestedOutput(JSON.name)],
                                         client_timeout=deadline_s)
                answer = json.loads(got.as_numpy(JSON.name)[0, 0])
                results.append(("ok", got.as_numpy(ROUTE.name)[0, 0].decode(), answer.get("degraded", "")))
            except InferenceServerException as exc:
                results.append((str(exc.status()), "", exc.message() or ""))

    try:
        await asyncio.gather(*(one() for _ in range(clients)))
    finally:
        await client.close()
    return results


def test_past_the_cascades_capacity_unsure_images_are_answered_by_the_cheap_model_saying_so(shipped, sample_images):
    """Every client sends the cat photo, which the cheap model is unsure of: each image would
    go on to resnet50 (random weights on this CPU: some 16 images a second). 12 clients back
    to back, each with its own 1 s gRPC deadline, ask many times what resnet50 serves: the
    flow answers the rest with the cheap model's result, ROUTE <cheap>:degraded and the reason
    in the JSON answer, and refuses nothing."""
    results = asyncio.run(_spike(shipped.url("grpc"), sample_images["chelsea"], 12, 8.0, 1.0))
    outcomes = Counter(outcome for outcome, _, _ in results)
    routes = Counter(route for outcome, route, _ in results if outcome == "ok")
    print(f"12 clients on the cat photo for 8 s: {dict(outcomes)}; routes {dict(routes)}")
    degraded = [(route, why) for outcome, route, why in results if outcome == "ok" and route.endswith(":degraded")]
    assert degraded, routes
    assert all(route.startswith("efficientnet_lite0_") and why.startswith("overloaded: ") for route, why in degraded), \
        degraded[:3]
    assert any(route == "resnet50_onnx:escalated" for route in routes), routes  # it kept resnet50 busy meanwhile
    assert outcomes["StatusCode.UNAVAILABLE"] == 0, [r for r in results if r[0] == "StatusCode.UNAVAILABLE"][:3]
    assert set(outcomes) <= {"ok", "StatusCode.DEADLINE_EXCEEDED"}, outcomes
