"""The served smoke test: classify_bls on a real tritonserver answers a photo over HTTP and
gRPC (labels, ROUTE, its JSON), refuses a bad image as the client's fault, and its metrics
are current. `./scripts/test.sh --quick` runs it after the unit tests (BLS_TEST_QUICK=1), on
a repository of its own with EfficientNet-Lite0 alone, the only model it exports; the full
run points it at the session's server instead."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.request

import pytest
from tritonclient.utils import InferenceServerException

from bls_pipeline.serve.client import ClassifyClient

pytestmark = pytest.mark.integration

QUICK = os.environ.get("BLS_TEST_QUICK") == "1"


if QUICK:
    @pytest.fixture(scope="module")
    def smoke_server(tmp_path_factory, repo_root, effnet_onnx_model, place_exports, server_factory):
        repo = tmp_path_factory.mktemp("smoke") / "models"  # every config (the flow reads its candidates'), no engine
        shutil.copytree(repo_root / "models", repo, ignore=shutil.ignore_patterns(
            "*.onnx", "*.onnx.data", "*.onnx.json", "*.plan", "*.xml", "*.bin", "*.xml.json", "__pycache__"))
        place_exports(repo, {"efficientnet_lite0_onnx": effnet_onnx_model})
        server = server_factory(repo, repo.parent, models=("classify_bls",))
        yield server
        server.stop()
else:
    @pytest.fixture(scope="module")
    # requested by name: the full run puts this file with the session server's (tests/conftest.py)
    def smoke_server(server):
        return server


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classify_bls_answers_a_photo_and_refuses_a_bad_image(smoke_server, sample_images, protocol):
    client = ClassifyClient(smoke_server.url(protocol), protocol)
    try:
        out = client.classify([sample_images["mug"]], topk=3)
        with pytest.raises(InferenceServerException) as refused:
            client.classify([b"not an image"])
    finally:
        client.close()
    route = out["ROUTE"][0, 0].decode()
    assert re.fullmatch(r"(efficientnet_lite0_onnx|resnet50_onnx):\w+", route), route
    labels = [label.decode() for label in out["LABELS"][0]]
    assert len(labels) == 3 and all(re.fullmatch(r"\d\.\d+:\d+:.+", label) for label in labels), labels
    document = json.loads(out["JSON"][0, 0])
    assert document["route"] == route and len(document["labels"]) == 3
    if route.startswith("efficientnet_lite0_onnx"):  # its real ImageNet weights
        assert "coffee mug" in document["labels"]
    assert refused.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert "IMAGE[0]" in refused.value.message()


def test_the_metrics_endpoint_is_current(smoke_server, sample_images):
    def images_answered() -> float:
        text = urllib.request.urlopen(smoke_server.metrics_url, timeout=10).read().decode()
        return sum(float(v)
                   for v in re.findall(r'^bls_images_total\{[^}]*model="classify_bls"[^}]*\} (\S+)$', text, re.M))

    time.sleep(1.0)  # what the tests before sent is on the endpoint by now
    before = images_answered()
    client = ClassifyClient(smoke_server.http_url, "http")
    client.classify([sample_images["mug"], sample_images["coffee"]])
    client.close()
    time.sleep(1.0)
    assert images_answered() - before == 2
