"""classify_bls's flow (models/classify_bls/1/flow.py) run in process by LocalFlow over a
plain-Python classifier: batching, per-request errors, branches, failover."""

from __future__ import annotations

import dataclasses
import io
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bls_pipeline.stages.decode import decode
from bls_pipeline.flow import LocalFlow
from bls_pipeline.stages.postprocess import softmax
from bls_pipeline.stages.preprocess import preprocess_into
from bls_pipeline.runtime.call.batch import ChildCallError
from bls_pipeline.runtime.load.children import child_model
from bls_pipeline.runtime.results import ImageRequest, Prediction, RequestError
from bls_pipeline.base.modelconfig import ModelConfig
from bls_pipeline.runtime.load.settings import RuntimeSettings

MODELS = Path(__file__).resolve().parents[2] / "models"
LABELS = (MODELS / "resnet50_onnx" / "labels.txt").read_text().splitlines()
PRIMARY, SECONDARY = "cls_a", "cls_b"
CHEAP = "cheap"  # the cascade's first stage, with its own normalisation
CHEAP_SPEC = {"preprocess_mean": "0.498,0.498,0.498", "preprocess_std": "0.502,0.502,0.502"}
# Fixed projection from (per-channel mean of the LEFT half of the input) to 1000 logits.
# Left half only, so a horizontal flip changes the answer and the flip branch is visible.
PROJECTION = np.random.default_rng(1234).normal(scale=3.0, size=(3, len(LABELS))).astype(np.float32)
COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 40), (40, 200, 220), (128, 128, 128), (10, 10, 10)]


