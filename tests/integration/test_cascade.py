"""The shipped classify_bls config: cheap classifier with real weights first, unsure images
escalated to resnet50, degraded route when resnet50 is absent."""

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


def test_strict_threshold_escalates_only_the_unsure_images(server, sample_images):
    """cascade_threshold 0.9: the cat photo (~0.4 on efficientnet) goes to resnet50; the
    espresso (~0.96) stays with the cheap model."""
    client = ClassifyClient(server.http_url, "http", model="classify_bls_cascade_strict")
    out = client.classify([sample_images["coffee"], sample_images["chelsea"]], topk=1)
    assert [r.decode() for r in out["ROUTE"][:, 0]] == [f"{CHEAP}:confident", f"{MAIN}:escalated"]
    assert out["CLASS_IDS"][0, 0] == 967


def test_degraded_route_without_resnet50(model_repo, tmp_path, server_factory, sample_images):
    srv = server_factory(model_repo, tmp_path, models=("classify_bls_cascade_strict",),
                         exclude={MAIN: "this test serves without resnet50"})
    try:
        client = ClassifyClient(srv.http_url, "http", model="classify_bls_cascade_strict")
        out = client.classify([sample_images["coffee"], sample_images["chelsea"]], topk=1)
        assert [r.decode() for r in out["ROUTE"][:, 0]] == [f"{CHEAP}:confident", f"{CHEAP}:degraded"]
        assert out["CLASS_IDS"][1, 0] in (281, 282, 285)  # still the cheap model's cat
        client.close()
    finally:
        srv.stop()
