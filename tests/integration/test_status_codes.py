"""What a failed request's client reads, row by row of docs/reliability.md's table, over HTTP
and gRPC against the real server: its own bad input is INVALID_ARGUMENT (400), a broken part
of the deployment INTERNAL (500), and only a temporary condition UNAVAILABLE (503), the one
code a client, proxy or mesh should retry. The broken parts and the missing one are models
of the session's repository (conftest.py `_status_models`).
"""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from PIL import Image
from tritonclient.utils import InferenceServerException

from bls_pipeline.contract import IMAGE, TOPK
from bls_pipeline.serve.client import tritonclient_module

pytestmark = pytest.mark.integration

PROTOCOLS = ("http", "grpc")
# (HTTP status, gRPC status) of each code.
BAD_INPUT = ("400", "StatusCode.INVALID_ARGUMENT")
BROKEN = ("500", "StatusCode.INTERNAL")
UNAVAILABLE = ("503", "StatusCode.UNAVAILABLE")


def _jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (40, 120, 200)).save(buf, "JPEG")
    return buf.getvalue()


def _failure(server, protocol: str, model: str, images: list[bytes],
             topk: int | None = None) -> InferenceServerException:
    """The error the server answers this request with (the test fails if it answers)."""
    tc = tritonclient_module(protocol)
    client = tc.InferenceServerClient(server.url(protocol))
    try:
        data = np.array(images, dtype=object).reshape(-1, 1)
        inputs = [tc.InferInput(IMAGE.name, list(data.shape), "BYTES")]
        inputs[0].set_data_from_numpy(data)
        if topk is not None:
            inputs.append(tc.InferInput(TOPK.name, [len(images), 1], "INT32"))
            inputs[1].set_data_from_numpy(np.full((len(images), 1), topk, np.int32))
        with pytest.raises(InferenceServerException) as caught:
            client.infer(model, inputs)
        return caught.value
    finally:
        client.close()


def _status(protocol: str, codes: tuple[str, str]) -> str:
    return codes[PROTOCOLS.index(protocol)]


def _rejected(server, reason: str, code: str) -> float:
    """bls_rejected_images_total summed over the series with this reason and code."""
    import urllib.request

    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    pattern = re.compile(r'^bls_rejected_images_total\{([^}]*)\} (\S+)$', re.M)
    return sum(float(v) for labels, v in pattern.findall(text)
               if f'reason="{reason}"' in labels and f'code="{code}"' in labels)


# ---- bad input: the client's own request, never worth sending again as it is ------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_undecodable_image_is_invalid_argument(server, protocol):
    error = _failure(server, protocol, "classify_bls", [_jpeg(), b"not an image at all"])
    assert error.status() == _status(protocol, BAD_INPUT)
    assert "IMAGE[1]" in error.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_bad_topk_is_invalid_argument(server, protocol):
    error = _failure(server, protocol, "classify_bls", [_jpeg()], topk=0)
    assert error.status() == _status(protocol, BAD_INPUT)
    assert "TOPK=0 is out of range" in error.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_too_many_regions_is_invalid_argument(server, protocol, repo_root):
    error = _failure(server, protocol, "read_text_one_region", [(repo_root / "samples" / "sign.png").read_bytes()])
    assert error.status() == _status(protocol, BAD_INPUT)
    assert (re.search(r"IMAGE\[0\]: text_detector found \d+ regions on it, over max_regions_per_image=1",
                      error.message()))


# ---- broken: a part of the deployment, failing the same way every time ------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_child_output_of_the_wrong_shape_is_internal_naming_it(server, protocol):
    before = _rejected(server, "broken_shape", "INTERNAL")
    error = _failure(server, protocol, "classify_bls_broken_shape", [_jpeg(), _jpeg()])
    assert error.status() == _status(protocol, BROKEN)
    assert "broken_shape returned output with shape (2, 10) for a batch of 2" in error.message()
    assert "declares dims [1000]" in error.message()
    _eventually(lambda: _rejected(server, "broken_shape", "INTERNAL") - before == 2)


