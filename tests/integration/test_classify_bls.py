"""classify_bls on a real tritonserver, over HTTP and gRPC, checked against onnxruntime."""

from __future__ import annotations

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
from bls_pipeline.runtime.children import load_child

pytestmark = pytest.mark.integration
PROTOCOLS = ("http", "grpc")
RESNET_ONLY = "classify_bls_resnet50"  # classify_bls's code with the cascade off


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
    client = _client(server, protocol, concurrency=8)

    def send(images):
        try:
            return client.classify(images, topk=2)
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, payloads))
    for images, res in zip(payloads, results):
        if bad in images:
            assert isinstance(res, InferenceServerException)
            assert f"IMAGE[{images.index(bad)}]: not a decodable image" in res.message()
            assert "Traceback" not in res.message() and "/" not in res.message().split(":", 1)[1]
        else:
            assert not isinstance(res, Exception), res
            assert res["CLASS_IDS"].shape == (len(images), 2)


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
    """ensemble_resnet50 (no branches) answers exactly like classify_bls on the same images."""
    images = list(sample_images.values())
    bls = _client(server, protocol).classify(images)
    ensemble = ClassifyClient(server.url(protocol), protocol, model="ensemble_resnet50")
    outputs = [ensemble._client.infer("ensemble_resnet50", [_image_input(ensemble, [img])]) for img in images]
    labels = np.concatenate([o.as_numpy("LABELS") for o in outputs])
    np.testing.assert_array_equal(labels, bls["LABELS"])


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
    present = lambda result: {n for n in ("LABELS", "SCORES", "CLASS_IDS", "ROUTE") if result.as_numpy(n) is not None}  # noqa: E731
    assert present(some) == {"ROUTE"} and some.as_numpy("ROUTE")[0, 0] == b"resnet50_onnx:direct"
    assert present(every) == {"LABELS", "SCORES", "CLASS_IDS", "ROUTE"}
