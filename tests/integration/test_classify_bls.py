"""classify_bls on a real tritonserver, over HTTP and gRPC, checked against onnxruntime."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from tritonclient.utils import InferenceServerException

from bls_pipeline.serve.client import ClassifyClient
from bls_pipeline.stages.decode import DecodePolicy, decode
from bls_pipeline.stages.postprocess import softmax, top_k
from bls_pipeline.stages.preprocess import PreprocessSpec, preprocess_into
from bls_pipeline.runtime.load.children import load_child

pytestmark = pytest.mark.integration
PROTOCOLS = ("http", "grpc")
RESNET_ONLY = "classify_bls_resnet50"  # classify_bls's code with the cascade off
ONE_INSTANCE = "classify_bls_one_instance"  # resnet50 alone, no flip pass, one instance


def imagenet_labels() -> tuple[str, ...]:
    """The label file resnet50_onnx's config.pbtxt names."""
    return load_child(Path(__file__).resolve().parents[2] / "models", "resnet50_onnx").labels


def _client(server, protocol: str, model: str = RESNET_ONLY, **kw) -> ClassifyClient:
    return ClassifyClient(server.url(protocol), protocol, model=model, **kw)


@pytest.fixture(scope="module")
def reference(onnx_model):
    """The same ONNX run directly in onnxruntime on the same preprocessed batch."""
    session = ort.InferenceSession(str(onnx_model), providers=["CPUExecutionProvider"])
    spec = PreprocessSpec()

    def probs(images: list[bytes], flip: bool = False) -> np.ndarray:
        batch = np.empty((len(images), 3, 224, 224), np.float32)
        for i, data in enumerate(images):
            preprocess_into(decode(data, DecodePolicy()), spec, batch[i])
        if flip:
            batch = np.ascontiguousarray(batch[..., ::-1])
        return softmax(session.run(["output"], {"input": batch})[0])

    return probs


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_topk_matches_onnxruntime(server, protocol, sample_images, reference):
    images = list(sample_images.values())
    client = _client(server, protocol)
    out = client.classify(images, topk=5)
    expected = top_k(reference(images), 5, list(imagenet_labels()))
    np.testing.assert_array_equal(out["CLASS_IDS"], expected.class_ids)
    np.testing.assert_allclose(out["SCORES"], expected.scores, atol=1e-4)
    assert out["LABELS"].shape == (len(images), 5)
    score, index, label = out["LABELS"][0, 0].decode().split(":", 2)
    assert int(index) == expected.class_ids[0, 0] and label == imagenet_labels()[int(index)]
    assert abs(float(score) - expected.scores[0, 0]) < 1e-4
    # resnet50_trt is absent (no TensorRT backend here): the ONNX classifier answered.
    assert [r.decode() for r in out["ROUTE"][:, 0]] == ["resnet50_onnx:direct"] * len(images)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_full_size_mug_photo(server, protocol, shared_mug, reference):
    out = _client(server, protocol).classify([shared_mug], topk=3)
    assert out["LABELS"].shape == (1, 3)
    assert out["CLASS_IDS"][0, 0] == int(np.argmax(reference([shared_mug])[0]))


@pytest.mark.parametrize("topk", [1, 3, 10])
def test_topk_input(server, sample_images, topk):
    out = _client(server, "http").classify([sample_images["mug"]], topk=topk)
    assert out["LABELS"].shape == out["SCORES"].shape == out["CLASS_IDS"].shape == (1, topk)
    assert np.all(np.diff(out["SCORES"][0]) <= 0), "scores must be sorted best first"


def test_default_topk_from_config(server, sample_images):
    out = _client(server, "grpc").classify([sample_images["mug"]])
    assert out["LABELS"].shape == (1, 5)


@pytest.mark.parametrize("topk", [0, 1001])
def test_topk_out_of_range_is_rejected(server, sample_images, topk):
    with pytest.raises(InferenceServerException, match=f"TOPK={topk} is out of range"):
        _client(server, "http").classify([sample_images["mug"]], topk=topk)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_good_and_bad_requests_in_one_batch(server, protocol, sample_images):
    """Concurrent requests share dynamic batches; each bad one fails alone, with its reason."""
    good, bad = sample_images["coffee"], b"<html><body>not an image</body></html>"
    payloads = [[good], [good, bad], [good], [bad], [good, good]] * 3

    def send(images):
        client = _client(server, protocol)  # one client per request: tritonclient.http's is not thread-safe
        try:
            return client.classify(images, topk=2)
        except InferenceServerException as exc:
            return exc
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, payloads))
    for images, res in zip(payloads, results):
        if bad in images:
            assert isinstance(res, InferenceServerException)
            assert (res.message()
                    == f"IMAGE[{images.index(bad)}]: not a decodable image (allowed formats: JPEG, PNG, WEBP, BMP, "
                       "GIF, TIFF)")
        else:
            assert not isinstance(res, Exception), res
            assert res["CLASS_IDS"].shape == (len(images), 2)


def _settled_counts(server, *models: str) -> list[tuple[int, int]]:
    """_counts of each model once they stop moving: Triton counts a request when it releases
    it, just after its response, so the last requests of the test before may still land."""
    counts, deadline = [_counts(server, m) for m in models], time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.3)
        again = [_counts(server, m) for m in models]
        if again == counts:
            break
        counts = again
    return counts


