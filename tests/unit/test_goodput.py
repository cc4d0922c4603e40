"""What a request carries reaches the flow (its parameters, its deadline, whether its client
went), and no work is done for a client that has gone: LocalFlow runs of the shipped
classify_bls and of flows written here, and the door's arithmetic (runtime/admission.py)."""

from __future__ import annotations

import io
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bls_pipeline.adapter.queue_waits import QueueWaitReader, QueueWaitWriter
from bls_pipeline.flow import LocalFlow, Probability, RequestFailed
from bls_pipeline.runtime.admission import Admission, Costs, QueueReading
from bls_pipeline.runtime.results import Timings
from bls_pipeline.serve.queue_monitor import QueueWindows, queue_totals
from bls_pipeline.runtime.calls import ChildRequest
from bls_pipeline.runtime.parameters import ParameterError, Parameters
from bls_pipeline.runtime.results import CANCELLED, UNAVAILABLE, ImageRequest, Prediction, RequestError

MODELS = Path(__file__).resolve().parents[2] / "models"
CASCADE = {"cascade_classifiers": "efficientnet_lite0_onnx", "classifiers": "resnet50_onnx", "run_in_process": "none",
           "tta_threshold": "0"}


def photo(colour=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), colour).save(buf, "JPEG")
    return buf.getvalue()


def classifier(klass: int, sure: float = 20.0, sleep_s: float = 0.0, log: list | None = None, name: str = ""):
    """A fake classifier: every row is class `klass` (logit `sure`), after `sleep_s`."""

    def fn(batch: np.ndarray) -> np.ndarray:
        if log is not None:
            log.append((name, len(batch)))
        time.sleep(sleep_s)
        out = np.zeros((len(batch), 1000), np.float32)
        out[:, klass] = sure
        return out

    return fn


def cascade(cheap_sure: float = 20.0, cheap_sleep: float = 0.0, log: list | None = None, **extra) -> LocalFlow:
    models = {"efficientnet_lite0_onnx": classifier(504, cheap_sure, cheap_sleep, log, "cheap"),
              "resnet50_onnx": classifier(967, log=log, name="main")}
    return LocalFlow(MODELS / "classify_bls", models, parameters={**CASCADE, **extra})


# ---- parameters ---------------------------------------------------------------------------------
def test_a_client_can_send_its_images_straight_to_the_main_classifier():
    log: list = []
    with cascade(log=log) as flow:
        (plain, skipped), _ = flow.run([ImageRequest([photo()]), ImageRequest([photo(), photo()], parameters={"skip_cascade": True})])
    assert plain.routes[:, 0].tolist() == [b"efficientnet_lite0_onnx:confident"]
    assert skipped.routes[:, 0].tolist() == [b"resnet50_onnx:direct"] * 2
    assert log == [("cheap", 1), ("main", 2)]  # only the plain request's image met the cheap model
    with cascade() as flow:  # as a string too (tools that send every parameter as one)
        assert flow.classify([photo()], parameters={"skip_cascade": "true"}).routes[0, 0] == b"resnet50_onnx:direct"


def test_with_the_main_classifier_gone_a_skipped_request_is_answered_degraded_and_says_so():
    models = {"efficientnet_lite0_onnx": classifier(504)}
    with LocalFlow(MODELS / "classify_bls", models, parameters=CASCADE, ready={"efficientnet_lite0_onnx"}) as flow:
        got = flow.classify([photo()], parameters={"skip_cascade": True})
    assert got.routes[0, 0] == b"efficientnet_lite0_onnx:degraded"


@pytest.mark.parametrize(("sent", "says"), [
    ({"skip_cascade": "maybe"}, "request parameter skip_cascade='maybe': send true or false"),
    ({"skip_cascade": 1}, "request parameter skip_cascade=1: send true or false"),
    ({"skipcascade": True}, "unknown request parameter 'skipcascade': classify_bls accepts skip_cascade (bool, default False)"),
])
def test_a_bad_or_unknown_parameter_fails_that_request_alone(sent, says):
    with cascade() as flow:
        (bad, good), _ = flow.run([ImageRequest([photo()], parameters=sent), ImageRequest([photo()])])
    assert isinstance(bad, RequestError) and bad.code == "INVALID_ARGUMENT" and bad.reason == "bad_parameter"
    assert says in bad.message
    assert isinstance(good, Prediction)


