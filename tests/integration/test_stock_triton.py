"""models/ on a Triton with none of our packages: bls-pack-env's copy of the repository,
served by the embedded tritonserver whose python stubs run a bare Python (a venv with no
packages at all), from a local folder and from the S3 bucket.

The stub's embedded Python takes its packages from the first `python3` on PATH; the launcher
puts the bare venv's there. Without the packed environment the same models do not load
(no numpy, no bls_pipeline); with it they do, and the log shows the stub started through
the environment's activation script: what a stock NGC container or KServe's Triton runtime
does with the packed copy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bls_pipeline.serve.client import ClassifyClient
from bls_pipeline.serve.s3 import publish
from bls_pipeline.serve.options import ServerOptions
from bls_pipeline.serve.server import TritonServer
from bls_pipeline.tools.pack_env import EXECUTION_ENV_PARAMETER, pack, this_python

pytestmark = pytest.mark.integration

PACKED_MODELS = ("classify_bls", "efficientnet_lite0_onnx", "resnet50_onnx")
REGION = "us-east-1"


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A venv with nothing installed, of the stub's Python version."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    for module in ("numpy", "bls_pipeline", "onnxruntime", "PIL"):
        probe = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True, cwd=venv)
        assert probe.returncode != 0, f"the bare venv imports {module}: it must have none of our packages"
    return python


@pytest.fixture(scope="module")
def packed_repo(model_repo, tmp_path_factory) -> Path:
    """bls-pack-env's copy of the test repository, for this Python (`--this-python`: the target here)."""
    version, home = this_python()
    out = tmp_path_factory.mktemp("packed") / "models"
    report = pack(model_repo, out, python_version=version, python_home=home, models=PACKED_MODELS, progress=False)
    assert report.models == tuple(sorted(PACKED_MODELS))
    for model in PACKED_MODELS:
        config = (out / model / "config.pbtxt").read_text()
        assert f'"{EXECUTION_ENV_PARAMETER}"' in config and f"$$TRITON_MODEL_DIRECTORY/{report.tarball}" in config
        assert (out / model / report.tarball).is_file()
    # the source stays as it was
    assert EXECUTION_ENV_PARAMETER not in (model_repo / "classify_bls" / "config.pbtxt").read_text()
    return out


def _serve(repo, python: Path, log: Path) -> TritonServer:
    server = TritonServer(ServerOptions.on_free_ports(repo, log, models=("classify_bls",), python=python,
                                                      log_verbose=1))
    server.start()
    return server


def _classifies(server: TritonServer, sample_images) -> None:
    for protocol in ("http", "grpc"):
        out = ClassifyClient(server.url(protocol), protocol).classify([sample_images["mug"]])
        assert out["LABELS"][0][0].decode().endswith(":coffee mug"), out
        assert out["ROUTE"][0][0].decode() == "efficientnet_lite0_onnx:confident"


def test_without_the_packed_environment_a_bare_python_cannot_load_the_models(model_repo, bare_python, tmp_path):
    server = TritonServer(ServerOptions.on_free_ports(model_repo, tmp_path / "tritonserver.log",
                                                      models=("classify_bls",),
                                                     python=bare_python, startup_timeout_s=120))
    with pytest.raises(RuntimeError, match="No module named"):
        try:
            server.start()
        finally:
            server.stop()


def test_the_packed_repository_serves_from_a_bare_python(packed_repo, bare_python, sample_images, tmp_path):
    log = tmp_path / "tritonserver.log"
    server = _serve(packed_repo, bare_python, log)
    try:
        assert set(PACKED_MODELS) <= set(server.loaded)
        _classifies(server, sample_images)
    finally:
        server.stop()
    started = [line for line in log.read_text(errors="replace").splitlines()
               if "Starting Python backend stub: source " in line]
    assert any("/bin/activate && exec env" in line and "classify_bls" in line for line in started), started[:3]


def test_the_packed_repository_serves_from_s3_on_a_bare_python(packed_repo, bare_python, s3_endpoint, sample_images,
                                                                 tmp_path, monkeypatch):
    import boto3

    host, key_id, secret = s3_endpoint
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.setenv(name, os.devnull)
    boto3.client("s3", endpoint_url=f"http://{host}", region_name=REGION, aws_access_key_id=key_id,
                 aws_secret_access_key=secret).create_bucket(Bucket="packed")
    url = f"s3://{host}/packed/models"
    publish(packed_repo, url, models=PACKED_MODELS, progress=False)
    server = _serve(url, bare_python, tmp_path / "tritonserver.log")
    try:
        _classifies(server, sample_images)
    finally:
        server.stop()