def test_a_broken_childs_error_reaches_only_the_requests_that_called_it(server, sample_images):
    """Two requests in one execute() of the cascade: the cat photo escalates to broken_shape,
    which answers the wrong shape, the espresso stays with the cheap model. Only the cat's
    request fails (INTERNAL, naming broken_shape); the espresso's is answered."""
    from concurrent.futures import ThreadPoolExecutor
    import threading

    from bls_pipeline.serve.client import ClassifyClient

    model = "classify_bls_cascade_broken"
    start = threading.Barrier(2)

    def send(image: bytes):
        client = ClassifyClient(server.grpc_url, "grpc", model=model)
        try:
            start.wait()
            return client.classify([image], topk=1)["ROUTE"][0, 0].decode()
        except InferenceServerException as exc:
            return exc
        finally:
            client.close()

    for _ in range(5):  # until both land in one execute() (a watchdog probe may come between)
        before = _executions(server, model)
        with ThreadPoolExecutor(2) as pool:
            cat, espresso = pool.map(send, [sample_images["chelsea"], sample_images["coffee"]])
        if _executions(server, model) - before == 1:
            break
    else:
        pytest.fail("the two requests never shared an execute()")
    assert isinstance(cat, InferenceServerException) and cat.status() == _status("grpc", BROKEN)
    assert "broken_shape returned output with shape (1, 10) for a batch of 1" in cat.message()
    assert espresso == "efficientnet_lite0_onnx:confident"


def _executions(server, model: str) -> int:
    """execute() calls of `model` so far (the statistics API), once they have settled."""
    import time

    import tritonclient.http as tc

    client = tc.InferenceServerClient(server.http_url)
    try:
        counts = [-1]
        while True:
            counts.append(int(client.get_inference_statistics(model)["model_stats"][0]["execution_count"]))
            if counts[-1] == counts[-2]:
                return counts[-1]
            time.sleep(0.3)
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_child_output_of_the_wrong_dtype_is_internal_naming_it(server, protocol):
    error = _failure(server, protocol, "classify_bls_broken_dtype", [_jpeg()])
    assert error.status() == _status(protocol, BROKEN)
    assert "broken_dtype returned output as FP64; its config.pbtxt declares TYPE_FP32" in error.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_function_child_called_directly_refuses_its_own_broken_output(server, protocol):
    """No flow in between: the function model checks what its function returned against its
    config (a client calling it directly got a 200 with 10 scores instead of 1000)."""
    tc = tritonclient_module(protocol)
    client = tc.InferenceServerClient(server.url(protocol))
    try:
        pixels = tc.InferInput("input", [2, 3, 224, 224], "FP32")
        pixels.set_data_from_numpy(np.zeros((2, 3, 224, 224), np.float32))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("broken_shape", [pixels])
    finally:
        client.close()
    assert caught.value.status() == _status(protocol, BROKEN)
    assert ("broken_shape returned output with shape (2, 10) for a batch of 2; its config.pbtxt declares dims [1000], "
            "so expected (2, 1000) (function broken.py:wrong_shape)") in caught.value.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_flow_that_raises_is_internal_and_tells_no_secret(server, protocol):
    error = _failure(server, protocol, "raising_flow", [_jpeg(), _jpeg()])
    assert error.status() == _status(protocol, BROKEN)
    assert error.message().endswith("flow raising_flow raised KeyError (details in the server log)")
    assert "secret" not in error.message()


