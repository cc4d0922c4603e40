"""What a request carries reaches the flow (its parameters, its deadline, whether its client
went), and no work is done for a client that has gone: LocalFlow runs of the shipped
classify_bls and of flows written here, and the door's arithmetic (runtime/admit/admission.py)."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bls_pipeline.adapter.queue_waits import QueueWaits, QueueWaitWriter
from bls_pipeline.flow import LocalFlow, Probability, RequestFailed
from bls_pipeline.runtime.admit.admission import Admission, Costs, QueueReading
from bls_pipeline.runtime.results import Timings
from bls_pipeline.serve.queue_monitor import QueueWindows, queue_totals
from bls_pipeline.runtime.call.calls import ChildRequest
from bls_pipeline.runtime.load.fields import ParameterError
from bls_pipeline.runtime.load.parameters import Parameters
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


def cascade(cheap_sure: float = 20.0, cheap_sleep: float = 0.0, log: list | None = None, **extra: str) -> LocalFlow:
    models = {"efficientnet_lite0_onnx": classifier(504, cheap_sure, cheap_sleep, log, "cheap"),
              "resnet50_onnx": classifier(967, log=log, name="main")}
    return LocalFlow(MODELS / "classify_bls", models, parameters={**CASCADE, **extra})


# ---- parameters ---------------------------------------------------------------------------------
def test_a_client_can_send_its_images_straight_to_the_main_classifier():
    log: list = []
    with cascade(log=log) as flow:
        (plain, skipped), _ = flow.run([ImageRequest([photo()]),
                                        ImageRequest([photo(), photo()], parameters={"skip_cascade": True})])
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
    ({"skipcascade": True},
     "unknown request parameter 'skipcascade': classify_bls accepts skip_cascade (bool, default False)"),
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
    ({"ratio": "2.5"},
     "request parameter ratio='2.5': send a finite number, as a JSON number: 2.5, not the string '2.5'"),
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
        assert (flow.classify([photo()], parameters={"timeout": 5, "priority": 1, "bls_probe": True}).routes.shape
                == (1, 1))


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
output [ { name: "LABELS", data_type: TYPE_STRING, dims: [ -1 ] },
         { name: "ROUTE", data_type: TYPE_STRING, dims: [ 1 ] } ]
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
        requests = [ImageRequest([photo()], cancelled=lambda: True),
                    ImageRequest([photo()], cancelled=lambda: state["gone"]), ImageRequest([photo()])]
        gone_before, gone_midway, answered = flow.run(requests)[0]
    assert gone_before.code == gone_midway.code == CANCELLED and gone_before.reason == "cancelled"
    assert isinstance(answered, Prediction)
    assert log == [("cheap", 2), ("main", 1)]


def test_a_request_that_cannot_finish_in_time_is_refused_before_a_stage_it_needs():
    with cascade(cheap_sure=0.0, cheap_sleep=0.05, overload="refuse") as flow:
        flow.run([ImageRequest([photo()])])  # measured once: the main model's time per image
        flow.runtime.admission.costs.observe("resnet50_onnx", 10.0, 1)  # ... now about 2 s an image (a moving average)
        (short, none), _ = flow.run([ImageRequest([photo()], timeout_s=0.5), ImageRequest([photo()])])
    assert isinstance(short, RequestError) and short.reason == "no_time" and short.code == UNAVAILABLE
    assert "ms left of its deadline" in short.message and "resnet50_onnx takes about" in short.message
    assert isinstance(none, Prediction)  # no deadline: never refused for time


def test_an_optional_stage_too_slow_for_a_deadline_is_skipped_and_the_cheap_answer_stands_degraded():
    log: list = []
    with cascade(cheap_sure=0.0, cheap_sleep=0.05, log=log) as flow:  # classify_bls as shipped: overload "degrade"
        flow.run([ImageRequest([photo()])])
        flow.runtime.admission.costs.observe("resnet50_onnx", 10.0, 1)
        log.clear()
        (short, none, direct), timings = flow.run([ImageRequest([photo()], timeout_s=0.5), ImageRequest([photo()]),
                                                   ImageRequest([photo()], timeout_s=0.5,
                                                                parameters={"skip_cascade": True})])
    assert short.routes[0, 0] == b"efficientnet_lite0_onnx:degraded"
    why = short.notes[0]["degraded"]
    assert (why.startswith("overloaded: resnet50_onnx would answer in about ")
            and "were left of this request's deadline" in why)
    # No deadline: it aims at classify_bls's latency_target_ms (400), which 2 s would pass too.
    assert none.routes[0, 0] == b"efficientnet_lite0_onnx:degraded"
    assert "were left of this request's latency_target_ms=400" in none.notes[0]["degraded"]
    # It asked for the main model: not optional, so refused for time as any needed stage.
    assert isinstance(direct, RequestError) and direct.reason == "no_time"
    assert log == [("cheap", 2)]
    assert timings.degraded == {("resnet50_onnx", "late"): 2}


def test_a_request_without_a_deadline_aims_at_the_latency_target_and_is_degraded_past_it_never_refused():
    with cascade(cheap_sure=0.0, latency_target_ms="300") as flow:
        flow.run([ImageRequest([photo()])])
        flow.runtime.admission.costs.observe("resnet50_onnx", 0.1, 1)  # fast on its own ...
        assert flow.classify([photo()]).routes[0, 0] == b"resnet50_onnx:escalated"
        # ... but its queue, as Triton measured it, holds calls for 0.5 s now
        flow.runtime.admission.queues = lambda model: QueueReading(time.monotonic(), 0.5,
                                                                   4) if model == "resnet50_onnx" else None
        got = flow.classify([photo()])
        assert got.routes[0, 0] == b"efficientnet_lite0_onnx:degraded"
        assert "(its queue 500 ms as Triton measured it)" in got.notes[0]["degraded"]
        assert "of this request's latency_target_ms=300" in got.notes[0]["degraded"]
        flow.runtime.admission.queues = lambda model: QueueReading(time.monotonic() - 5, 0.5, 4)  # stale: unknown again
        assert flow.classify([photo()]).routes[0, 0] == b"resnet50_onnx:escalated"
    with cascade(cheap_sure=0.0, latency_target_ms="300", overload="refuse") as flow:  # refuse: run it, late or not
        flow.runtime.admission.queues = lambda model: QueueReading(time.monotonic(), 5.0, 4)
        assert flow.classify([photo()]).routes[0, 0] == b"resnet50_onnx:escalated"


def test_optional_rows_never_make_a_call_late_for_the_rows_it_must_send():
    with cascade(cheap_sure=0.0) as flow:
        flow.run([ImageRequest([photo()])])
        flow.runtime.admission.costs.observe("resnet50_onnx", 1.0, 1)  # about 0.2 s an image
        needed = ImageRequest([photo()] * 2, timeout_s=0.9, parameters={"skip_cascade": True})  # 2 images: ~0.4 s
        (direct, optional), _ = flow.run([needed, ImageRequest([photo()] * 4)])  # 4 more would make it ~1.2 s
    assert direct.routes[:, 0].tolist() == [b"resnet50_onnx:direct"] * 2
    assert optional.routes[:, 0].tolist() == [b"efficientnet_lite0_onnx:degraded"] * 4


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


# ---- the door: Triton's measured queue, costs ----------------------------------------------------
def reading(now, wait_s, requests=20, age=0.05):
    return QueueReading(at=now - age, wait_s=wait_s, requests=requests)


def test_queue_windows_turn_triton_statistics_into_measured_waits():
    windows = QueueWindows()
    assert windows.add("m", 10.0, count=100, wait_ns=0) is None  # the first reading: nothing to difference
    got = windows.add("m", 10.1, count=110, wait_ns=int(3e9))  # 10 requests left the queue, 3 s of waits
    assert (got.at, got.wait_s, got.requests) == (10.1, pytest.approx(0.3), 10)
    assert windows.add("m", 10.2, count=110, wait_ns=int(3e9)) is None  # none left: no news (the last one grows stale)
    assert windows.add("m", 10.3, count=112, wait_ns=int(3.1e9)).wait_s == pytest.approx(0.05)
    assert windows.add("m", 10.9, count=5, wait_ns=0) is None  # counts went back: loaded anew, start over
    assert queue_totals({"model_stats": [
        {"name": "m", "version": "1", "inference_stats": {"queue": {"count": 3, "ns": 30}}},
        {"name": "m", "version": "2", "inference_stats": {"queue": {"count": 1, "ns": 5}}},
        {"name": "n", "version": "1", "inference_stats": {}}]}) == {"m": (4, 35), "n": (0, 0)}


def test_queue_readings_reach_the_instances_through_shared_memory(tmp_path):
    clock = FakeClock()
    readers = QueueWaits(server_pid=7, folder=tmp_path, clock=clock)
    assert readers.read("classify_bls") is None  # bls-serve wrote nothing (or runs nowhere): unmeasured
    writer = QueueWaitWriter(server_pid=7, folder=tmp_path)
    writer.write("classify_bls", reading(50.0, 0.25, requests=12))
    assert readers.read("classify_bls") is None  # a reader looks for a missing file again only after a second
    clock.now += 1.0
    got = readers.read("classify_bls")
    assert (got.wait_s, got.requests) == (0.25, 12)
    writer.write("classify_bls", reading(51.0, 0.5))
    assert readers.read("classify_bls").wait_s == 0.5  # mapped: every write is seen at once
    assert readers.read("resnet50_onnx") is None  # one file per model
    writer.write("resnet50_onnx", reading(51.0, 0.1))
    clock.now += 1.0
    assert readers.read("resnet50_onnx").wait_s == 0.1
    readers.close()
    writer.close()
    assert not list(tmp_path.iterdir())  # bls-serve removes what it made


def test_a_stale_or_empty_reading_is_no_measurement():
    assert reading(100.0, 0.3).fresh(100.0)
    assert not reading(100.0, 0.3, age=2.0).fresh(100.0)  # bls-serve stopped writing, or nothing left the queue
    assert not reading(100.0, 0.3, requests=0).fresh(100.0)


def test_costs_predict_from_what_was_measured_and_trust_an_old_measurement_less():
    clock = FakeClock()
    costs = Costs(clock)
    assert costs.predict("m", 10) == 0.0
    costs.observe("m", 0.5, 5)
    assert costs.predict("m", 10) == pytest.approx(1.0)
    costs.observe("m", 1.0, 5)  # 0.2 s an image now: the average moves a fifth of the way
    assert costs.per_image("m") == pytest.approx(0.12)
    clock.now += Costs.HALF_LIFE_S  # measured this recently: as measured
    assert costs.per_image("m") == pytest.approx(0.12)
    # A stage skipped because it measured slow is not skipped for ever on that figure: it
    # halves every second it goes unmeasured after that, so a call soon goes through and
    # measures it anew.
    clock.now += 2 * Costs.HALF_LIFE_S
    assert costs.per_image("m") == pytest.approx(0.03)
    costs.observe("m", 0.05, 5)  # measured again: fresh, and averaged with what was left
    assert costs.per_image("m") == pytest.approx(0.03 + 0.2 * (0.01 - 0.03))


def test_a_batch_costs_something_whatever_its_size_and_something_per_image():
    """An execute() of 8 images took 0.24 s and one of 2 took 0.09 s: 40 ms for any batch and
    25 ms an image. Read as a time per image (30 and 45 ms), a batch of 2 would look dearer per
    image than one of 8, and a door refusing on that would make its batches smaller still."""
    clock = FakeClock()
    costs = Costs(clock)
    for _ in range(30):
        costs.observe("execute", 0.24, 8)
        costs.observe("execute", 0.09, 2)
    assert costs.predict("execute", 8) == pytest.approx(0.24, rel=0.02)
    assert costs.predict("execute", 4) == pytest.approx(0.14, rel=0.02)
    assert costs.predict("execute", 2) == pytest.approx(0.09, rel=0.02)
    steady = Costs(clock)
    for _ in range(5):
        steady.observe("execute", 0.24, 8)  # one size only: no fixed part to tell apart
    assert steady.predict("execute", 4) == pytest.approx(0.12)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_client_without_a_deadline_is_never_refused_however_long_the_queue():
    clock = FakeClock()
    door = Admission(queued=True, target_s=0.2, clock=clock, queues=lambda model: reading(clock.now, 5.0), model="f")
    door.costs.observe("execute", 1.0, 1)  # 1 s an image
    req_clock, got = door.open([ImageRequest([photo()])] * 64)
    results = [None] * 64
    door.admit(req_clock, results, Timings())
    assert got.wait_s == 5.0 and results == [None] * 64


def test_a_deadline_counts_from_arrival_as_triton_measured_the_wait():
    clock = FakeClock()
    door = Admission(queued=True, target_s=0.0, clock=clock, queues=lambda model: reading(clock.now, 0.3), model="f")
    req_clock, _ = door.open([ImageRequest([photo()], timeout_s=1.0)])
    assert req_clock.time_left(clock.now)[0] == pytest.approx(1.0 - 0.3 - 0.01)  # less the wait and the way back
    aiming = Admission(queued=True, target_s=0.5, clock=clock, queues=lambda model: reading(clock.now, 0.3), model="f")
    req_clock, _ = aiming.open([ImageRequest([photo()]), ImageRequest([photo()], timeout_s=1.0)])
    assert req_clock.aim_left(clock.now).tolist() == [pytest.approx(0.5 - 0.3 - 0.01), pytest.approx(1.0 - 0.3 - 0.01)]
    assert req_clock.time_left(clock.now)[0] == float("inf")  # an aim is no deadline: nothing refused on it
    unmeasured = Admission(queued=True, target_s=0.0, clock=clock)
    req_clock, _ = unmeasured.open([ImageRequest([photo()], timeout_s=1.0)])
    assert req_clock.time_left(clock.now)[0] == pytest.approx(1.0 - 0.01)  # no wait known: none counted


def test_a_client_gone_before_its_estimated_deadline_is_dropped_and_moves_no_later_deadline():
    """A gRPC client whose deadline passed (its call cancelled) while the runtime's estimate still
    gave it time is seen as gone, and dropped. Later requests' deadlines stay as their clients
    sent them: the clients seen gone are those that waited longest, and learning from them made
    every later deadline earlier until the door refused everything."""
    clock = FakeClock()
    door = Admission(queued=False, target_s=0.0, clock=clock)
    from bls_pipeline.runtime.admit.admission import drop
    from bls_pipeline.runtime.results import Timings

    gone = ImageRequest([photo()], timeout_s=1.0, cancelled=lambda: True)
    req_clock, _ = door.open([gone])
    results = [None]
    clock.now += 0.5  # cancelled with half of its deadline left, as estimated
    drop(req_clock, results, Timings(), "m", clock.now, lambda r: 1)
    assert results[0].code == CANCELLED
    later, _ = door.open([ImageRequest([photo()], timeout_s=1.0)])
    assert later.time_left(clock.now)[0] == pytest.approx(1.0 - 0.01)




# ---- random weights --------------------------------------------------------------------------
def test_an_answer_from_a_model_exported_with_random_weights_says_so(tmp_path, caplog):
    """resnet50 exported with --weights random (as the tests do): its labels are ImageNet's, its
    answers mean nothing. The flow's log says so at load, and every answer it gives says so."""
    import json
    import shutil

    repo = tmp_path / "models"
    for name in ("classify_bls", "efficientnet_lite0_onnx", "resnet50_onnx"):
        shutil.copytree(MODELS / name, repo / name, ignore=shutil.ignore_patterns("*.onnx*", "__pycache__"))
    (repo / "resnet50_onnx" / "1" / "model.onnx").write_bytes(b"not read: a function answers for it here")
    (repo / "resnet50_onnx" / "1" / "model.onnx.json").write_text(json.dumps({"weights": "random"}))
    models = {"efficientnet_lite0_onnx": classifier(504, 0.0), "resnet50_onnx": classifier(967)}
    with caplog.at_level("WARNING"), LocalFlow(repo / "classify_bls", models, parameters=CASCADE) as flow:
        (unsure,), _ = flow.run([ImageRequest([photo()])])
    said = "resnet50_onnx runs an engine exported with random weights (1/model.onnx): its labels mean nothing"
    assert said in caplog.text
    assert unsure.routes[0, 0] == b"resnet50_onnx:escalated" and said in unsure.notes[0]["warning"]
    assert said in json.loads(unsure.outputs["JSON"][0, 0])["warning"]