class Numbers(Parameters):
    threshold: Probability = 0.5
    ratio: float = 1.0
    count: int = 3


@pytest.mark.parametrize(("sent", "says"), [
    ({"threshold": "0.9"}, "request parameter threshold='0.9': send a number between 0 and 1, as a JSON number: 0.9, "
                           "not the string '0.9'"),
    ({"ratio": "2.5"}, "request parameter ratio='2.5': send a finite number, as a JSON number: 2.5, not the string '2.5'"),
    ({"count": "4"}, "request parameter count='4': send a whole number, as a JSON number: 4, not the string '4'"),
    ({"count": "0.5"}, "request parameter count='0.5': send a whole number"),
    ({"count": 2.0}, "request parameter count=2.0: send a whole number"),
    ({"ratio": "nan"}, "request parameter ratio='nan': send a finite number"),
    ({"threshold": True}, "request parameter threshold=True: send a number between 0 and 1"),
    ({"threshold": 1.5}, "request parameter threshold=1.5: send a number between 0 and 1"),
])
def test_a_number_sent_as_a_string_or_of_the_wrong_kind_is_refused_naming_it(sent, says):
    """docs/extending.md: a value of the wrong type fails with 400. "0.9" is a string, not a number."""
    with pytest.raises(ParameterError) as caught:
        Numbers.read(sent, "f")
    assert str(caught.value) == says


def test_a_bool_is_true_or_false_or_their_strings_not_a_number():
    class Flag(Parameters):
        on: bool = False

    assert [Flag.read({"on": v}, "f")["on"] for v in (True, False, "true", "False")] == [True, False, True, False]
    for sent in (1, 0, "1", "yes"):
        with pytest.raises(ParameterError, match="send true or false"):
            Flag.read({"on": sent}, "f")


def test_tritons_own_parameters_and_the_probe_pass_by():
    with cascade() as flow:
        assert flow.classify([photo()], parameters={"timeout": 5, "priority": 1, "bls_probe": True}).routes.shape == (1, 1)


def test_parameters_are_declared_typed_and_read_per_row(tmp_path):
    class P(Parameters):
        threshold: float = 0.5
        label: str = "x"

    assert P.read({"threshold": 0.25}, "f") == {"threshold": 0.25, "label": "x"}
    assert P.read({"threshold": 1}, "f") == {"threshold": 1.0, "label": "x"}  # a JSON integer is a number too
    with pytest.raises(ValueError, match="send a finite number"):
        P.read({"threshold": float("nan")}, "f")
    with pytest.raises(TypeError, match="Triton's own"):
        type("Bad", (Parameters,), {"__annotations__": {"timeout": int}, "timeout": 1})
    with pytest.raises(TypeError, match="needs a default"):
        type("Bad", (Parameters,), {"__annotations__": {"n": int}})


FLOW_CONFIG = """\
name: "rows"
backend: "python"
max_batch_size: 64
input [ { name: "IMAGE", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "LABELS", data_type: TYPE_STRING, dims: [ -1 ] }, { name: "ROUTE", data_type: TYPE_STRING, dims: [ 1 ] } ]
"""
ROW_FLOW = '''
import numpy as np
from bls_pipeline.flow import Answer, Batch, Candidates, Parameters, Probability, Settings

SEEN = []

class S(Settings):
    main: Candidates = "resnet50_onnx"

class Wanted(Parameters):
    strict: Probability = 0.5
    tag: str = ""

def flow(batch: Batch, settings: S) -> Answer:
    SEEN.append((batch.params.strict.tolist(), batch.params.tag.tolist(), batch.request_id.tolist(),
                 np.isfinite(batch.time_left()).tolist()))
    answer = batch.answer()
    return answer.set(batch.classify(settings.main), "main")
'''


