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
from bls_pipeline.runtime.modelconfig import ModelConfig, config_variant
from bls_pipeline.serve.client import tritonclient_module

from polling import eventually

pytestmark = pytest.mark.integration

FLOW, CHEAP, MAIN, SHEDDING = "goodput_flow", "slow_cheap", "counted_main", "goodput_shedding"
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
    shutil.copytree(model_repo / "classify_bls", repo / FLOW)
    (repo / FLOW / "config.pbtxt").write_text(config_variant(model_repo / "classify_bls", FLOW, {
        "cascade_classifiers": CHEAP, "classifiers": MAIN, "run_in_process": "none", "tta_threshold": "0"}))
    # The same flow on one instance taking 4 requests at a time, shedding on a standing queue
    # past 100 ms: a dozen clients keep its queue standing (an execute() takes 0.4 s).
    shutil.copytree(model_repo / "classify_bls", repo / SHEDDING)
    config = text_format.Parse(config_variant(model_repo / "classify_bls", SHEDDING, {
        "cascade_classifiers": CHEAP, "classifiers": MAIN, "run_in_process": "none", "tta_threshold": "0",
        "queue_delay_target_ms": "100"}), ModelConfig())
    config.instance_group[0].count = 1
    config.max_batch_size = 4
    config.dynamic_batching.ClearField("preferred_batch_size")
    (repo / SHEDDING / "config.pbtxt").write_text(text_format.MessageToString(config))
    # A flow with a number among its request parameters (classify_bls has a bool only).
    shutil.copytree(model_repo / "classify_bls", repo / NUMBERS)
    (repo / NUMBERS / "1" / "flow.py").write_text(_NUMBERS_FLOW)
    config = text_format.Parse(config_variant(model_repo / "classify_bls", NUMBERS, {}), ModelConfig())
    config.ClearField("parameters")
    config.parameters["run_in_process"].string_value = "none"
    config.instance_group[0].count = 1
    (repo / NUMBERS / "config.pbtxt").write_text(text_format.MessageToString(config))
    server = server_factory(repo, tmp_path_factory.mktemp("goodput-logs"), models=(FLOW, SHEDDING, NUMBERS))
    yield server
    server.stop()


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
        return client.infer(model, [inp], outputs=[tc.InferRequestedOutput(ROUTE.name), tc.InferRequestedOutput(LABELS.name)],
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
    assert ("request parameter min_top1='0.9': send a number between 0 and 1, as a JSON number: 0.9, not the string '0.9'"
            in caught.value.message())


def test_curl_sends_a_parameter_as_kserve_json(goodput_server):
    import base64

    body = {"parameters": {"skip_cascade": True},
            "inputs": [{"name": "IMAGE", "shape": [1, 1], "datatype": "BYTES", "data": [base64.b64encode(_jpeg()).decode()]}],
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
    assert after.get("dropped:cancelled:slow_cheap:CANCELLED", 0) == before.get("dropped:cancelled:slow_cheap:CANCELLED", 0) + 1
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


def test_on_a_standing_queue_a_flow_refuses_at_once_what_it_cannot_start(goodput_server):
    """One instance taking 4 requests at a time, 0.4 s an execute(): 12 plain HTTP clients back
    to back (no deadline) keep its queue standing. Once Triton has measured waits over the
    100 ms target for 0.5 s, each full execute() answers what it can finish in 20 ms (one
    request: no less) and refuses the others at once: 503 stating the wait Triton measured,
    over the target, counted as shed."""
    from concurrent.futures import ThreadPoolExecutor

    stop_at = time.monotonic() + 6.0

    def client(_):
        seen = []
        while time.monotonic() < stop_at:
            start = time.monotonic()
            try:
                _infer(goodput_server, "http", _jpeg(), model=SHEDDING)
                seen.append(("answered", time.monotonic() - start, ""))
            except InferenceServerException as exc:
                seen.append((str(exc.status()), time.monotonic() - start, exc.message()))
        return seen

    _infer(goodput_server, "http", _jpeg(), model=SHEDDING)  # measured once: what an image costs it
    with ThreadPoolExecutor(12) as pool:
        outcomes = [o for seen in pool.map(client, range(12)) for o in seen]
    refused = [o for o in outcomes if o[0] == "503"]
    answered = [o for o in outcomes if o[0] == "answered"]
    assert refused and answered, outcomes
    assert len(refused) + len(answered) == len(outcomes), outcomes
    for _, _, message in refused:
        said = re.search(r"queue stands: requests waited (\d+) ms or more on average .* queue_delay_target_ms=100\b", message)
        assert said and int(said.group(1)) > 100, message  # a true figure: over the target it names
    # Counted: the flow's metrics reach the endpoint within a second or so (polled, not slept).
    shed = re.compile(rf'bls_dropped_images_total{{(?=[^}}]*model="{SHEDDING}")(?=[^}}]*why="shed")[^}}]*}} [1-9]')
    eventually(lambda: shed.search(urllib.request.urlopen(goodput_server.metrics_url, timeout=10).read().decode()),
               f"bls_dropped_images_total{{model={SHEDDING!r}, why='shed'}} above 0", timeout_s=10)


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
    assert any(i.startswith(f"{FLOW}_") and re.search(r"refused with UNAVAILABLE \(.*expired \d+", w) for i, w in said), said