# ---- temporary: worth sending again later ------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_no_candidate_ready_is_unavailable_naming_the_role(server, protocol):
    before = _rejected(server, "classifiers", "UNAVAILABLE")
    error = _failure(server, protocol, "classify_bls_unready", [_jpeg()])
    assert error.status() == _status(protocol, UNAVAILABLE)
    assert ("no classifier is ready for classifiers (its candidates, in order: resnet50_trt not "
            "READY)" in error.message())
    _eventually(lambda: _rejected(server, "classifiers", "UNAVAILABLE") - before == 1)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_that_is_not_loaded_is_refused_by_triton_itself(server, protocol):
    """What a request finds once the drain has unloaded its model (or before it loaded):
    Triton's own refusal, not the runtime's (docs/reliability.md says so)."""
    error = _failure(server, protocol, "resnet50_trt", [_jpeg()])
    assert error.status() == {"http": "404", "grpc": "StatusCode.NOT_FOUND"}[protocol]
    assert "Request for unknown model" in error.message()


def _eventually(check, timeout_s: float = 5.0) -> None:
    """The metrics reach the endpoint within a second of the execute() (FlowMetrics's flusher)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the metric did not reach the endpoint"
        time.sleep(0.1)


# ---- who counts the failures: the flow, not Triton ---------------------------------------------

def _series(server, metric: str, model: str) -> dict[str, float]:
    """{labels other than model/instance/version: value summed over instances} of one metric."""
    import urllib.request

    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    out: dict[str, float] = {}
    for labels, value in re.findall(rf'^{metric}\{{([^}}]*)\}} (\S+)$', text, re.M):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if pairs.pop("model", None) != model:
            continue
        key = ",".join(f"{k}={v}" for k, v in sorted(pairs.items()) if k not in ("instance", "version"))
        out[key] = out.get(key, 0.0) + float(value)
    return out


def test_failures_are_counted_by_the_flow_by_code_and_every_image_of_them(server):
    """A request of three images with one bad, two broken-child requests and one with no
    classifier READY: the flow counts each request once by the code its client got, and every
    image of it; Triton's own counters call all four successes (docs/reliability.md)."""
    flow, unready = "classify_bls_broken_shape", "classify_bls_unready"
    metrics = ("bls_requests_total", "bls_rejected_requests_total", "bls_rejected_images_total",
               "nv_inference_request_success", "nv_inference_request_failure")
    before = {(m, f): _series(server, m, f) for m in metrics for f in (flow, unready)}
    assert _failure(server, "http", flow, [_jpeg(), b"not an image", _jpeg()]).status() == BAD_INPUT[0]
    for _ in range(2):
        assert _failure(server, "grpc", flow, [_jpeg()]).status() == BROKEN[1]
    assert _failure(server, "http", unready, [_jpeg(), _jpeg()]).status() == UNAVAILABLE[0]

    def delta(metric, model, key):
        return _series(server, metric, model).get(key, 0) - before[(metric, model)].get(key, 0)

    _eventually(lambda: delta("bls_requests_total", unready, "code=UNAVAILABLE") == 1
                and delta("bls_requests_total", flow, "code=INTERNAL") == 2)
    assert delta("bls_requests_total", flow, "code=INVALID_ARGUMENT") == 1
    assert delta("bls_requests_total", flow, "code=INTERNAL") == 2
    assert delta("bls_requests_total", flow, "code=OK") == 0
    assert delta("bls_rejected_requests_total", flow, "code=INVALID_ARGUMENT,reason=unsupported_format") == 1
    assert delta("bls_rejected_images_total", flow, "code=INVALID_ARGUMENT,reason=unsupported_format") == 3
    assert delta("bls_rejected_requests_total", flow, "code=INTERNAL,reason=broken_shape") == 2
    assert delta("bls_rejected_images_total", unready, "code=UNAVAILABLE,reason=classifiers") == 2
    # Triton 2.51: the python backend answers a failed request with an error response, which
    # Triton's statistics count as a success; its failure counter stays where it was.
    assert delta("nv_inference_request_success", flow, "") == 3
    assert delta("nv_inference_request_success", unready, "") == 1
    assert sum(delta("nv_inference_request_failure", m, k) for m in (flow, unready)
               for k in _series(server, "nv_inference_request_failure", m)) == 0