def test_a_flow_reads_parameters_ids_and_time_left_per_row(tmp_path):
    repo = tmp_path / "models"
    (repo / "rows" / "1").mkdir(parents=True)
    (repo / "rows" / "config.pbtxt").write_text(FLOW_CONFIG)
    (repo / "rows" / "1" / "flow.py").write_text(ROW_FLOW)
    import shutil

    shutil.copytree(MODELS / "resnet50_onnx", repo / "resnet50_onnx", symlinks=False,
                    ignore=shutil.ignore_patterns("*.onnx*", "__pycache__"))
    with LocalFlow(repo / "rows", {"resnet50_onnx": classifier(1)}, check=False) as flow:
        flow.run([ImageRequest([photo(), photo()], id="a", parameters={"strict": 0.9}, timeout_s=30),
                  ImageRequest([photo()], id="b", parameters={"tag": "t"})])
        seen = flow.runtime.flow.fn.__globals__["SEEN"]
    assert seen[-1] == ([0.9, 0.9, 0.5], ["", "", "t"], ["a", "a", "b"], [True, True, False])


# ---- deadlines and cancellation -------------------------------------------------------------------
def test_a_request_whose_deadline_passes_is_dropped_before_the_next_call():
    log: list = []
    # The cheap model takes 0.15 s and is unsure: both images would go on to the main model.
    with cascade(cheap_sure=0.0, cheap_sleep=0.15, log=log) as flow:
        (late, patient), timings = flow.run([ImageRequest([photo()], timeout_s=0.1), ImageRequest([photo()])])
    assert isinstance(late, RequestError) and late.code == UNAVAILABLE and late.reason == "expired"
    assert "deadline" in late.message and "before resnet50_onnx" in late.message
    assert isinstance(patient, Prediction) and patient.routes[0, 0] == b"resnet50_onnx:escalated"
    assert log == [("cheap", 2), ("main", 1)]  # the late one never reached the main model
    assert timings.dropped == {("expired", "resnet50_onnx", UNAVAILABLE): 1}


def test_a_cancelled_request_does_no_work_and_one_cancelled_midway_stops_there():
    log: list = []
    state = {"gone": False}

    def cheap(batch):  # the client of the second request goes while the cheap model runs
        state["gone"] = True
        return classifier(504, 0.0, sleep_s=0.01, log=log, name="cheap")(batch)

    models = {"efficientnet_lite0_onnx": cheap, "resnet50_onnx": classifier(967, log=log, name="main")}
    with LocalFlow(MODELS / "classify_bls", models, parameters=CASCADE) as flow:
        requests = [ImageRequest([photo()], cancelled=lambda: True), ImageRequest([photo()], cancelled=lambda: state["gone"]),
                    ImageRequest([photo()])]
        gone_before, gone_midway, answered = flow.run(requests)[0]
    assert gone_before.code == gone_midway.code == CANCELLED and gone_before.reason == "cancelled"
    assert isinstance(answered, Prediction)
    assert log == [("cheap", 2), ("main", 1)]


def test_a_request_that_cannot_finish_in_time_is_refused_before_the_call_that_would_overrun():
    with cascade(cheap_sure=0.0, cheap_sleep=0.05) as flow:
        flow.run([ImageRequest([photo()])])  # measured once: the main model's time per image
        flow.runtime.admission.costs.observe("resnet50_onnx", 10.0, 1)  # ... now about 2 s an image (a moving average)
        (short, none), _ = flow.run([ImageRequest([photo()], timeout_s=0.5), ImageRequest([photo()])])
    assert isinstance(short, RequestError) and short.reason == "no_time" and short.code == UNAVAILABLE
    assert "ms left of its deadline" in short.message and "resnet50_onnx takes about" in short.message
    assert isinstance(none, Prediction)


def test_child_calls_carry_the_time_their_requests_have_left():
    sent: list[ChildRequest] = []
    with cascade(cheap_sure=0.0) as flow:
        send = flow._send

        def recording(requests):
            sent.extend(requests)
            return send(requests)

        flow.runtime.run([ImageRequest([photo()], timeout_s=20), ImageRequest([photo()], timeout_s=30)], recording)
        flow.runtime.run([ImageRequest([photo()], timeout_s=20), ImageRequest([photo()])], recording)
    assert 29 < sent[0].timeout_s <= 30 and 29 < sent[1].timeout_s <= 30  # the most time left among them
    assert sent[2].timeout_s is None  # a request without a deadline: the call has none


def test_local_flow_takes_a_deadline():
    with cascade(cheap_sure=0.0, cheap_sleep=0.1) as flow:
        with pytest.raises(RequestFailed, match="deadline"):
            flow.classify([photo()], timeout_s=0.05)
        assert flow.classify([photo()], timeout_s=10).routes[0, 0] == b"resnet50_onnx:escalated"


