"""What a request carries reaches the flow, on the real server: its parameters (over HTTP and
gRPC, a bad value and an unknown name refused), its `timeout` (an expired one answered with
the documented code), its gRPC cancellation (no child ever sees a cancelled request); and the
server stops cleanly after all that.

The server here serves `goodput_flow`: classify_bls on two python children, `slow_cheap` (its
cascade classifier: 0.4 s a call, unsure of everything) and `counted_main` (its main
classifier), whose counts show what reached them. A 24 MP PNG takes about 0.3 s to decode:
a request carrying one is still decoding when its client's deadline passes.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from PIL import Image
from tritonclient.utils import InferenceServerException

from bls_pipeline.contract import IMAGE, LABELS, ROUTE
from bls_pipeline.base.modelconfig import ModelConfig, config_variant
from bls_pipeline.serve.client import tritonclient_module

from polling import eventually

pytestmark = pytest.mark.integration

FLOW, CHEAP, MAIN, QUEUED = "goodput_flow", "slow_cheap", "counted_main", "goodput_queued"
SLOW_LAST, DEGRADING = "goodput_slow_last", "goodput_degrading"
NUMBERS = "number_parameter_flow"
_NUMBERS_FLOW = '''"""number_parameter_flow (tests only): a Probability request parameter, served."""
from bls_pipeline.flow import Answer, Batch, Candidates, Parameters, Probability, Settings


class NumberSettings(Settings):
    classifiers: Candidates = "counted_main"


class NumberParameters(Parameters):
    min_top1: Probability = 0.0  # the main classifier's top-1 under this: answered "below"


def flow(batch: Batch, settings: NumberSettings) -> Answer:
    answer = batch.answer()
    main = batch.classify(settings.classifiers)
    answer.set(main, "kept")
    answer.skip(main.top1 < batch.params.min_top1, "below")
    return answer
'''
_CHILDREN = '''"""goodput_flow's children (tests only): a slow unsure cheap classifier, a counted main one."""
import time

import numpy as np


def slow(inputs):
    time.sleep(0.4)
    return {"output": np.zeros((len(inputs["input"]), 1000), np.float32)}  # unsure of every image


def counted(inputs):
    out = np.zeros((len(inputs["input"]), 1000), np.float32)
    out[:, 967] = 20.0
    return {"output": out}