def _counts(server, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) of `model`: images and execute() calls (statistics API)."""
    import tritonclient.http as tc

    client = tc.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()
    return int(stats["inference_count"]), int(stats["execution_count"])


def test_one_batched_child_call_per_execute(server, sample_images):
    """N concurrent one-image requests through the real server: Triton batches them into fewer
    execute() calls, and each execute() asks the classifier once for all its images, so the
    classifier runs as often as the flow, fewer times than there were requests."""
    n = 16
    images = [list(sample_images.values())[i % len(sample_images)] for i in range(n)]
    flow_before, classifier_before = _settled_counts(server, ONE_INSTANCE, "resnet50_onnx")
    start = threading.Barrier(n)

    def send(image):
        client = ClassifyClient(server.grpc_url, "grpc", model=ONE_INSTANCE)
        try:
            start.wait()
            return client.classify([image], topk=1)["ROUTE"][0, 0]
        finally:
            client.close()

    with ThreadPoolExecutor(n) as pool:
        routes = list(pool.map(send, images))
    assert routes == [b"resnet50_onnx:direct"] * n
    deadline = time.monotonic() + 10  # the statistics land just after the responses
    while True:
        flow = np.subtract(_counts(server, ONE_INSTANCE), flow_before)
        classifier = np.subtract(_counts(server, "resnet50_onnx"), classifier_before)
        if (flow[0] == classifier[0] == n) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    (flow_images, flow_executions), (classifier_images, classifier_executions) = flow, classifier
    assert (flow_images, classifier_images) == (n, n)
    assert (1 <= flow_executions < n), (f"{n} requests, {flow_executions} executions of {ONE_INSTANCE}: Triton did not "
                                        "batch them")
    assert classifier_executions == flow_executions, (
        f"{flow_executions} execute() calls of {ONE_INSTANCE} made {classifier_executions} classifier executions")


def test_low_confidence_branch_averages_flip(server, sample_images, reference):
    """classify_bls_tta has tta_threshold 1.0: every image gets the flipped second pass."""
    images = [sample_images["mug"], sample_images["chelsea"]]
    client = ClassifyClient(server.http_url, "http", model="classify_bls_tta")
    out = client.classify(images, topk=3)
    assert [r.decode() for r in out["ROUTE"][:, 0]] == ["resnet50_onnx:flip_tta"] * 2
    averaged = (reference(images) + reference(images, flip=True)) / 2
    expected = top_k(averaged, 3, list(imagenet_labels()))
    np.testing.assert_array_equal(out["CLASS_IDS"], expected.class_ids)
    np.testing.assert_allclose(out["SCORES"], expected.scores, atol=1e-4)


def test_multi_image_request_keeps_order(server, sample_images, reference):
    images = [sample_images["camera"], sample_images["mug"], sample_images["camera"]]
    out = _client(server, "grpc").classify(images, topk=1)
    expected = reference(images).argmax(axis=1)
    np.testing.assert_array_equal(out["CLASS_IDS"][:, 0], expected)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ensemble_baseline_gives_the_same_labels(server, protocol, sample_images):
    """ensemble_resnet50 (no branches) answers like classify_bls on the same images: the same
    classes in the same order, the same scores but for batch-size numerics."""
    images = list(sample_images.values())
    bls = _client(server, protocol).classify(images)
    ensemble = ClassifyClient(server.url(protocol), protocol, model="ensemble_resnet50")
    outputs = [ensemble._client.infer("ensemble_resnet50", [_image_input(ensemble, [img])]) for img in images]
    ids, scores = (np.concatenate([o.as_numpy(name) for o in outputs]) for name in ("CLASS_IDS", "SCORES"))
    np.testing.assert_array_equal(ids, bls["CLASS_IDS"])
    np.testing.assert_allclose(scores, bls["SCORES"], atol=1e-5)
    names = np.vectorize(lambda label: label.decode().split(":", 1)[1])  # "score:index:label" less the score
    np.testing.assert_array_equal(names(np.concatenate([o.as_numpy("LABELS") for o in outputs])), names(bls["LABELS"]))


def _image_input(client, images):
    tensor = client._tc.InferInput("IMAGE", [len(images), 1], "BYTES")
    tensor.set_data_from_numpy(np.array(images, dtype=object).reshape(-1, 1))
    return tensor


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_only_the_requested_outputs_come_back(server, protocol, sample_images):
    client = _client(server, protocol)
    image = _image_input(client, [sample_images["mug"]])
    try:
        some = client._client.infer(RESNET_ONLY, [image], outputs=[client._tc.InferRequestedOutput("ROUTE")])
        every = client._client.infer(RESNET_ONLY, [image])  # none named: all of them
    finally:
        client.close()
    def present(result) -> set[str]:
        return {n for n in ("LABELS", "SCORES", "CLASS_IDS", "ROUTE") if result.as_numpy(n) is not None}

    assert present(some) == {"ROUTE"} and some.as_numpy("ROUTE")[0, 0] == b"resnet50_onnx:direct"
    assert present(every) == {"LABELS", "SCORES", "CLASS_IDS", "ROUTE"}
