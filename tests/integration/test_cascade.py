"""The shipped classify_bls config: cheap classifier with real weights first, unsure images
escalated to resnet50, degraded route when the main classifier is absent."""

from __future__ import annotations

import pytest

from bls_pipeline.serve.client import ClassifyClient

pytestmark = pytest.mark.integration
CHEAP, MAIN = "efficientnet_lite0_onnx", "resnet50_onnx"
GOLDEN = {"mug": 504, "coffee": 967, "camera": 872}  # coffee mug, espresso, tripod


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_golden_labels_through_classify_bls(server, sample_images, protocol):
    client = ClassifyClient(server.url(protocol), protocol)
    names = list(GOLDEN)
    out = client.classify([sample_images[n] for n in names], topk=1)
    assert out["CLASS_IDS"][:, 0].tolist() == [GOLDEN[n] for n in names]
    assert out["LABELS"][0, 0].decode().endswith(":504:coffee mug")
    assert [r.decode() for r in out["ROUTE"][:, 0]] == [f"{CHEAP}:confident"] * 3  # all above the 0.5 threshold


def test_full_size_mug_is_a_coffee_mug(server, shared_mug):
    out = ClassifyClient(server.grpc_url, "grpc").classify([shared_mug], topk=1)
    assert out["LABELS"][0, 0].decode().endswith(":504:coffee mug")


def test_the_cascade_escalates_only_the_unsure_images(server, sample_images):
    """The espresso (~0.95 on efficientnet) stays with the cheap model; the cat photo (~0.4,
    under cascade_threshold 0.5) goes to resnet50. The request's 30 s deadline is what the flow
    aims at: on a busy machine resnet50 may answer after the 400 ms aim of a request without one
    (and the cat then comes back degraded: test_admission_served.py)."""
    client = ClassifyClient(server.http_url, "http", model="classify_bls_cascade_05")
    try:
        out = client.classify([sample_images["coffee"], sample_images["chelsea"]], topk=1, timeout_s=30)
    finally:
        client.close()
    assert [r.decode() for r in out["ROUTE"][:, 0]] == [f"{CHEAP}:confident", f"{MAIN}:escalated"]
    assert out["CLASS_IDS"][0, 0] == 967


def test_degraded_route_without_the_main_classifier(server, sample_images):
    """classify_bls_degraded's main classifier (resnet50_trt) never loads in the test
    repository: the unsure image keeps the cheap model's answer."""
    assert "resnet50_trt" in server.skipped
    client = ClassifyClient(server.http_url, "http", model="classify_bls_degraded")
    try:
        out = client.classify([sample_images["coffee"], sample_images["chelsea"]], topk=1)
    finally:
        client.close()
    assert [r.decode() for r in out["ROUTE"][:, 0]] == [f"{CHEAP}:confident", f"{CHEAP}:degraded"]
    assert out["CLASS_IDS"][1, 0] in (281, 282, 285)  # still the cheap model's cat