'''


@pytest.fixture(scope="module")
def goodput_server(model_repo, tmp_path_factory, server_factory, child_factory):
    repo = tmp_path_factory.mktemp("goodput") / "models"
    repo.mkdir()
    for name, fn in ((CHEAP, "slow"), (MAIN, "counted")):
        child_factory(repo, model_repo, name, _CHILDREN, fn)
    # No latency aim: its cheap child alone takes 0.4 s, so classify_bls's 400 ms would skip every
    # escalation (DEGRADING shows that).
    _flow_variant(repo, model_repo, FLOW, {"cascade_classifiers": CHEAP, "classifiers": MAIN, "latency_target_ms": "0"})
    # The same flow on one instance taking 4 requests at a time (an execute() takes 0.4 s), its
    # queue holding 16: a dozen clients back to back keep requests waiting there.
    _flow_variant(repo, model_repo, QUEUED,
                  {"cascade_classifiers": CHEAP, "classifiers": MAIN, "latency_target_ms": "0"},
                  instances=1, max_batch_size=4, queue=16)
    # The slow child last: a client whose deadline passes during that call is answered after it left.
    _flow_variant(repo, model_repo, SLOW_LAST, {"cascade_classifiers": "none", "classifiers": CHEAP})
    # An aim of 300 ms, which the cheap child's 0.4 s passes: every escalation is skipped, degraded.
    _flow_variant(repo, model_repo, DEGRADING,
                  {"cascade_classifiers": CHEAP, "classifiers": MAIN, "latency_target_ms": "300"})
    # A flow with a number among its request parameters (classify_bls has a bool only).
    shutil.copytree(model_repo / "classify_bls", repo / NUMBERS)
    (repo / NUMBERS / "1" / "flow.py").write_text(_NUMBERS_FLOW)
    config = text_format.Parse(config_variant(model_repo / "classify_bls", NUMBERS, {}), ModelConfig())
    config.ClearField("parameters")
    config.parameters["run_in_process"].string_value = "none"
    config.instance_group[0].count = 1
    (repo / NUMBERS / "config.pbtxt").write_text(text_format.MessageToString(config))
    server = server_factory(repo, tmp_path_factory.mktemp("goodput-logs"),
                            models=(FLOW, QUEUED, SLOW_LAST, DEGRADING, NUMBERS))
    yield server
    server.stop()


def _flow_variant(repo: Path, model_repo: Path, name: str, params: dict[str, str], instances: int | None = None,
                  max_batch_size: int | None = None, queue: int | None = None) -> None:
    """classify_bls's folder under another name, on goodput's children, with these settings."""
    shutil.copytree(model_repo / "classify_bls", repo / name)
    config = text_format.Parse(config_variant(model_repo / "classify_bls", name, {
        "run_in_process": "none", "tta_threshold": "0", **params}), ModelConfig())
    if instances is not None:
        config.instance_group[0].count = instances
    if max_batch_size is not None:
        config.max_batch_size = max_batch_size
        config.dynamic_batching.ClearField("preferred_batch_size")
    if queue is not None:
        config.dynamic_batching.default_queue_policy.max_queue_size = queue
    (repo / name / "config.pbtxt").write_text(text_format.MessageToString(config))


def _png_24mp() -> bytes:
    ramp = np.linspace(0, 255, 6000, dtype=np.float32)
    buf = io.BytesIO()
    Image.fromarray(np.stack([np.tile(ramp, (4000, 1))] * 3, -1).astype(np.uint8)).save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def _jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 40, 40)).save(buf, "JPEG")
    return buf.getvalue()


def _infer(server, protocol: str, image: bytes, model: str = FLOW, **kwargs):
    tc = tritonclient_module(protocol)
    client = tc.InferenceServerClient(server.url(protocol))
    try:
        inp = tc.InferInput(IMAGE.name, [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[image]], dtype=object))
        return client.infer(model, [inp],
                            outputs=[tc.InferRequestedOutput(ROUTE.name), tc.InferRequestedOutput(LABELS.name)],
                            **kwargs)
    finally:
        client.close()


def _counts(server) -> dict[str, float]:
    """What reached each child (Triton's inference counts, the flow's bls_child_images_total)
    and what the flow dropped (bls_dropped_images_total), summed over label sets."""
    tc = tritonclient_module("http")
    client = tc.InferenceServerClient(server.url("http"))
    try:
        out = {f"triton:{m}": float(client.get_inference_statistics(model_name=m)["model_stats"][0]["inference_count"])
               for m in (CHEAP, MAIN)}
    finally:
        client.close()
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    for line in text.splitlines():
        m = re.match(r'^(bls_child_images_total|bls_dropped_images_total)\{([^}]*)\} ([0-9.e+]+)$', line)
        if m and f'model="{FLOW}"' in m.group(2):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            key = f"child:{labels['child']}" if m.group(1) == "bls_child_images_total" else \
                f"dropped:{labels['why']}:{labels['stage']}:{labels['code']}"
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def _settled(server, before: dict, keys: tuple[str, ...], timeout_s: float = 10.0) -> dict:
    """The counts once the flow finished with what it had (metrics flush within 0.25 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = _counts(server)
        if all(now.get(k, 0) > before.get(k, 0) for k in keys) or time.monotonic() > deadline:
            time.sleep(0.6)  # anything still to come would have come by now
            return _counts(server)
        time.sleep(0.1)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_parameter_reaches_the_flow(goodput_server, protocol):
    answered = _infer(goodput_server, protocol, _jpeg(), parameters={"skip_cascade": True})
    assert answered.as_numpy(ROUTE.name)[0, 0] == f"{MAIN}:direct".encode()
    for sent, says in (({"skip_cascade": "maybe"}, "request parameter skip_cascade='maybe': send true or false"),
                       ({"skipcascade": True}, "unknown request parameter 'skipcascade'")):
        with pytest.raises(InferenceServerException) as caught:
            _infer(goodput_server, protocol, _jpeg(), parameters=sent)
        assert str(caught.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT")
        assert says in caught.value.message()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_number_parameter_is_a_number_and_a_numeric_string_is_refused_naming_it(goodput_server, protocol):
    """A float reaches the flow as Triton's double parameter; "0.9" is a string (docs/extending.md:
    a value of the wrong type fails with 400), and the message says what to send."""
    assert _infer(goodput_server, protocol, _jpeg(), NUMBERS, parameters={"min_top1": 0.5}).as_numpy(ROUTE.name)[0, 0] \
        == f"{MAIN}:kept".encode()
    assert _infer(goodput_server, protocol, _jpeg(), NUMBERS, parameters={"min_top1": 1}).as_numpy(ROUTE.name)[0, 0] \
        == b"below"  # an integer is a number too (top-1 is 0.99999...)
    with pytest.raises(InferenceServerException) as caught:
        _infer(goodput_server, protocol, _jpeg(), NUMBERS, parameters={"min_top1": "0.9"})
    assert str(caught.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT")
    assert ("request parameter min_top1='0.9': send a number between 0 and 1, as a JSON number: 0.9, not the string "
            "'0.9'"
            in caught.value.message())


def test_curl_sends_a_parameter_as_kserve_json(goodput_server):
    import base64

    body = {"parameters": {"skip_cascade": True},
            "inputs": [{"name": "IMAGE", "shape": [1, 1], "datatype": "BYTES",
                        "data": [base64.b64encode(_jpeg()).decode()]}],
            "outputs": [{"name": "ROUTE"}]}
    request = urllib.request.Request(f"http://{goodput_server.url('http')}/v2/models/{FLOW}/infer",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    answer = json.loads(urllib.request.urlopen(request, timeout=30).read())
    assert answer["outputs"][0]["data"] == [f"{MAIN}:direct"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_expired_timeout_is_answered_unavailable_and_nothing_after_it_runs(goodput_server, protocol):
    before = _counts(goodput_server)
    with pytest.raises(InferenceServerException) as caught:
        _infer(goodput_server, protocol, _png_24mp(), timeout=100_000)  # 0.1 s: it passes while the image decodes
    assert str(caught.value.status()) in ("503", "StatusCode.UNAVAILABLE")
    assert "deadline (the timeout parameter, 100 ms) passed before" in caught.value.message()
    after = _settled(goodput_server, before, ("dropped:expired:slow_cheap:UNAVAILABLE",))
    assert after[f"triton:{CHEAP}"] == before[f"triton:{CHEAP}"] and after[f"triton:{MAIN}"] == before[f"triton:{MAIN}"]
    assert after.get(f"child:{CHEAP}", 0) == before.get(f"child:{CHEAP}", 0)


def test_a_cancelled_grpc_request_never_reaches_a_child(goodput_server):
    """Its gRPC deadline passes while its image decodes: the client cancels, the flow drops it
    before its first child call. Neither child's counts move, Triton's or the flow's."""
    before = _counts(goodput_server)
    with pytest.raises(InferenceServerException) as caught:
        _infer(goodput_server, "grpc", _png_24mp(), client_timeout=0.1)
    assert "DEADLINE_EXCEEDED" in str(caught.value.status())
    after = _settled(goodput_server, before, ("dropped:cancelled:slow_cheap:CANCELLED",))
    assert (after.get("dropped:cancelled:slow_cheap:CANCELLED", 0)
            == before.get("dropped:cancelled:slow_cheap:CANCELLED", 0) + 1)
    for key in (f"triton:{CHEAP}", f"triton:{MAIN}", f"child:{CHEAP}", f"child:{MAIN}"):
        assert after.get(key, 0) == before.get(key, 0), key


def test_a_request_cancelled_between_two_calls_never_reaches_the_second(goodput_server):
    """Its gRPC deadline passes during the cheap model's 0.4 s: the main model never sees it."""
    before = _counts(goodput_server)
    with pytest.raises(InferenceServerException):
        _infer(goodput_server, "grpc", _jpeg(), client_timeout=0.2)
    after = _settled(goodput_server, before, ("dropped:cancelled:counted_main:CANCELLED",))
    assert after[f"triton:{CHEAP}"] == before[f"triton:{CHEAP}"] + 1  # it got as far as the first
    assert after[f"triton:{MAIN}"] == before[f"triton:{MAIN}"]
    assert after.get(f"child:{MAIN}", 0) == before.get(f"child:{MAIN}", 0)


def test_clients_without_a_deadline_are_never_refused_however_long_they_wait(goodput_server):
    """One instance taking 4 requests at a time, 0.4 s an execute(): 12 plain HTTP clients back
    to back (no deadline) wait in its queue for up to a second each. A client that waits for its
    answer cannot overload anything: every request is answered, none refused."""
    from concurrent.futures import ThreadPoolExecutor

    stop_at = time.monotonic() + 6.0

    def client(_):
        seen = []
        while time.monotonic() < stop_at:
            start = time.monotonic()
            try:
                _infer(goodput_server, "http", _jpeg(), model=QUEUED)
                seen.append(("answered", time.monotonic() - start, ""))
            except InferenceServerException as exc:
                seen.append((str(exc.status()), time.monotonic() - start, exc.message()))
        return seen

    with ThreadPoolExecutor(12) as pool:
        outcomes = [o for seen in pool.map(client, range(12)) for o in seen]
    waits = sorted(t for o, t, _ in outcomes if o == "answered")
    print(f"12 clients back to back: {len(outcomes)} requests, answered in {waits[len(waits) // 2]:.2f} s at the "
          "median")
    assert outcomes and all(o == "answered" for o, _, _ in outcomes), [o for o in outcomes if o[0] != "answered"][:3]
    assert waits[len(waits) // 2] > 0.5  # they did wait in the queue: the test had a queue to refuse from


def _requests_counted(server, model: str, code: str) -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    found = re.findall(rf'^bls_requests_total{{(?=[^}}]*model="{model}")(?=[^}}]*code="{code}")[^}}]*}} ([0-9.e+]+)$',
                       text, re.M)
    return sum(float(v) for v in found)


def test_an_answer_finished_after_its_client_left_is_counted_gone_not_ok(goodput_server):
    """The gRPC deadline (0.2 s) passes during the flow's last call (0.4 s): the answer is made
    for nobody, and bls_requests_total counts it as GONE, not OK."""
    ok, gone = _requests_counted(goodput_server, SLOW_LAST, "OK"), _requests_counted(goodput_server, SLOW_LAST, "GONE")
    with pytest.raises(InferenceServerException) as caught:
        _infer(goodput_server, "grpc", _jpeg(), model=SLOW_LAST, client_timeout=0.2)
    assert "DEADLINE_EXCEEDED" in str(caught.value.status())
    eventually(lambda: _requests_counted(goodput_server, SLOW_LAST, "GONE") == gone + 1, "one more GONE", timeout_s=10)
    assert _requests_counted(goodput_server, SLOW_LAST, "OK") == ok
    _infer(goodput_server, "grpc", _jpeg(), model=SLOW_LAST, client_timeout=10)  # a patient client: OK
    eventually(lambda: _requests_counted(goodput_server, SLOW_LAST, "OK") == ok + 1, "one more OK", timeout_s=10)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_escalation_past_the_latency_target_is_answered_degraded_saying_why(goodput_server, protocol):
    """Every image is unsure, and the cheap child's 0.4 s passes the 300 ms aim: the main model is
    skipped, the cheap answer stands (ROUTE <cheap>:degraded), the JSON answer says why, and
    bls_degraded_images_total counts it. Nothing is refused."""
    tc = tritonclient_module(protocol)
    client = tc.InferenceServerClient(goodput_server.url(protocol))
    try:
        inp = tc.InferInput(IMAGE.name, [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[_jpeg()]], dtype=object))
        got = client.infer(DEGRADING, [inp],
                           outputs=[tc.InferRequestedOutput(ROUTE.name), tc.InferRequestedOutput("JSON")])
    finally:
        client.close()
    assert got.as_numpy(ROUTE.name)[0, 0] == f"{CHEAP}:degraded".encode()
    why = json.loads(got.as_numpy("JSON")[0, 0])["degraded"]
    assert why.startswith("overloaded: this request's latency_target_ms=300 had passed before counted_main (by "), why
    degraded = re.compile(rf'bls_degraded_images_total{{(?=[^}}]*model="{DEGRADING}")(?=[^}}]*stage="{MAIN}")'
                          rf'(?=[^}}]*why="late")[^}}]*}} [1-9]')
    eventually(lambda: degraded.search(urllib.request.urlopen(goodput_server.metrics_url, timeout=10).read().decode()),
               f"bls_degraded_images_total{{model={DEGRADING!r}, stage={MAIN!r}, why='late'}} above 0", timeout_s=10)


def test_the_server_stops_cleanly_after_cancellations(goodput_server):
    """Cancelled and expired requests over both protocols, then the stop: drained, exit 0."""
    for _ in range(3):
        with pytest.raises(InferenceServerException):
            _infer(goodput_server, "grpc", _jpeg(), client_timeout=0.1)
        with pytest.raises(InferenceServerException):
            _infer(goodput_server, "http", _png_24mp(), timeout=50_000)
    start = time.monotonic()
    code = goodput_server.stop()
    took = time.monotonic() - start
    print(f"stop after cancellations: {took:.1f} s, exit {code}")
    # Drained; tritonserver exited 0, or was killed after the drain for a model Triton 2.51
    # kept from unloading with nothing in flight (docs/reliability.md, "Stopping bls-serve").
    report = goodput_server.last_stop
    assert report.drained and (code == 0 or (report.held and code == -9)), report
    # Each instance's line of what it refused and what its clients cancelled: one a minute while
    # they happen, the rest of the minute at the stop (this module takes less than one).
    log = Path(goodput_server.options.log_file).read_text(errors="replace")
    said = re.findall(r"(\w+_0_\d): in the last \d+ s, of \d+ requests, (.*)\"", log)
    print("\n".join(f"{instance}: {what}" for instance, what in said))
    assert (any(i.startswith(f"{FLOW}_") and re.search(r"refused with UNAVAILABLE \(.*expired \d+", w)
                for i, w in said)), said
