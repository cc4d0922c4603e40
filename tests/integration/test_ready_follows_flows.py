"""bls-serve's /ready follows the flows loaded at any time (issue 42: it followed only those
known at start, and said ready while a flow loaded later answered 500): a flow loaded later
through the repository API whose probe fails makes it 503 naming that flow, and once the
flow is unloaded /ready says ready again, with no word of the error that is gone."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from google.protobuf import text_format

from bls_pipeline.base.modelconfig import ModelConfig, config_variant
from bls_pipeline.serve.options import ServerOptions, free_port
from bls_pipeline.serve.server import TritonServer

from polling import eventually, get

pytestmark = pytest.mark.integration

LATE = "late_flow"


@pytest.fixture(scope="module")
def repo(repo_root, onnx_model, effnet_onnx_model, place_exports, tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("ready-follows") / "models"
    shutil.copytree(repo_root / "models", repo, ignore=shutil.ignore_patterns(
        "*.onnx", "*.onnx.data", "*.onnx.json", "*.plan", "*.xml", "*.bin", "*.xml.json", "__pycache__"))
    place_exports(repo, {"resnet50_onnx": onnx_model, "efficientnet_lite0_onnx": effnet_onnx_model})
    return repo


def test_ready_follows_a_flow_loaded_later_and_forgets_it_once_unloaded(repo, tmp_path):
    server = TritonServer(ServerOptions.on_free_ports(repo, tmp_path / "tritonserver.log", models=("classify_bls",),
                                                      fail_fast=False, status_port=free_port(),
                                                      watchdog_interval_s=0.5))
    server.start()
    try:
        ready = f"{server.status_url}/ready"
        eventually(lambda: get(ready) == (200, "ready: classify_bls\n"), what="ready for classify_bls")
        # A flow whose only classifier never loads here (no TensorRT plan): it loads, and its probe fails.
        shutil.copytree(repo / "classify_bls", repo / LATE)
        config = text_format.Parse(config_variant(repo / "classify_bls", LATE, {
            "cascade_classifiers": "none", "classifiers": "resnet50_trt", "run_in_process": "none"}), ModelConfig())
        config.instance_group[0].count = 1
        (repo / LATE / "config.pbtxt").write_text(text_format.MessageToString(config))
        server.load_model(LATE)
        code, text = eventually(lambda: (lambda r: r if r[0] == 503 else None)(get(ready)), timeout_s=60,
                                what=f"not ready for {LATE}")
        assert (f"{LATE} its last probe failed: " in text and "no classifier is ready" in text
                and "classify_bls " not in text)
        server.unload_model(LATE)
        eventually(lambda: get(ready) == (200, "ready: classify_bls\n"), timeout_s=60, what=f"ready again, {LATE} gone")
    finally:
        server.stop()
