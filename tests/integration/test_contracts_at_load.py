"""A child whose engine file differs from its config.pbtxt fails its load in the real server,
naming the model, the tensor and both sides, instead of loading and failing every request
that reaches it (engines/artifact_io.py; adapter/onnx_model.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bls_pipeline.serve.options import ServerOptions, free_port
from bls_pipeline.serve.server import TritonServer

pytestmark = pytest.mark.integration

WHAT = ("model resnet50_onnx: output output: its config.pbtxt declares TYPE_FP32 dims [1000], max_batch_size 32, "
        "and model.onnx has FP32 [-1, 10] (dim 0 is 1000 against 10): re-export it or fix the config")


@pytest.fixture
def mismatched_repo(tmp_path, repo_root) -> Path:
    """resnet50_onnx's folder with an ONNX file of 10 classes where its config says 1000."""
    sys.path.insert(0, str(repo_root / "tests" / "unit"))
    try:
        from test_artifact_io import _onnx
    finally:
        sys.path.pop(0)
    repo = tmp_path / "models"
    shutil.copytree(repo_root / "models" / "resnet50_onnx", repo / "resnet50_onnx",
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.json", "__pycache__"))
    _onnx(repo / "resnet50_onnx" / "1" / "model.onnx", 10)
    return repo


def test_the_server_refuses_to_load_it_naming_both_sides(mismatched_repo, tmp_path):
    server = TritonServer(ServerOptions.on_free_ports(mismatched_repo, tmp_path / "tritonserver.log"))
    with pytest.raises(RuntimeError, match="tritonserver exited with code 1 before it was ready") as caught:
        server.start()
    assert WHAT in str(caught.value)  # the server log's error lines, in the message


def test_bls_serve_says_why_and_exits(mismatched_repo):
    ports = [str(free_port()) for _ in range(3)]
    proc = subprocess.run([sys.executable, "-c",
                           "import sys; from bls_pipeline.serve.cli import main; sys.exit(main())",
                           "--model-repository", str(mismatched_repo), "--http-port", ports[0], "--grpc-port", ports[1],
                           "--metrics-port", ports[2], "--status-port", "0", "--watchdog-interval", "0"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert WHAT in proc.stderr
