"""The flow API (bls_pipeline.flow) with flows written as a user would, in a temporary model
repository: calls, rows, answers, concurrency, errors, and the load check."""

from __future__ import annotations

import io
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bls_pipeline.stages.decode import decode
from bls_pipeline.flow import LocalFlow, RequestFailed
from bls_pipeline.stages.preprocess import preprocess_into
from bls_pipeline.runtime.call.batch import ChildCallError
from bls_pipeline.runtime.load.children import load_child
from bls_pipeline.runtime.engine import FlowRuntime
from bls_pipeline.runtime.results import ImageRequest, Prediction, RequestError
from bls_pipeline.base.errors import ConfigError

MODELS = Path(__file__).resolve().parents[2] / "models"
LABELS = (MODELS / "resnet50_onnx" / "labels.txt").read_text().splitlines()
FLOW_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 64
input [ {{ name: "IMAGE", data_type: TYPE_STRING, dims: [ 1 ] }},
        {{ name: "TOPK", data_type: TYPE_INT32, dims: [ 1 ], optional: true }} ]
output [ {{ name: "LABELS", data_type: TYPE_STRING, dims: [ -1 ] }},
         {{ name: "ROUTE", data_type: TYPE_STRING, dims: [ 1 ] }} ]
"""
CLASSIFIER_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: {batch}
input [ {{ name: "pixels", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] }} ]
output [ {{ name: "logits", data_type: TYPE_FP32, dims: [ 1000 ], label_filename: "labels.txt" }} ]
"""
GRAY_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 8
input [ { name: "G", data_type: TYPE_UINT8, dims: [ 32, 32, 1 ] } ]
output [ { name: "MEAN", data_type: TYPE_FP32, dims: [ 1 ] }, { name: "IDS", data_type: TYPE_INT32, dims: [ 2 ] } ]
parameters { key: "preprocess_resize_mode", value: { string_value: "stretch" } }
""".replace("{name}", "gray")
SETTINGS = '''
from bls_pipeline.flow import *
from bls_pipeline.flow import Answer


class S(Settings):
    main: Candidates = "cls_a,cls_b"
    other: Candidates = "cls_c"
    gray: Candidates = "gray"
'''


def image(colour, size=(40, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "PNG")
    return buf.getvalue()


RED, GREEN, DARK = image((220, 20, 20)), image((20, 220, 20)), image((3, 3, 3))


def logits_of(colour_channel: int):
    """A fake classifier: class = the channel with the highest mean (0, 1, 2), sure of it."""
    def fn(batch: np.ndarray) -> np.ndarray:
        out = np.zeros((len(batch), len(LABELS)), np.float32)
        out[np.arange(len(batch)), batch.mean(axis=(2, 3)).argmax(axis=1) + colour_channel] = 20.0
        return out
    return fn


def gray_fn(batch: np.ndarray) -> dict:
    return {"MEAN": batch.reshape(len(batch), -1).mean(axis=1, keepdims=True).astype(np.float32),
            "IDS": np.tile(np.array([[7, 9]], np.int32), (len(batch), 1))}


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "models"
    for name, batch in (("cls_a", 64), ("cls_b", 64), ("cls_c", 2)):
        (root / name).mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CLASSIFIER_CONFIG.format(name=name, batch=batch))
        shutil.copy(MODELS / "resnet50_onnx" / "labels.txt", root / name / "labels.txt")
    (root / "gray").mkdir()
    (root / "gray" / "config.pbtxt").write_text(GRAY_CONFIG)
    return root


def write_flow(repo: Path, body: str, name: str = "f") -> Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(FLOW_CONFIG.format(name=name))
    (repo / name / "1" / "flow.py").write_text(SETTINGS + textwrap.dedent(body))
    return repo / name


class Recorder:
    """A transport: the child functions, with every round of requests recorded."""

    def __init__(self, functions: dict, ready: set[str] | None = None, fail: set[str] = frozenset()):
        self.functions, self.ready, self.fail = functions, set(functions) if ready is None else ready, set(fail)
        self.rounds: list[list[tuple[str, int]]] = []

    def is_ready(self, model: str) -> bool:
        return model in self.ready

    def send(self, requests):
        self.rounds.append([(r.model, len(next(iter(r.inputs.values())))) for r in requests])
        replies = []
        for r in requests:
            (data,) = r.inputs.values()
            if r.model in self.fail:
                self.ready.discard(r.model)  # it went away mid-call
                replies.append(ChildCallError(f"{r.model} was unloaded"))
                continue
            out = self.functions[r.model](data)
            replies.append(out if isinstance(out, dict) else {r.outputs[0]: out})
        return replies


def runtime(model_dir: Path, recorder: Recorder, **params) -> FlowRuntime:
    return FlowRuntime.load(model_dir, {k: str(v) for k, v in params.items()}, recorder.is_ready)


FUNCTIONS = {"cls_a": logits_of(0), "cls_b": logits_of(10), "cls_c": logits_of(20), "gray": gray_fn}


# ---- calls and answers --------------------------------------------------------------------
def test_a_selection_is_one_call_on_those_rows_and_later_answers_win(repo):
    flow = write_flow(repo, """
        def flow(batch, s: S) -> Answer:
            first = batch.classify(s.main)
            reds = first.top1_class == 0
            second = batch.classify(s.other, rows=reds)
            return batch.answer().set(first, "first").set(second, "second")
    """)
    rec = Recorder(FUNCTIONS)
    (result,), timings = runtime(flow, rec).run([ImageRequest([RED, GREEN, RED])], rec.send)
    assert rec.rounds == [[("cls_a", 3)], [("cls_c", 2)]]  # one call each; cls_c's max batch is 2
    assert result.routes[:, 0].tolist() == [b"cls_c:second", b"cls_a:first", b"cls_c:second"]
    assert result.class_ids[:, 0].tolist() == [20, 1, 20]
    assert result.labels[1, 0].decode().endswith(f":1:{LABELS[1]}")
    assert {m: (s.calls, s.images) for m, s in timings.children.items()} == {"cls_a": (1, 3), "cls_c": (1, 2)}


def test_together_sends_both_calls_in_one_round_and_each_gets_its_own_answer(repo):
    flow = write_flow(repo, """
        def flow(batch, s: S) -> Answer:
            a, c = batch.together(Classify(s.main), Classify(s.other, rows=[batch.size - 1]))
            assert (a.model, c.model) == ("cls_a", "cls_c")
            return batch.answer().set(a.mean(c), "vote").set(a[a.rows[:-1]], "alone")
    """)
    rec = Recorder(FUNCTIONS)
    (result,), _ = runtime(flow, rec).run([ImageRequest([RED, GREEN])], rec.send)
    assert rec.rounds == [[("cls_a", 2), ("cls_c", 1)]]  # in flight together
    assert result.routes[:, 0].tolist() == [b"cls_a:alone", b"cls_a+cls_c:vote"]
    assert result.scores[1, 0] == pytest.approx(0.5, abs=1e-4)  # two sure answers, different classes, averaged


def test_a_model_that_went_away_is_rerouted_within_together(repo):
    flow = write_flow(repo, """
        def flow(batch, s: S) -> Answer:
            a, c = batch.together(Classify(s.main), Classify(s.other))
            return batch.answer().set(a, "main")
    """)
    rec = Recorder(FUNCTIONS, fail={"cls_a"})
    (result,), _ = runtime(flow, rec).run([ImageRequest([RED])], rec.send)
    assert rec.rounds == [[("cls_a", 1), ("cls_c", 1)], [("cls_b", 1)]]  # only the failed call goes again
    assert result.routes[0, 0] == b"cls_b:main" and result.class_ids[0, 0] == 10


def test_per_row_values_cover_every_row(repo):
    flow = write_flow(repo, """
        import numpy as np

        def flow(batch, s: S) -> Answer:
            if batch.size < 3:  # the load check's probe image
                return batch.answer().skip(None, "probe")
            g = batch.infer(s.gray, rows=np.array([0, 2]))
            c = batch.classify(s.main, rows=[True, False, True])
            assert np.isnan(g["MEAN"][1, 0]) and g["IDS"][1].tolist() == [-1, -1] and g["IDS"][0].tolist() == [7, 9]
            assert np.isnan(c.top1[1]) and c.top1_class[1] == -1 and c.covered.tolist() == [True, False, True]
            assert c.probs.shape == (3, 1000) and np.isnan(c.probs[1]).all()
            dark = g["MEAN"][:, 0] < 10
            return batch.answer().skip(dark, "gray:dark").set(c[~dark], "lit").skip([1], "flow:skipped")
    """)
    rec = Recorder(FUNCTIONS)
    (result,), _ = runtime(flow, rec).run([ImageRequest([RED, GREEN, DARK], topk=2)], rec.send)
    assert result.routes[:, 0].tolist() == [b"cls_a:lit", b"flow:skipped", b"gray:dark"]
    assert result.labels[1:].tolist() == [[b"", b""], [b"", b""]]
    assert (result.scores[1:].tolist() == [[0.0, 0.0], [0.0, 0.0]]
            and result.class_ids[1:].tolist() == [[-1, -1], [-1, -1]])


def test_each_child_gets_its_own_input_from_the_same_decode(repo):
    flow = write_flow(repo, """
        def flow(batch, s: S) -> Answer:
            batch.infer(s.gray)
            return batch.answer().set(batch.classify(s.main), "x")
    """)
    seen = {}
    functions = {**FUNCTIONS, "gray": lambda b: seen.setdefault("gray", b) is not None and gray_fn(b),
                 "cls_a": lambda b: seen.setdefault("cls_a", b) is not None and logits_of(0)(b)}
    rec = Recorder(functions)
    runtime(flow, rec).run([ImageRequest([RED])], rec.send)
    img = decode(RED)
    for name, got in seen.items():
        spec = load_child(repo, name).preprocess
        want = np.empty(spec.input_shape, spec.numpy_dtype)
        preprocess_into(img, spec, want)
        assert got.dtype == spec.numpy_dtype and got.shape == (1, *spec.input_shape)
        np.testing.assert_allclose(got[0], want, atol=1e-5)
    assert seen["gray"].shape == (1, 32, 32, 1) and seen["gray"].dtype == np.uint8


def test_flip_mirrors_the_width_axis_of_each_layout(repo):
    flow = write_flow(repo, """
        def flow(batch, s: S) -> Answer:
            batch.infer(s.gray, flip=True)
            batch.infer(s.gray)
            return batch.answer().skip(None, "done")
    """)
    seen = []
    rec = Recorder({**FUNCTIONS, "gray": lambda b: seen.append(b.copy()) or gray_fn(b)})
    half = np.zeros((30, 40, 3), np.uint8)
    half[:, :20] = 255
    buf = io.BytesIO()
    Image.fromarray(half).save(buf, "PNG")
    runtime(flow, rec).run([ImageRequest([buf.getvalue()])], rec.send)
    mirrored, plain = seen
    np.testing.assert_array_equal(mirrored, plain[:, :, ::-1, :])
    assert plain[0, 0, 0, 0] == 255 and plain[0, 0, -1, 0] == 0


# ---- what goes wrong -------------------------------------------------------------------------
def test_a_broken_call_fails_its_requests_and_the_flow_goes_on_for_the_others(repo):
    """cls_c, called on the second request's images alone (not green), answers with one row
    too few: that request fails (INTERNAL, naming cls_c); the later call on every row leaves
    its rows out; the others are answered."""
    flow = write_flow(repo, """
        def flow(batch, s: S) -> Answer:
            first = batch.classify(s.main)
            second = batch.classify(s.other, rows=first.top1_class != 1)
            third = batch.classify(s.main, flip=True)
            return batch.answer().set(first.mean(third), "both").set(second, "second")
    """)
    rec = Recorder({**FUNCTIONS, "cls_c": lambda batch: FUNCTIONS["cls_c"](batch)[:-1]})
    requests = [ImageRequest([GREEN]), ImageRequest([RED, DARK]), ImageRequest([GREEN, GREEN])]
    results, timings = runtime(flow, rec).run(requests, rec.send)
    assert rec.rounds == [[("cls_a", 5)], [("cls_c", 2)], [("cls_a", 3)]]  # the third call without the failed rows
    assert [r.routes[:, 0].tolist() for r in (results[0], results[2])] == [[b"cls_a:both"], [b"cls_a:both"] * 2]
    failed = results[1]
    assert (failed.reason, failed.code) == ("cls_c", "INTERNAL")
    assert (failed.message.startswith("classifier cls_c failed: cls_c returned logits with shape (1, 1000) for a batch "
                                      "of 2"))
    assert timings.rejected == {("cls_c", "INTERNAL"): 2}


def test_a_failed_call_in_together_leaves_the_other_calls_answered(repo):
    flow = write_flow(repo, """
        def flow(batch, s: S) -> Answer:
            first = batch.request_id == "a"
            main, other = batch.together(Classify(s.main, rows=first), Classify(s.other, rows=~first))
            return batch.answer().set(main, "main").set(other, "other")
    """)
    rec = Recorder(FUNCTIONS)

    def send(requests):  # cls_c's queue is full
        return [ChildCallError("Exceeds maximum queue size", busy=True) if r.model == "cls_c" else reply
                for r, reply in zip(requests, rec.send(requests))]

    results, timings = runtime(flow, rec).run([ImageRequest([RED], id="a"), ImageRequest([GREEN, DARK], id="b")], send)
    assert results[0].routes[0, 0] == b"cls_a:main"
    assert (results[1].reason, results[1].code) == ("other", "UNAVAILABLE")  # overloaded: the role, try again
    assert timings.rejected == {("other", "UNAVAILABLE"): 2}


def test_no_model_ready_names_the_role_with_nothing_ready_and_its_candidates_only(repo):
    flow = write_flow(repo, """
        def flow(batch, s: S) -> Answer:
            other = batch.classify(s.other)
            if batch.classify(s.main) is None:
                raise NoModelReady
            return batch.answer().set(other, "x")
    """)
    rec = Recorder(FUNCTIONS, ready={"cls_c"})  # `other` answered; none of `main` is READY
    (result,), timings = runtime(flow, rec).run([ImageRequest([RED, GREEN])], rec.send)
    assert result == RequestError("no classifier is ready for main (its candidates, in order: cls_a not READY, "
                                  "cls_b not READY)", "main", "UNAVAILABLE")
    assert "cls_c" not in result.message  # another role's candidate, READY, is none of the reader's business
    assert rec.rounds == [[("cls_c", 2)]] and timings.rejected == {("main", "UNAVAILABLE"): 2}


def _run_with_none_ready(repo, failed_loads: dict[str, str]):
    """One request to a flow whose `main` candidates (cls_a, cls_b) are none READY, with these
    failed loads known (bls-serve's model states)."""
    flow = write_flow(repo, """
        def flow(batch, s: S) -> Answer:
            scores = batch.classify(s.main)
            if scores is None:
                raise NoModelReady
            return batch.answer().set(scores, "x")
    """)
    rec = Recorder(FUNCTIONS, ready=set())
    pipeline = runtime(flow, rec)
    pipeline.failed_loads = lambda: failed_loads
    (result,), timings = pipeline.run([ImageRequest([RED])], rec.send)
    return result, timings


def test_a_candidate_that_failed_its_load_makes_no_model_ready_internal_naming_the_load_error(repo):
    """Nothing will answer until someone fixes the model: INTERNAL, not the retry-later code."""
    result, timings = _run_with_none_ready(repo, {"cls_b": "Internal: model.onnx does not match its config\nAt: ...",
                                                  "other": "x"})
    assert result == RequestError("no classifier is ready for main (its candidates, in order: cls_a not READY, "
                                  "cls_b failed to load: Internal: model.onnx does not match its config)", "main",
                                  "INTERNAL")
    assert timings.rejected_requests == {("main", "INTERNAL"): 1}


def test_a_failed_load_of_a_model_the_flow_did_not_try_changes_nothing(repo):
    result, _ = _run_with_none_ready(repo, {"cls_c": "Internal: broken"})
    assert ((result.code, result.message)
            == ("UNAVAILABLE",
                "no classifier is ready for main (its candidates, in order: cls_a not READY, cls_b not READY)"))


def test_a_flow_that_raises_fails_that_execute_only(repo):
    flow = write_flow(repo, """
        def flow(batch, s: S) -> Answer:
            scores = batch.classify(s.main)
            if batch.size == 2:
                raise KeyError("secret/path")
            return batch.answer().set(scores, "ok")
    """)
    rec = Recorder(FUNCTIONS)
    rt = runtime(flow, rec)
    failed, timings = rt.run([ImageRequest([RED]), ImageRequest([GREEN])], rec.send)
    assert failed == [RequestError("flow f raised KeyError (details in the server log)", "flow", "INTERNAL")] * 2
    assert "secret" not in failed[0].message and isinstance(failed[0].cause, KeyError)  # the client reads no text of it
    assert timings.rejected == {("flow", "INTERNAL"): 2}
    (ok,), _ = rt.run([ImageRequest([RED])], rec.send)  # the model keeps serving
    assert isinstance(ok, Prediction) and ok.routes[0, 0] == b"cls_a:ok"


def test_rows_left_unanswered_fail_their_request(repo):
    flow = write_flow(repo, """
        def flow(batch, s: S) -> Answer:
            return batch.answer().set(batch.classify(s.main, rows=[0]), "ok")  # row 0 only
    """)
    rec = Recorder(FUNCTIONS)
    results, _ = runtime(flow, rec).run([ImageRequest([RED]), ImageRequest([GREEN, RED])], rec.send)
    assert isinstance(results[0], Prediction)
    assert results[1] == RequestError("flow f left IMAGE[0] unanswered", "flow", "INTERNAL")


@pytest.mark.parametrize(("body", "message"), [
    ("return batch.answer().set(batch.classify(s.main, rows=[True]), 'x')", "one entry per row (2), got shape (1,)"),
    ("return batch.answer().set(batch.classify(s.main, rows=[5]), 'x')", "row indices must be in 0..1"),
    ("return batch.answer().set(batch.classify(None), 'x')", "Answer.set(None, 'x')"),
    ("return batch.infer(s.gray)['NOPE']", "model gray has no output 'NOPE'"),
    ("return None", "returned NoneType; it must return the batch's Answer"),
])
def test_api_misuse_says_what_to_do(repo, body, message):
    flow = write_flow(repo, f"""
        def flow(batch, s: S) -> Answer:
            if batch.size == 1:
                return batch.answer().skip(None, "probe")
            {body}
    """)
    rec = Recorder(FUNCTIONS)
    (result,), _ = runtime(flow, rec).run([ImageRequest([RED, GREEN])], rec.send)
    assert result.reason == "flow" and message in result.message, result.message


@pytest.mark.parametrize(("body", "message"), [
    ("batch.classify('resnet50_onnx')", "calls model 'resnet50_onnx', which it did not declare"),
    ("batch.classify(s.gray)", "gray's output has no label_filename"),
    ("1 / 0", "raised ZeroDivisionError"),
    ("return batch.answer()", "left IMAGE[0] unanswered"),
])
def test_the_load_check_catches_a_broken_flow_before_any_request(repo, body, message):
    flow = write_flow(repo, f"""
        def flow(batch, s: S) -> Answer:
            {body}
            return batch.answer().skip(None, "x")
    """)
    rec = Recorder(FUNCTIONS)
    with pytest.raises(ConfigError, match="failed its load check") as info:
        runtime(flow, rec)
    assert message in str(info.value)
    assert rec.rounds == []  # no child was called: the check uses stand-ins


def test_a_flow_file_that_is_missing_or_has_no_flow(repo):
    (repo / "empty" / "1").mkdir(parents=True)
    (repo / "empty" / "config.pbtxt").write_text(FLOW_CONFIG.format(name="empty"))
    with pytest.raises(ConfigError, match="flow.py is missing"):
        FlowRuntime.load(repo / "empty", {}, lambda m: True)
    (repo / "empty" / "1" / "flow.py").write_text("def run(batch, settings):\n    pass\n")
    with pytest.raises(ConfigError, match="has no function `flow\\(batch, settings\\)`"):
        FlowRuntime.load(repo / "empty", {}, lambda m: True)


def test_a_declared_model_without_a_config_fails_the_load(repo):
    flow = write_flow(repo, "def flow(batch, s: S) -> Answer:\n    return batch.answer()\n")
    with pytest.raises(ConfigError, match="model ghost has no .*config.pbtxt"):
        FlowRuntime.load(flow, {"other": "ghost"}, lambda m: True)


# ---- LocalFlow ----------------------------------------------------------------------------------
def test_local_flow_runs_functions_and_reports_failures(repo):
    flow = write_flow(repo, """
        def flow(batch, s: S) -> Answer:
            return batch.answer().set(batch.classify(s.main), "x")
    """)
    with LocalFlow(flow, {"cls_a": logits_of(0)}) as local:
        assert local.is_ready("cls_a") and not local.is_ready("cls_b") and not local.is_ready("gray")
        assert local.classify([RED]).routes[0, 0] == b"cls_a:x"
        assert local.calls == [("cls_a", 1)]
        with pytest.raises(RequestFailed, match="IMAGE\\[0\\]: not a decodable image"):
            local.classify([b"nope"])
    with LocalFlow(flow, {"cls_a": logits_of(0)}, ready=set()) as local:
        with pytest.raises(RequestFailed, match="that call found no READY model; check for None"):
            local.classify([RED])


# ---- a child model that cannot take the call: retried up to child_retry_s ----------------------
class Server:
    """Child models as Triton 2.51 shows them: READY per version, a dead stub still READY
    (each call fails at once, unavailable), and a clock that moves only when the runtime
    pauses, with events (a watchdog's reload) due at given times."""

    def __init__(self, functions: dict, versions: dict[str, tuple[str, ...]] | None = None):
        self.functions = dict(functions)
        self.ready = {(m, v) for m in functions for v in (versions or {}).get(m, ("1",))}
        self.dead: set[str] = set()
        self.now = 0.0
        self.events: list[tuple[float, callable]] = []
        self.calls: list[tuple[str, str, float]] = []  # (model, version, when)

    def is_ready(self, model: str, version: str = "1") -> bool:
        return (model, version) in self.ready

    def versions_of(self, model: str) -> tuple[str, ...]:
        return tuple(sorted({v for m, v in self.ready | {(model, "1")} if m == model}, key=int, reverse=True))

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for due, event in [e for e in self.events if e[0] <= self.now]:
            self.events.remove((due, event))
            event()

    def send(self, requests):
        replies = []
        for r in requests:
            self.calls.append((r.model, r.version, self.now))
            if r.model in self.dead:
                replies.append(ChildCallError(f"Stub process '{r.model}_0_0' is not healthy.", unavailable=True))
            elif (r.model, r.version or "1") not in self.ready:
                replies.append(ChildCallError(f"Request for unknown model: '{r.model}' version {r.version} is not "
                                              "found", unavailable=True))
            else:
                replies.append({r.outputs[0]: self.functions[r.model](next(iter(r.inputs.values())))})
        return replies

    def reload(self, model: str, down_at: float, up_at: float) -> None:
        """The watchdog: unloads the model at down_at, has it back (stub alive) at up_at."""
        self.events += [(down_at, lambda: self.ready.discard((model, "1"))),
                        (up_at, lambda: (self.dead.discard(model), self.ready.add((model, "1"))))]


def served(model_dir: Path, server: Server, **params) -> FlowRuntime:
    rt = FlowRuntime.load(model_dir, {k: str(v) for k, v in params.items()}, server.is_ready)
    return FlowRuntime(rt.name, rt.flow, rt.settings, rt.options, rt.children, server.is_ready,
                       versions_of=server.versions_of, clock=server.clock, sleep=server.sleep)


MAIN_ONLY = """
    def flow(batch, s: S) -> Answer:
        main = batch.classify(s.main)
        if main is None:
            raise NoModelReady
        return batch.answer().set(main, "main")
"""


def test_a_dead_stub_still_ready_is_retried_on_the_next_candidate(repo):
    server = Server(FUNCTIONS)
    server.dead.add("cls_a")
    (result,), _ = served(write_flow(repo, MAIN_ONLY), server).run([ImageRequest([RED])], server.send)
    assert [c[:2] for c in server.calls] == [("cls_a", "1"), ("cls_b", "1")]
    assert result.routes[0, 0] == b"cls_b:main"


def test_a_dead_stub_with_no_other_candidate_is_waited_for_until_the_reload(repo):
    server = Server(FUNCTIONS)
    del server.functions["cls_b"]
    server.ready.discard(("cls_b", "1"))
    server.dead.add("cls_a")
    server.reload("cls_a", down_at=1.0, up_at=4.0)
    rt = served(write_flow(repo, MAIN_ONLY), server)
    (result,), _ = rt.run([ImageRequest([RED])], server.send)
    assert result.routes[0, 0] == b"cls_a:main"
    assert server.calls[-1][0] == "cls_a" and 4.0 <= server.calls[-1][2] < 4.5  # answered once it was back
    assert all(when < 1.0 for _, _, when in server.calls[:-1])  # not called while it was unloaded

    # A request arriving while it is unloaded again, right after another loss, waits for it too.
    server.dead.add("cls_a")
    server.reload("cls_a", down_at=server.now + 0.5, up_at=server.now + 2.0)
    (first,), _ = rt.run([ImageRequest([RED])], server.send)
    server.dead.add("cls_a")
    server.ready.discard(("cls_a", "1"))
    server.reload("cls_a", down_at=server.now, up_at=server.now + 3.0)
    (second,), _ = rt.run([ImageRequest([GREEN])], server.send)  # finds nothing READY: waits
    assert first.routes[0, 0] == second.routes[0, 0] == b"cls_a:main"


def test_a_model_that_does_not_come_back_fails_after_child_retry_s(repo):
    server = Server(FUNCTIONS)
    server.dead |= {"cls_a", "cls_b"}
    flow_runtime = served(write_flow(repo, MAIN_ONLY), server, child_retry_s=3)
    (result,), timings = flow_runtime.run([ImageRequest([RED])], server.send)
    assert (result
            == RequestError("classifier cls_b could not take the call (Stub process 'cls_b_0_0' is not healthy.), and "
                            "no candidate (cls_a, cls_b) answered within child_retry_s=3 s", "main", "UNAVAILABLE"))
    assert 3.0 <= server.now < 3.2  # bounded by the setting
    assert timings.rejected == {("main", "UNAVAILABLE"): 1}


def test_a_call_whose_model_never_came_back_fails_only_its_own_requests(repo):
    flow = write_flow(repo, """
        def flow(batch, s: S) -> Answer:
            first = batch.request_id == "a"
            main = batch.classify(s.main, rows=first)
            other = batch.classify(s.other, rows=~first)
            return batch.answer().set(main, "main").set(other, "other")
    """)
    server = Server(FUNCTIONS)
    server.dead |= {"cls_a", "cls_b"}
    results, timings = served(flow, server, child_retry_s=1).run([ImageRequest([RED], id="a"),
                                                                  ImageRequest([GREEN], id="b")],
                                                                   server.send)
    assert ((results[0].reason, results[0].code) == ("main", "UNAVAILABLE")
            and "within child_retry_s=1 s" in results[0].message)
    assert results[1].routes[0, 0] == b"cls_c:other"
    assert timings.rejected == {("main", "UNAVAILABLE"): 1}


def test_no_retry_and_no_wait_without_a_loss_or_with_child_retry_s_0(repo):
    flow = write_flow(repo, MAIN_ONLY)
    server = Server(FUNCTIONS)
    server.ready.clear()  # never loaded: nothing to wait for
    (result,), _ = served(flow, server).run([ImageRequest([RED])], server.send)
    assert (result.reason, result.code) == ("main", "UNAVAILABLE") and "no classifier is ready" in result.message
    assert server.now == 0.0
    server = Server(FUNCTIONS)
    server.dead |= {"cls_a", "cls_b"}
    (result,), _ = served(flow, server, child_retry_s=0).run([ImageRequest([RED])], server.send)
    assert "within child_retry_s=0 s" in result.message and server.now == 0.0


def test_the_newest_ready_version_answers_and_route_names_it(repo):
    server = Server(FUNCTIONS, versions={"cls_a": ("1", "2")})
    rt = served(write_flow(repo, MAIN_ONLY), server, route_recheck_s=0)
    (v2,), _ = rt.run([ImageRequest([RED])], server.send)
    server.ready.discard(("cls_a", "2"))  # rolled back: version 2 unloaded, the chooser still holds it
    (v1,), _ = rt.run([ImageRequest([RED])], server.send)
    assert (v2.routes[0, 0], v1.routes[0, 0]) == (b"cls_a@2:main", b"cls_a:main")
    assert [c[:2] for c in server.calls] == [("cls_a", "2"), ("cls_a", "1")]


def test_a_child_without_version_folders_beside_the_flow_is_called_unpinned(repo):
    # A repository on S3: Triton copies each model's folder alone, so the flow sees no
    # version folders of its children; it calls them as before pinning, and Triton picks.
    server = Server(FUNCTIONS)
    pinned = served(write_flow(repo, MAIN_ONLY), server)
    rt = FlowRuntime(pinned.name, pinned.flow, pinned.settings, pinned.options, pinned.children, server.is_ready,
                     versions_of=lambda model: (), clock=server.clock, sleep=server.sleep)
    (result,), _ = rt.run([ImageRequest([RED])], server.send)
    assert result.routes[0, 0] == b"cls_a:main"
    assert [c[:2] for c in server.calls] == [("cls_a", "")]