# ---- the door: Triton's measured queue, costs, shedding ---------------------------------------------
def reading(now, wait_s, standing_s=None, requests=20, age=0.05):
    return QueueReading(at=now - age, wait_s=wait_s, standing_s=wait_s if standing_s is None else standing_s,
                        requests=requests, interval_s=0.5)


def test_queue_windows_turn_triton_statistics_into_measured_waits():
    windows = QueueWindows(interval_s=0.5)
    assert windows.add("m", 10.0, count=100, wait_ns=0) is None  # the first reading: nothing to difference
    got = windows.add("m", 10.1, count=110, wait_ns=int(3e9))  # 10 requests left the queue, 3 s of waits
    assert got.wait_s == pytest.approx(0.3) and got.requests == 10
    assert got.standing_s == 0.0  # watched for 0.1 s only: no interval yet, nothing stands
    assert windows.add("m", 10.2, count=110, wait_ns=int(3e9)).wait_s == pytest.approx(0.3)  # none left: no news
    for i in range(5):
        got = windows.add("m", 10.3 + 0.1 * i, count=120 + 10 * i, wait_ns=int(3e9 + (i + 1) * 4e9))  # 0.4 s each
    assert got.wait_s == pytest.approx(0.4) and got.standing_s == pytest.approx(0.4)  # the 0.3 s window is past
    got = windows.add("m", 10.8, count=170, wait_ns=int(23e9 + 0.5e9))  # one window of short waits (0.05 s)
    assert got.wait_s == pytest.approx(0.05) and got.standing_s == pytest.approx(0.05)  # no longer standing
    assert windows.add("m", 10.9, count=5, wait_ns=0) is None  # counts went back: loaded anew, start over
    assert queue_totals({"model_stats": [
        {"name": "m", "version": "1", "inference_stats": {"queue": {"count": 3, "ns": 30}}},
        {"name": "m", "version": "2", "inference_stats": {"queue": {"count": 1, "ns": 5}}},
        {"name": "n", "version": "1", "inference_stats": {}}]}) == {"m": (4, 35), "n": (0, 0)}


def test_queue_readings_reach_the_instances_through_shared_memory(tmp_path):
    clock = FakeClock()
    reader = QueueWaitReader("classify_bls", server_pid=7, folder=tmp_path, clock=clock)
    assert reader.read() is None  # bls-serve wrote nothing (or runs nowhere): unmeasured
    writer = QueueWaitWriter(server_pid=7, folder=tmp_path)
    writer.write("classify_bls", reading(50.0, 0.25, 0.2, requests=12))
    assert reader.read() is None  # a reader looks for a missing file again only after a second
    clock.now += 1.0
    got = reader.read()
    assert (got.wait_s, got.standing_s, got.requests, got.interval_s) == (0.25, 0.2, 12, 0.5)
    writer.write("classify_bls", reading(51.0, 0.5))
    assert reader.read().wait_s == 0.5  # mapped: every write is seen at once
    assert QueueWaitReader("other", server_pid=7, folder=tmp_path, clock=clock).read() is None  # one per model
    writer.close()
    assert not list(tmp_path.iterdir())  # bls-serve removes what it made


def test_a_stale_or_empty_reading_is_no_measurement():
    assert reading(100.0, 0.3).fresh(100.0)
    assert not reading(100.0, 0.3, age=2.0).fresh(100.0)  # bls-serve stopped writing
    assert not reading(100.0, 0.3, requests=0).fresh(100.0)


