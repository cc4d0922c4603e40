"""Flows follow their children (issue 42), on a real bls-serve, with no load of the flow:

- a flow that loaded while its child was broken (config dims [3,200,200] where the model
  takes 224) kept calling it 200x200 after the child was fixed and loaded: 500 `Expected
  [-1,3,224,224], got [1,3,200,200]` until the flow itself was loaded again;
- a flow that failed its load because of its child's config (an output of 999 classes for
  1000 labels) stayed failed after the child was fixed and loaded;
- a child loaded again with a smaller max_batch_size (a config sent with the load, as Model
  Analyzer's composing-model search does) refused the flow's old batch: `inference request
  batch-size must be <= 1`.

This walks the operator's procedure of docs/reliability.md ("A model that fails its load"):
fix the child's config.pbtxt, load the child; nothing else.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from google.protobuf import text_format

from bls_pipeline.base.modelconfig import ModelConfig, config_variant, parse_config
from bls_pipeline.serve.options import ServerOptions, free_port
from bls_pipeline.serve.server import TritonServer

from polling import eventually

pytestmark = pytest.mark.integration

CHILD = "efficientnet_lite0_onnx"


def _child(repo: Path, name: str, break_it) -> None:
    """A copy of CHILD named `name`, its config.pbtxt broken by break_it(config); the good one kept beside."""
    shutil.copytree(repo / CHILD, repo / name)
    config = parse_config(repo / name)
    config.name = name
    (repo / name / "config.good").write_text(text_format.MessageToString(config))
    break_it(config)
    (repo / name / "config.pbtxt").write_text(text_format.MessageToString(config))


def _flow(repo: Path, name: str, child: str) -> None:
    shutil.copytree(repo / "classify_bls", repo / name)
    config = text_format.Parse(config_variant(repo / "classify_bls", name, {
        "cascade_classifiers": "none", "classifiers": child, "run_in_process": "none"}), ModelConfig())
    config.instance_group[0].count = 1
    (repo / name / "config.pbtxt").write_text(text_format.MessageToString(config))


@pytest.fixture(scope="module")
def repo(repo_root, onnx_model, effnet_onnx_model, place_exports, tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("follow-children") / "models"
    shutil.copytree(repo_root / "models", repo, ignore=shutil.ignore_patterns(
        "*.onnx", "*.onnx.data", "*.onnx.json", "*.plan", "*.xml", "*.bin", "*.xml.json", "__pycache__"))
    place_exports(repo, {"resnet50_onnx": onnx_model, "efficientnet_lite0_onnx": effnet_onnx_model})

    def small_input(config):  # the model takes 224x224: its load fails, the flow's does not
        config.input[0].dims[:] = [3, 200, 200]
        del config.parameters["preprocess_crop"]
        config.parameters["preprocess_resize"].string_value = "228"

    def wrong_classes(config):  # 999 classes for 1000 labels: its load fails, and the flow's
        config.output[0].dims[:] = [999]

    _child(repo, "child_a", small_input)
    _child(repo, "child_b", wrong_classes)
    _flow(repo, "follows_a", "child_a")
    _flow(repo, "follows_b", "child_b")
    return repo


def _classify(server: TritonServer, model: str, images: list[bytes]):
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    try:
        data = np.array(images, dtype=object).reshape(-1, 1)
        tensor = httpclient.InferInput("IMAGE", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        return client.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput("LABELS"),
                                                     httpclient.InferRequestedOutput("ROUTE")])
    finally:
        client.close()


def _answers(server, model, images, child):
    """The flow's answer when it is one from `child` for every image, else None (an error, or another route)."""
    try:
        result = _classify(server, model, images)
    except Exception:  # noqa: BLE001 - not yet: polled again
        return None
    routes = [r.decode() for r in result.as_numpy("ROUTE").reshape(-1)]
    return result if len(routes) == len(images) and all(r.startswith(f"{child}:") for r in routes) else None


def test_a_fixed_child_is_followed_by_the_flow_that_loaded_and_the_one_that_failed(repo, tmp_path, repo_root):
    mug = (repo_root / "samples" / "mug.jpg").read_bytes()
    server = TritonServer(ServerOptions.on_free_ports(repo, tmp_path / "tritonserver.log",
                                                      models=("follows_a", "follows_b"),
                                                      fail_fast=False, status_port=free_port(),
                                                      watchdog_interval_s=0.5))
    server.start()
    try:
        assert set(server.failed) == {"child_a", "child_b", "follows_b"}, server.failed
        assert "follows_a" in server.loaded
        with pytest.raises(Exception, match="child_a failed to load"):
            _classify(server, "follows_a", [mug])

        # The operator's fix: the child's config.pbtxt, then a load of the child. No load of the flow.
        for child in ("child_a", "child_b"):
            (repo / child / "config.good").replace(repo / child / "config.pbtxt")
            server.load_model(child)

        # The flow that loaded calls child_a 224x224 now; the one that failed is loaded by bls-serve.
        eventually(lambda: _answers(server, "follows_a", [mug], "child_a"), timeout_s=30,
                   what="follows_a answering from the fixed child_a")
        eventually(lambda: server.is_model_ready("follows_b"), timeout_s=30, what="follows_b loaded again by bls-serve")
        labels = eventually(lambda: _answers(server, "follows_b", [mug], "child_b"), timeout_s=30,
                            what="follows_b answering from the fixed child_b").as_numpy("LABELS")
        assert b"mug" in labels.reshape(-1)[0] or b"cup" in labels.reshape(-1)[0], labels

        # Loaded again with max_batch_size 1, as Model Analyzer does (a config sent with the
        # load): three images are three calls now, answered at once, none refused.
        config = server.admin.config("child_a")
        config["max_batch_size"] = 1
        config.get("dynamic_batching", {}).pop("preferred_batch_size", None)
        server.admin.load("child_a", config)
        assert server.admin.config("child_a")["max_batch_size"] == 1
        result = _classify(server, "follows_a", [mug, mug, mug])
        assert [r.decode().split(":")[0] for r in result.as_numpy("ROUTE").reshape(-1)] == ["child_a"] * 3
    finally:
        server.stop()