def logits_for(batch: np.ndarray) -> np.ndarray:
    left = batch[..., : batch.shape[-1] // 2]
    return left.mean(axis=(2, 3)) @ PROJECTION


class Classifier:
    """The child models: records every child call; can fail one model and take it down."""

    def __init__(self, ready: set[str], fail: dict[str, bool] | None = None, logits=logits_for,
                 errors: dict[str, ChildCallError] | None = None):
        self.ready = ready
        self.fail = fail or {}  # model -> does it go un-ready when it fails?
        self.errors = errors or {}  # model -> the error it answers with (staying READY)
        self.logits = logits
        self.calls: list[tuple[str, np.ndarray]] = []

    def __call__(self, model: str, batch: np.ndarray) -> np.ndarray:
        assert batch.dtype == np.float32 and batch.flags.c_contiguous
        self.calls.append((model, batch.copy()))
        if model in self.errors:
            raise self.errors[model]
        if model in self.fail:
            if self.fail[model]:
                self.ready.discard(model)
            raise ChildCallError(f"{model} is unavailable")
        return self.logits(batch)

    def is_ready(self, model: str) -> bool:
        return model in self.ready

    @property
    def batch_sizes(self) -> list[int]:
        return [len(b) for _, b in self.calls]


def png(colour, size=(48, 32)) -> bytes:
    """A small image with a coloured left half and a grey right half (flip-sensitive)."""
    pixels = np.full((size[1], size[0], 3), 90, dtype=np.uint8)
    pixels[:, : size[0] // 2] = colour
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


IMAGES = [png(c) for c in COLOURS]


def _classifier_config(name: str, max_batch: int, params: dict[str, str]) -> str:
    side = int(params.get("preprocess_crop", "224"))
    lines = "\n".join(f'parameters {{ key: "{k}", value: {{ string_value: "{v}" }} }}' for k, v in params.items())
    return textwrap.dedent(f"""\
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch}
        input [ {{ name: "input", data_type: TYPE_FP32, dims: [ 3, {side}, {side} ] }} ]
        output [ {{ name: "output", data_type: TYPE_FP32, dims: [ {len(LABELS)} ], label_filename: "labels.txt" }} ]
        """) + lines + "\n"


def classifier_info(name: str, max_batch: int, params: dict[str, str]):
    """What the runtime reads from such a classifier's config.pbtxt (its preprocessing)."""
    from google.protobuf import text_format

    config = text_format.Parse(_classifier_config(name, max_batch, params), ModelConfig())
    config.output[0].label_filename = ""  # no folder here: the preprocessing is what matters
    return child_model(name, config)


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """classify_bls's settings, as the tests set them (written to its config.pbtxt as strings)."""

    classifiers: tuple[str, ...] = ("resnet50_trt", "resnet50_onnx")
    cascade_classifiers: tuple[str, ...] = ("efficientnet_lite0_trt", "efficientnet_lite0_onnx")
    cascade_threshold: float = 0.5
    tta_threshold: float = 0.25
    default_topk: int = RuntimeSettings.default_topk
    max_request_bytes: int = RuntimeSettings.max_request_bytes
    overload: str = "degrade"  # classify_bls's

    def parameters(self) -> dict[str, str]:
        return {f.name: ",".join(v) if isinstance(v, tuple) else str(v)
                for f in dataclasses.fields(self) for v in [getattr(self, f.name)]} | {
            "cascade_classifiers": ",".join(self.cascade_classifiers) or "none"}


class Pipeline:
    """classify_bls in process, its children the test's Classifier (`run` keeps the old call shape)."""

    def __init__(self, repo: Path, classifier: Classifier, config: PipelineConfig):
        models = {m: (lambda batch, m=m: classifier(m, batch)) for m in (PRIMARY, SECONDARY, CHEAP)}
        self.flow = LocalFlow(repo / "classify_bls", models, ready=classifier.is_ready, parameters=config.parameters())

    def run(self, requests, _classifier=None):
        return self.flow.run(requests)

    def close(self) -> None:
        self.flow.close()


@pytest.fixture
def make_pipeline(tmp_path):
    made: list[Pipeline] = []

    def make(classifier: Classifier, *, max_batch: int = 64, secondary_info=None, **overrides) -> Pipeline:
        repo = tmp_path / f"models{len(made)}"
        shutil.copytree(MODELS / "classify_bls", repo / "classify_bls")
        for name, params in ((PRIMARY, {}), (SECONDARY, secondary_info or {}), (CHEAP, CHEAP_SPEC)):
            (repo / name).mkdir()
            (repo / name / "config.pbtxt").write_text(_classifier_config(name, max_batch, params))
            shutil.copy(MODELS / "resnet50_onnx" / "labels.txt", repo / name / "labels.txt")
        config = dataclasses.replace(PipelineConfig(classifiers=(PRIMARY, SECONDARY), tta_threshold=0.0,
                                                    cascade_classifiers=()),
                                     **overrides)
        pipeline = Pipeline(repo, classifier, config)
        made.append(pipeline)
        return pipeline

    yield make
    for pipeline in made:
        pipeline.close()


def expected_probs(images: list[bytes], preprocess_spec=None) -> np.ndarray:
    """Reference: each image on its own, straight through the stages."""
    spec = preprocess_spec or classifier_info(PRIMARY, 1, {}).preprocess
    batch = np.empty((len(images), *spec.input_shape), dtype=np.float32)
    for row, data in enumerate(images):
        preprocess_into(decode(data), spec, batch[row])
    return softmax(logits_for(batch))


# ---- (a) one Prediction per request, with its own rows and TOPK ----------------------

def test_each_request_gets_its_own_rows_and_topk(make_pipeline):
    classifier = Classifier({PRIMARY, SECONDARY})
    pipeline = make_pipeline(classifier)
    requests = [ImageRequest(IMAGES[0:2]), ImageRequest(IMAGES[2:5], topk=3), ImageRequest(IMAGES[5:6], topk=12)]
    results, timings = pipeline.run(requests, classifier)

    assert len(results) == len(requests)
    assert all(isinstance(r, Prediction) for r in results)
    for result, request, k in zip(results, requests, (5, 3, 12)):  # default_topk is 5
        n = len(request.images)
        assert result.labels.shape == result.scores.shape == result.class_ids.shape == (n, k)
        assert result.routes.shape == (n, 1)
        assert result.routes[:, 0].tolist() == [f"{PRIMARY}:direct".encode()] * n
        assert result.scores.dtype == np.float32 and result.class_ids.dtype == np.int32

    # Rows land in the right request, in order: compare with each image run on its own.
    probs = expected_probs(IMAGES[:6])
    ids = np.concatenate([r.class_ids[:, :3] for r in results])
    assert ids.tolist() == np.argsort(-probs, axis=1, kind="stable")[:, :3].tolist()
    assert np.allclose(np.concatenate([r.scores[:, 0] for r in results]), probs.max(axis=1), atol=1e-5)
    label = results[1].labels[0, 0].decode().split(":")
    assert int(label[1]) == results[1].class_ids[0, 0] and label[2] == LABELS[int(label[1])]
    assert timings.routes == {f"{PRIMARY}:direct": 6}


def test_default_topk_comes_from_config(make_pipeline):
    classifier = Classifier({PRIMARY})
    results, _ = make_pipeline(classifier, default_topk=2).run([ImageRequest(IMAGES[:1])], classifier)
    assert results[0].class_ids.shape == (1, 2)


# ---- (b) a bad image fails only its own request ----------------------------------------

def test_bad_image_fails_only_its_request(make_pipeline):
    classifier = Classifier({PRIMARY})
    pipeline = make_pipeline(classifier)
    requests = [ImageRequest(IMAGES[0:1]), ImageRequest([IMAGES[1], b"<html>nope</html>", IMAGES[2]]),
                ImageRequest(IMAGES[3:4])]
    results, timings = pipeline.run(requests, classifier)

    assert isinstance(results[0], Prediction) and isinstance(results[2], Prediction)
    assert isinstance(results[1], RequestError)
    assert results[1].message.startswith("IMAGE[1]:")
    assert results[1].reason == "unsupported_format"
    assert classifier.batch_sizes == [2]  # the failed request's good images are not classified
    probs = expected_probs([IMAGES[0], IMAGES[3]])
    assert [results[0].class_ids[0, 0], results[2].class_ids[0, 0]] == probs.argmax(axis=1).tolist()
    # One request failed, with its three images: the two good ones fail with it.
    assert timings.rejected_requests == {("unsupported_format", "INVALID_ARGUMENT"): 1}
    assert timings.rejected == {("unsupported_format", "INVALID_ARGUMENT"): 3}


def test_first_bad_image_is_the_one_named(make_pipeline):
    classifier = Classifier({PRIMARY})
    results, _ = make_pipeline(classifier).run([ImageRequest([IMAGES[0], IMAGES[1], b"", b"junk"])], classifier)
    assert results[0].message.startswith("IMAGE[2]:")
    assert results[0].reason == "empty"
    assert classifier.calls == []


# ---- (c) one child call for everything, chunked at max_batch_size ------------------------

def test_all_images_of_all_requests_go_in_one_call(make_pipeline):
    classifier = Classifier({PRIMARY})
    requests = [ImageRequest(IMAGES[0:3]), ImageRequest(IMAGES[3:4]), ImageRequest(IMAGES[4:7])]
    results, _ = make_pipeline(classifier).run(requests, classifier)
    assert classifier.batch_sizes == [7]
    assert [m for m, _ in classifier.calls] == [PRIMARY]
    assert all(isinstance(r, Prediction) for r in results)


def test_calls_are_chunked_at_max_batch_size(make_pipeline):
    classifier = Classifier({PRIMARY})
    requests = [ImageRequest(IMAGES[0:3]), ImageRequest(IMAGES[3:4]), ImageRequest(IMAGES[4:7])]
    results, _ = make_pipeline(classifier, max_batch=3).run(requests, classifier)
    assert classifier.batch_sizes == [3, 3, 1]
    # Chunking does not change the answer.
    probs = expected_probs(IMAGES[:7])
    ids = np.concatenate([r.class_ids[:, 0] for r in results])
    assert ids.tolist() == probs.argmax(axis=1).tolist()


# ---- (d) the low-confidence branch ---------------------------------------------------

def test_threshold_one_sends_every_row_through_the_flip_branch(make_pipeline):
    classifier = Classifier({PRIMARY})
    requests = [ImageRequest(IMAGES[0:2]), ImageRequest(IMAGES[2:3])]
    results, timings = make_pipeline(classifier, tta_threshold=1.0).run(requests, classifier)

    assert classifier.batch_sizes == [3, 3]
    (_, direct), (_, flipped) = classifier.calls
    assert np.array_equal(flipped, direct[..., ::-1])  # horizontal flip of the same batch
    assert not np.allclose(logits_for(direct), logits_for(flipped))  # so the averaging below shows
    routes = np.concatenate([r.routes[:, 0] for r in results]).tolist()
    assert routes == [f"{PRIMARY}:flip_tta".encode()] * 3
    # The answer is the average of both passes' probabilities.
    averaged = (softmax(logits_for(direct)) + softmax(logits_for(flipped))) / 2
    assert np.allclose(np.concatenate([r.scores[:, 0] for r in results]), averaged.max(axis=1), atol=1e-5)
    assert timings.routes == {f"{PRIMARY}:flip_tta": 3}


def test_threshold_zero_goes_direct(make_pipeline):
    classifier = Classifier({PRIMARY})
    results, _ = make_pipeline(classifier, tta_threshold=0.0).run([ImageRequest(IMAGES[0:3])], classifier)
    assert classifier.batch_sizes == [3]
    assert results[0].routes[:, 0].tolist() == [f"{PRIMARY}:direct".encode()] * 3


def test_only_unsure_rows_get_the_second_pass(make_pipeline):
    def logits(batch):  # sure about bright images, unsure about dark ones
        out = np.zeros((len(batch), len(LABELS)), dtype=np.float32)
        out[:, 7] = 50.0 * (batch.mean(axis=(1, 2, 3)) > 0.0)
        return out

    classifier = Classifier({PRIMARY}, logits=logits)
    bright, dark = png((250, 250, 250)), png((0, 0, 0), size=(8, 8))
    results, _ = make_pipeline(classifier, tta_threshold=0.5).run([ImageRequest([bright, dark, bright])], classifier)
    assert classifier.batch_sizes == [3, 1]
    assert np.array_equal(classifier.calls[1][1][0], classifier.calls[0][1][1][..., ::-1])
    assert results[0].routes[:, 0].tolist() == [b"cls_a:direct", b"cls_a:flip_tta", b"cls_a:direct"]


def test_flip_branch_is_chunked_too(make_pipeline):
    classifier = Classifier({PRIMARY})
    make_pipeline(classifier, max_batch=3, tta_threshold=1.0).run([ImageRequest(IMAGES[0:7])], classifier)
    assert classifier.batch_sizes == [3, 3, 1, 3, 3, 1]


# ---- (e) a child call fails ----------------------------------------------------------

def test_failover_to_the_next_ready_classifier(make_pipeline):
    classifier = Classifier({PRIMARY, SECONDARY}, fail={PRIMARY: True})  # cls_a fails and unloads
    secondary = {"preprocess_resize": "160", "preprocess_crop": "128"}
    pipeline = make_pipeline(classifier, secondary_info=secondary)
    requests = [ImageRequest(IMAGES[0:2]), ImageRequest([IMAGES[2], b"junk"]), ImageRequest(IMAGES[3:4], topk=2)]
    results, timings = pipeline.run(requests, classifier)

    assert [m for m, _ in classifier.calls] == [PRIMARY, SECONDARY]
    assert classifier.calls[1][1].shape == (3, 3, 128, 128)  # re-preprocessed for cls_b's own spec
    assert len(results) == 3
    assert isinstance(results[0], Prediction) and isinstance(results[2], Prediction)
    assert results[1].message.startswith("IMAGE[1]:")  # still failed on its own image
    assert results[2].class_ids.shape == (1, 2)
    routes = np.concatenate([results[0].routes[:, 0], results[2].routes[:, 0]]).tolist()
    assert routes == [f"{SECONDARY}:direct".encode()] * 3
    assert timings.routes == {f"{SECONDARY}:direct": 3}
    # The chooser remembers: the next run goes straight to cls_b.
    pipeline.run([ImageRequest(IMAGES[:1])], classifier)
    assert [m for m, _ in classifier.calls][-1] == SECONDARY and len(classifier.calls) == 3


def test_failure_of_a_still_ready_classifier_fails_the_requests(make_pipeline):
    classifier = Classifier({PRIMARY, SECONDARY}, fail={PRIMARY: False})  # fails but stays READY
    requests = [ImageRequest(IMAGES[0:2]), ImageRequest([b"junk"]), ImageRequest(IMAGES[2:3])]
    results, timings = make_pipeline(classifier).run(requests, classifier)

    assert [m for m, _ in classifier.calls] == [PRIMARY]  # no retry elsewhere
    assert len(results) == 3
    for r in (results[0], results[2]):
        assert isinstance(r, RequestError)
        assert (r.reason, r.code) == (PRIMARY, "INTERNAL")  # broken, not busy: the model that failed
        assert PRIMARY in r.message and "is unavailable" in r.message
    assert (results[1].reason, results[1].code) == ("unsupported_format", "INVALID_ARGUMENT")  # its own error is kept
    # images: 2 + 1
    assert timings.rejected == {("unsupported_format", "INVALID_ARGUMENT"): 1, (PRIMARY, "INTERNAL"): 3}
    assert timings.rejected_requests == {("unsupported_format", "INVALID_ARGUMENT"): 1, (PRIMARY, "INTERNAL"): 2}


def test_every_request_is_counted_once_with_every_image_it_carried(make_pipeline):
    """The flow's bls_requests_total and bls_rejected_* (adapter/metrics.py) add up to what the
    clients got: one count per request, by its code; every image of a failed one."""
    from bls_pipeline.adapter.metrics import series

    classifier = Classifier({PRIMARY})
    requests = [ImageRequest(IMAGES[0:2]), ImageRequest([IMAGES[2], b"junk", IMAGES[3]]),
                ImageRequest(IMAGES[4:5], topk=0), ImageRequest([]), ImageRequest(IMAGES[5:6])]
    results, timings = make_pipeline(classifier).run(requests, classifier)
    answered = sum(isinstance(r, Prediction) for r in results)
    counts = series(timings, answered)
    by_code = {key[1][1]: n for key, n in counts.items() if key[0] == "requests"}
    assert by_code == {"OK": 2, "INVALID_ARGUMENT": 3}
    assert sum(n for key, n in counts.items() if key[0] == "rejected") == 3 + 1 + 1  # the empty request counts as one
    failed = [r for r in results if isinstance(r, RequestError)]
    assert sum(n for key, n in counts.items() if key[0] == "rejected_requests") == len(failed)


def test_wrong_output_shape_is_a_classifier_failure(make_pipeline):
    classifier = Classifier({PRIMARY}, logits=lambda batch: np.zeros((len(batch), 10), dtype=np.float32))
    results, _ = make_pipeline(classifier).run([ImageRequest(IMAGES[0:2])], classifier)
    assert isinstance(results[0], RequestError)
    assert (results[0].reason, results[0].code) == (PRIMARY, "INTERNAL")
    assert "(2, 10)" in results[0].message and "(2, 1000)" in results[0].message


def test_wrong_output_dtype_is_a_broken_classifier(make_pipeline):
    classifier = Classifier({PRIMARY}, logits=lambda batch: np.zeros((len(batch), 1000), dtype=np.float64))
    results, _ = make_pipeline(classifier).run([ImageRequest(IMAGES[0:2])], classifier)
    assert (results[0].reason, results[0].code) == (PRIMARY, "INTERNAL")
    assert f"{PRIMARY} returned output as FP64; its config.pbtxt declares TYPE_FP32" in results[0].message


def test_a_child_refusing_for_overload_is_unavailable_not_broken(make_pipeline):
    classifier = Classifier({PRIMARY}, errors={PRIMARY: ChildCallError("Exceeds maximum queue size", busy=True)})
    results, timings = make_pipeline(classifier).run([ImageRequest(IMAGES[0:2])], classifier)
    assert (results[0].reason, results[0].code) == ("classifiers", "UNAVAILABLE")
    assert "Exceeds maximum queue size" in results[0].message
    assert [m for m, _ in classifier.calls] == [PRIMARY]  # not sent again
    assert timings.rejected == {("classifiers", "UNAVAILABLE"): 2}


def test_failover_when_every_classifier_goes_away(make_pipeline):
    classifier = Classifier({PRIMARY, SECONDARY}, fail={PRIMARY: True, SECONDARY: True})
    results, _ = make_pipeline(classifier).run([ImageRequest(IMAGES[0:1]), ImageRequest(IMAGES[1:2])], classifier)
    assert [m for m, _ in classifier.calls] == [PRIMARY, SECONDARY]
    assert all(isinstance(r, RequestError) and (r.reason, r.code) == ("classifiers", "UNAVAILABLE") for r in results)
    assert "no classifier is ready" in results[0].message


# ---- (f) nothing ready ---------------------------------------------------------------

def test_no_classifier_ready_fails_every_request(make_pipeline):
    classifier = Classifier(set())
    requests = [ImageRequest(IMAGES[0:1]), ImageRequest(IMAGES[1:3], topk=2)]
    results, timings = make_pipeline(classifier).run(requests, classifier)
    assert classifier.calls == []
    assert len(results) == 2
    for r in results:
        assert isinstance(r, RequestError)
        assert (r.reason, r.code) == ("classifiers", "UNAVAILABLE")  # the role none was READY for
        assert PRIMARY in r.message and SECONDARY in r.message
    assert timings.rejected == {("classifiers", "UNAVAILABLE"): 3}  # counted in images: 1 + 2


# ---- (g) bad requests ----------------------------------------------------------------

@pytest.mark.parametrize("topk", [0, -3, len(LABELS) + 1])
def test_topk_out_of_range_fails_that_request_only(make_pipeline, topk):
    classifier = Classifier({PRIMARY})
    requests = [ImageRequest(IMAGES[0:1]), ImageRequest(IMAGES[1:2], topk=topk),
                ImageRequest(IMAGES[2:3], topk=len(LABELS))]
    results, _ = make_pipeline(classifier).run(requests, classifier)
    assert isinstance(results[1], RequestError)
    assert results[1].reason == "bad_request"
    assert f"TOPK={topk}" in results[1].message and "1..1000" in results[1].message
    assert results[0].class_ids.shape == (1, 5)
    assert results[2].class_ids.shape == (1, len(LABELS))
    assert classifier.batch_sizes == [2]


def test_empty_image_list_fails_that_request_only(make_pipeline):
    classifier = Classifier({PRIMARY})
    results, _ = make_pipeline(classifier).run([ImageRequest([]), ImageRequest(IMAGES[0:1])], classifier)
    assert isinstance(results[0], RequestError)
    assert results[0].reason == "bad_request"
    assert "IMAGE is empty" in results[0].message
    assert isinstance(results[1], Prediction)


def test_request_over_byte_limit_fails_that_request_only(make_pipeline):
    classifier = Classifier({PRIMARY})
    limit = len(IMAGES[0]) + len(IMAGES[1])
    requests = [ImageRequest(IMAGES[0:2]), ImageRequest(IMAGES[0:3])]
    results, _ = make_pipeline(classifier, max_request_bytes=limit).run(requests, classifier)
    assert isinstance(results[0], Prediction)
    assert isinstance(results[1], RequestError) and results[1].reason == "too_large"


def test_no_valid_request_means_no_child_call(make_pipeline):
    classifier = Classifier({PRIMARY})
    results, _ = make_pipeline(classifier).run([ImageRequest([]), ImageRequest([b"junk"])], classifier)
    assert [r.reason for r in results] == ["bad_request", "unsupported_format"]
    assert classifier.calls == []


@pytest.mark.parametrize("fail", [None, {PRIMARY: False}], ids=["answered", "classifier-fails"])
def test_a_run_leaves_no_reference_cycles(make_pipeline, fail):
    """Cycles (an exception's traceback reaching the batch) keep whole batches alive until
    the garbage collector runs: a stub's memory then wanders with bad traffic."""
    import gc

    classifier = Classifier({PRIMARY}, fail=fail)
    pipeline = make_pipeline(classifier, classifiers=(PRIMARY,))
    requests = [ImageRequest(IMAGES[:2]), ImageRequest([b"<html>", IMAGES[2]]), ImageRequest([png(COLOURS[0])[:60]]),
                ImageRequest([]), ImageRequest(IMAGES[3:4], topk=0)]
    pipeline.run(requests, classifier)  # warm: first-use caches of Pillow's plugins
    gc.collect()
    gc.disable()
    try:
        results, _ = pipeline.run(requests, classifier)
        assert {type(r) for r in results} == ({Prediction, RequestError} if fail is None else {RequestError})
        del results
        assert gc.collect() == 0
    finally:
        gc.enable()


# ---- cascade --------------------------------------------------------------------------------
def _cheap_logits(confident_rows: set[int]):
    """Cheap model: very sure (one-hot-ish) on the listed rows, flat elsewhere."""
    def logits(batch: np.ndarray) -> np.ndarray:
        out = np.zeros((len(batch), len(LABELS)), np.float32)
        for i in range(len(batch)):
            if i in confident_rows:
                out[i, 7] = 50.0
        return out
    return logits


class CascadeClassifier(Classifier):
    def __init__(self, ready, confident_rows):
        super().__init__(ready)
        self._cheap = _cheap_logits(confident_rows)

    def __call__(self, model, batch):
        if model == CHEAP and model not in self.fail:
            self.calls.append((model, batch.copy()))
            return self._cheap(batch)
        return super().__call__(model, batch)


def test_cascade_escalates_only_unsure_images_in_one_call(make_pipeline):
    clf = CascadeClassifier({CHEAP, PRIMARY}, confident_rows={0, 2})
    pipe = make_pipeline(clf, cascade_classifiers=(CHEAP,), cascade_threshold=0.5)
    results, timings = pipe.run([ImageRequest(IMAGES[:2]), ImageRequest(IMAGES[2:4])], clf)
    assert [m for m, _ in clf.calls] == [CHEAP, PRIMARY]
    assert clf.batch_sizes == [4, 2]  # rows 1 and 3 escalated together
    routes = [r.routes[:, 0].tolist() for r in results]
    assert routes == [[b"cheap:confident", b"cls_a:escalated"], [b"cheap:confident", b"cls_a:escalated"]]
    assert results[0].class_ids[0, 0] == 7  # the cheap model decided the confident one
    expected = softmax(logits_for(clf.calls[1][1]))
    np.testing.assert_allclose(results[0].scores[1], np.sort(expected[0])[::-1][:5], rtol=1e-5)
    assert timings.routes == {"cheap:confident": 2, "cls_a:escalated": 2}


def test_cascade_feeds_each_model_its_own_normalisation(make_pipeline):
    clf = CascadeClassifier({CHEAP, PRIMARY}, confident_rows=set())
    pipe = make_pipeline(clf, cascade_classifiers=(CHEAP,), cascade_threshold=0.5)
    pipe.run([ImageRequest([IMAGES[0]])], clf)
    (_, cheap_batch), (_, main_batch) = clf.calls
    img = decode(IMAGES[0])
    for spec, got in ((classifier_info(CHEAP, 1, CHEAP_SPEC).preprocess, cheap_batch[0]),
                      (classifier_info(PRIMARY, 1, {}).preprocess, main_batch[0])):
        want = np.empty(spec.input_shape, np.float32)
        preprocess_into(img, spec, want)
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_cascade_degrades_to_the_cheap_model_when_no_main_model_is_ready(make_pipeline):
    clf = CascadeClassifier({CHEAP}, confident_rows={0})
    pipe = make_pipeline(clf, cascade_classifiers=(CHEAP,), cascade_threshold=0.5)
    (result,), _ = pipe.run([ImageRequest(IMAGES[:2])], clf)
    assert result.routes[:, 0].tolist() == [b"cheap:confident", b"cheap:degraded"]
    assert [m for m, _ in clf.calls] == [CHEAP]


def test_cascade_model_missing_falls_back_to_the_main_path(make_pipeline):
    clf = Classifier({PRIMARY})
    pipe = make_pipeline(clf, cascade_classifiers=(CHEAP,), cascade_threshold=0.5)
    (result,), _ = pipe.run([ImageRequest(IMAGES[:1])], clf)
    assert result.routes[0, 0] == b"cls_a:direct"


def test_cascade_threshold_zero_never_escalates(make_pipeline):
    clf = CascadeClassifier({CHEAP, PRIMARY}, confident_rows=set())
    pipe = make_pipeline(clf, cascade_classifiers=(CHEAP,), cascade_threshold=0.0)
    (result,), _ = pipe.run([ImageRequest(IMAGES[:3])], clf)
    assert result.routes[:, 0].tolist() == [b"cheap:confident"] * 3
    assert [m for m, _ in clf.calls] == [CHEAP]


# ---- a child's failure fails only the requests that needed it -------------------------------
@pytest.mark.parametrize("breaks,code,reason,says", [
    (dict(logits=lambda batch: np.zeros((len(batch), 10), np.float32)), "INTERNAL", PRIMARY, "(1, 10)"),  # wrong shape
    # wrong dtype
    (dict(logits=lambda batch: np.zeros((len(batch), 1000), np.float64)), "INTERNAL", PRIMARY, "as FP64"),
    (dict(errors={PRIMARY: ChildCallError("CUDA error: an illegal memory access")}), "INTERNAL", PRIMARY,
     "illegal memory"),
    (dict(errors={PRIMARY: ChildCallError("Exceeds maximum queue size", busy=True)}), "UNAVAILABLE", "classifiers",
     "Exceeds maximum queue size"),
])
def test_a_failed_escalation_fails_only_the_requests_escalated(make_pipeline, breaks, code, reason, says):
    """Three requests in one execute(); only the second's image is unsure and goes to the main
    classifier, which fails: the second fails with its error, the others keep the cheap answer.
    With overload "refuse" (degrading, the default, answers a busy one: the next test)."""
    clf = CascadeClassifier({CHEAP, PRIMARY}, confident_rows={0, 2})
    clf.logits, clf.errors = breaks.get("logits", clf.logits), breaks.get("errors", {})
    pipe = make_pipeline(clf, cascade_classifiers=(CHEAP,), cascade_threshold=0.5, overload="refuse")
    results, timings = pipe.run([ImageRequest(IMAGES[0:1]), ImageRequest(IMAGES[1:2]), ImageRequest(IMAGES[2:3])], clf)
    assert [m for m, _ in clf.calls] == [CHEAP, PRIMARY] and clf.batch_sizes == [3, 1]
    assert [r.routes[:, 0].tolist() for r in (results[0], results[2])] == [[b"cheap:confident"]] * 2
    failed = results[1]
    assert isinstance(failed, RequestError) and (failed.reason, failed.code) == (reason, code)
    assert says in failed.message and PRIMARY in failed.message
    assert timings.rejected == {(reason, code): 1} and timings.routes == {"cheap:confident": 2}


def test_an_escalation_the_main_classifier_refuses_for_overload_keeps_the_cheap_answer_marked_degraded(make_pipeline):
    clf = CascadeClassifier({CHEAP, PRIMARY}, confident_rows={0, 2})
    clf.errors = {PRIMARY: ChildCallError("Exceeds maximum queue size", busy=True)}
    pipe = make_pipeline(clf, cascade_classifiers=(CHEAP,), cascade_threshold=0.5)
    results, timings = pipe.run([ImageRequest(IMAGES[0:1]), ImageRequest(IMAGES[1:2]), ImageRequest(IMAGES[2:3])], clf)
    assert [r.routes[0, 0] for r in results] == [b"cheap:confident", b"cheap:degraded", b"cheap:confident"]
    assert results[1].notes == ({"degraded": "overloaded: classifier cls_a failed: Exceeds maximum queue size"},)
    assert timings.degraded == {(PRIMARY, "busy"): 1} and timings.rejected == {}
    assert '"degraded":"overloaded: classifier cls_a failed: Exceeds maximum queue size"' in \
        results[1].outputs["JSON"][0, 0].decode()
    clf.errors = {PRIMARY: ChildCallError("CUDA error: an illegal memory access")}  # broken, not busy: no degrading
    results, _ = pipe.run([ImageRequest(IMAGES[0:2])], clf)  # its second image is unsure
    assert isinstance(results[0], RequestError) and results[0].code == "INTERNAL"


def test_a_request_with_rows_on_both_sides_of_a_failed_call_fails_whole(make_pipeline):
    """A request is answered whole or not at all: one escalated image in a failed call fails it."""
    clf = CascadeClassifier({CHEAP, PRIMARY}, confident_rows={0, 2})
    clf.errors = {PRIMARY: ChildCallError("broken")}
    pipe = make_pipeline(clf, cascade_classifiers=(CHEAP,), cascade_threshold=0.5)
    results, timings = pipe.run([ImageRequest(IMAGES[0:2]), ImageRequest(IMAGES[2:3])], clf)
    assert (results[0].reason, results[0].code) == (PRIMARY, "INTERNAL")
    assert results[1].routes[:, 0].tolist() == [b"cheap:confident"]
    assert timings.rejected == {(PRIMARY, "INTERNAL"): 2}  # both its images


def test_a_failed_call_fails_its_skip_cascade_and_escalated_requests_alike(make_pipeline):
    """A skip_cascade request's image joins the escalated ones in the main classifier's call:
    when that call fails, both fail; the confident request is answered, and no fallback runs
    (the call came back, on no rows: nothing is left to degrade)."""
    clf = CascadeClassifier({CHEAP, PRIMARY}, confident_rows={0})
    clf.errors = {PRIMARY: ChildCallError("broken")}
    pipe = make_pipeline(clf, cascade_classifiers=(CHEAP,), cascade_threshold=0.5)
    requests = [ImageRequest(IMAGES[0:1]), ImageRequest(IMAGES[1:2], parameters={"skip_cascade": True}),
                ImageRequest(IMAGES[2:3])]
    results, _ = pipe.run(requests, clf)
    assert [m for m, _ in clf.calls] == [CHEAP, PRIMARY] and clf.batch_sizes == [2, 2]
    assert isinstance(results[0], Prediction) and results[0].routes[0, 0] == b"cheap:confident"
    assert [(r.reason, r.code) for r in results[1:]] == [(PRIMARY, "INTERNAL")] * 2