def test_costs_predict_from_what_was_measured():
    costs = Costs()
    assert costs.predict("m", 10) == 0.0
    costs.observe("m", 0.5, 5)
    assert costs.predict("m", 10) == pytest.approx(1.0)
    costs.observe("m", 1.0, 5)  # 0.2 s an image now: the average moves a fifth of the way
    assert costs.per_image("m") == pytest.approx(0.12)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_on_a_standing_queue_it_keeps_what_finishes_within_the_target_until_the_queue_drains():
    clock = FakeClock()
    measured = {"now": None}
    door = Admission(batch_cap=16, target_s=0.2, clock=clock, queue=lambda: measured["now"])
    door.costs.observe("execute", 0.1, 10)  # 10 ms an image
    requests = [ImageRequest([photo()]) for _ in range(16)]

    def execute(n):
        req_clock, got = door.open(requests[:n])
        results = [None] * n
        timings = Timings()
        door.admit(req_clock, results, timings, got)
        door.close(0)
        return results, timings

    assert execute(16)[0] == [None] * 16  # nobody measured the queue: nothing refused on it
    measured["now"] = reading(clock.now, 0.15)
    assert execute(16)[0] == [None] * 16 and not door.shedding  # waited 0.15 s: under the target
    measured["now"] = reading(clock.now, 0.6, standing_s=0.1)
    assert execute(16)[0] == [None] * 16  # one window of long waits, not the whole interval: no standing queue
    measured["now"] = reading(clock.now, 0.5)
    assert execute(8)[0] == [None] * 8  # long waits, but the execute() came short of full: the queue drained
    results, timings = execute(16)  # full, and every window of the interval over the target: shedding
    assert door.shedding
    assert [r is None for r in results] == [False] * 15 + [True]  # waited past the target already: the newest alone
    assert {r.reason for r in results[:15]} == {"shed"} and results[0].code == UNAVAILABLE
    message = results[0].message
    assert "waited 500 ms or more on average for 0.5 s" in message and "queue_delay_target_ms=200" in message, message
    assert "16 requests taken at once, the most Triton hands one" in message and "latest wait, 500 ms" in message
    assert timings.dropped == {("shed", "admission", UNAVAILABLE): 15}
    measured["now"] = reading(clock.now, 0.12, standing_s=0.12)  # the refusals shortened the queue: 80 ms left
    results, _ = execute(16)
    assert door.shedding and [r is None for r in results] == [False] * 8 + [True] * 8  # 8 images of 10 ms fit
    assert "waited 500 ms or more" in results[0].message and "latest wait, 120 ms" in results[0].message  # both true
    assert execute(12)[0] == [None] * 12 and not door.shedding  # came short of full: the queue drained
    measured["now"] = reading(clock.now, 0.5, age=3.0)  # bls-serve stopped: unknown again
    assert execute(16)[0] == [None] * 16 and not door.shedding


def test_no_target_no_shedding():
    clock = FakeClock()
    door = Admission(batch_cap=16, target_s=0.0, clock=clock, queue=lambda: reading(clock.now, 5.0))
    door.costs.observe("execute", 0.1, 10)
    req_clock, got = door.open([ImageRequest([photo()])] * 16)
    results = [None] * 16
    door.admit(req_clock, results, Timings(), got)
    assert results == [None] * 16


def test_a_deadline_counts_from_arrival_as_triton_measured_the_wait():
    clock = FakeClock()
    door = Admission(batch_cap=16, target_s=0.0, clock=clock, queue=lambda: reading(clock.now, 0.3))
    req_clock, _ = door.open([ImageRequest([photo()], timeout_s=1.0)])
    assert req_clock.time_left(clock.now)[0] == pytest.approx(1.0 - 0.3 - 0.01)  # less the wait and the way back
    unmeasured = Admission(batch_cap=16, target_s=0.0, clock=clock)
    req_clock, _ = unmeasured.open([ImageRequest([photo()], timeout_s=1.0)])
    assert req_clock.time_left(clock.now)[0] == pytest.approx(1.0 - 0.01)  # no wait known: none counted


def test_a_client_gone_before_its_estimated_deadline_makes_later_deadlines_earlier():
    clock = FakeClock()
    door = Admission(batch_cap=None, target_s=0.0, clock=clock)
    from bls_pipeline.runtime.admission import drop
    from bls_pipeline.runtime.results import Timings

    gone = ImageRequest([photo()], timeout_s=1.0, cancelled=lambda: True)
    req_clock, _ = door.open([gone])
    results = [None]
    clock.now += 0.5  # cancelled with 0.49 s (less the response's 10 ms) of the estimate left
    drop(req_clock, results, Timings(), "m", clock.now, lambda r: 1)
    assert results[0].code == CANCELLED and door.slack_s == pytest.approx(0.2 * 0.49)
    later, _ = door.open([ImageRequest([photo()], timeout_s=1.0)])
    assert later.time_left(clock.now)[0] == pytest.approx(1.0 - 0.01 - door.slack_s)


