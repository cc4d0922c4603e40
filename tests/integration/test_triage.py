"""triage_bls on a real tritonserver: early exit for unusable photos, a concurrent vote of
two classifiers for the rest, over HTTP and gRPC."""

from __future__ import annotations

import numpy as np
import pytest

from bls_pipeline.serve.client import ClassifyClient
from bls_pipeline.stages.decode import decode
from bls_pipeline.stages.postprocess import softmax
from bls_pipeline.stages.preprocess import preprocess_into
from bls_pipeline.runtime.load.children import load_child

pytestmark = pytest.mark.integration
MODEL = "triage_bls"
VOTE = "efficientnet_lite0_onnx+resnet50_onnx"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unusable_photos_end_early_the_rest_are_voted_on(server, protocol, sample_images, repo_root):
    night, blank = ((repo_root / "samples" / f"{n}.png").read_bytes() for n in ("night", "blank"))
    client = ClassifyClient(server.url(protocol), protocol, model=MODEL)
    try:
        out = client.classify([sample_images["mug"], night, sample_images["coffee"], blank], topk=2)
    finally:
        client.close()
    routes = [r.decode() for r in out["ROUTE"][:, 0]]
    assert routes[1] == "image_quality:too_dark" and routes[3] == "image_quality:blank"
    assert out["LABELS"][[1, 3]].tolist() == [[b"", b""], [b"", b""]] and (out["CLASS_IDS"][[1, 3]] == -1).all()
    assert routes[0].startswith(f"{VOTE}:") and routes[2].startswith(f"{VOTE}:")
    # The vote averages a real classifier with a random one: no class gets more than half.
    assert (out["SCORES"][[0, 2], 0] <= 0.5 + 1e-6).all() and (np.diff(out["SCORES"][[0, 2]], axis=1) <= 0).all()


def _child_probs(server, model_repo, model: str, images: list[bytes]) -> np.ndarray:
    """`model` called directly over gRPC on the pixels its own config asks for: probabilities."""
    import tritonclient.grpc as tc

    child = load_child(model_repo, model)
    batch = np.empty((len(images), *child.preprocess.input_shape), np.float32)
    for i, data in enumerate(images):
        preprocess_into(decode(data), child.preprocess, batch[i])
    client = tc.InferenceServerClient(server.grpc_url)
    try:
        tensor = tc.InferInput(child.input.name, list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch)
        result = client.infer(model, [tensor], outputs=[tc.InferRequestedOutput(child.scores_output.name)])
    finally:
        client.close()
    return softmax(result.as_numpy(child.scores_output.name))


def test_the_vote_is_the_average_of_both_classifiers(server, model_repo, sample_images):
    images = [sample_images["mug"], sample_images["chelsea"]]
    expected = np.mean([_child_probs(server, model_repo, m, images)
                        for m in ("efficientnet_lite0_onnx", "resnet50_onnx")], axis=0)
    client = ClassifyClient(server.grpc_url, "grpc", model=MODEL)
    try:
        vote = client.classify(images, topk=5)
    finally:
        client.close()
    np.testing.assert_array_equal(vote["CLASS_IDS"], np.argsort(-expected, axis=1, kind="stable")[:, :5])
    np.testing.assert_allclose(vote["SCORES"], -np.sort(-expected, axis=1)[:, :5], atol=1e-5)
