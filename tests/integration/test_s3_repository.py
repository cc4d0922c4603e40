"""models/ served from an S3 bucket: a real S3-compatible server (moto, in server mode, with
its IAM checks on), bls-publish, and the embedded tritonserver reading the bucket itself.

Triton copies each model's folder alone from S3 to local disk: classify_bls's flow finds
its children's configs in the copies bls-publish writes, and the ONNX classifiers their
artifacts. An ensemble's empty version folder survives only through the placeholder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from bls_pipeline.serve.client import ClassifyClient
from bls_pipeline.serve.s3 import PLACEHOLDER, S3Error, check_access, publish
from bls_pipeline.serve.options import ServerOptions
from bls_pipeline.serve.server import TritonServer
from docblocks import copy_shipped_models

REGION = "us-east-1"  # any name works on moto; Triton and boto3 need one

pytestmark = pytest.mark.integration

MODELS = ("classify_bls", "ensemble_resnet50")  # the flow, its classifiers, the ensemble and its steps


def _bucket(s3_endpoint, name: str) -> str:
    """A new bucket; its Triton address."""
    import boto3

    host, key_id, secret = s3_endpoint
    boto3.client("s3", endpoint_url=f"http://{host}", region_name=REGION, aws_access_key_id=key_id,
                 aws_secret_access_key=secret).create_bucket(Bucket=name)
    return f"s3://{host}/{name}/models"


def _keys(s3_endpoint, url: str) -> set[str]:
    return set(check_access(url))


@pytest.fixture(scope="module")
def local_repo(model_repo, tmp_path_factory) -> Path:
    """A reader's models/ (the test repository's exports, not its variants) with no .gitkeep:
    the ensemble's version folder is really empty."""
    repo = copy_shipped_models(model_repo, tmp_path_factory.mktemp("s3src") / "models")
    for keep in repo.glob("*/*/.gitkeep"):
        keep.unlink()
    assert not any((repo / "ensemble_resnet50" / "1").iterdir())
    return repo


def test_publish_keeps_empty_folders_and_copies_what_flows_call(s3_endpoint, aws_env, local_repo):
    kept = _bucket(s3_endpoint, "kept")
    report = publish(local_repo, kept, progress=False)
    keys = _keys(s3_endpoint, kept)
    assert f"ensemble_resnet50/1/{PLACEHOLDER}" in keys
    assert "ensemble_resnet50/1" in report.placeholders
    # A link (efficientnet_lite0_onnx's model.py) is uploaded as the file it points to.
    assert "efficientnet_lite0_onnx/1/model.py" in keys
    # What classify_bls calls, beside it: config and labels (Triton copies its folder alone).
    for child in ("efficientnet_lite0_onnx", "resnet50_onnx", "resnet50_trt"):
        assert f"classify_bls/children/{child}/config.pbtxt" in keys
    assert "classify_bls/children/resnet50_onnx/labels.txt" in keys
    assert not any("__pycache__" in k for k in keys)

    bare = _bucket(s3_endpoint, "bare")
    publish(local_repo, bare, progress=False, placeholders=False)
    assert not any(k.startswith("ensemble_resnet50/1/") for k in _keys(s3_endpoint, bare))


@pytest.fixture(scope="module")
def s3_server(s3_endpoint, local_repo, tmp_path_factory):
    """The embedded tritonserver on the bucket bls-publish (the command) filled."""
    host, key_id, secret = s3_endpoint
    env = {**os.environ, "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": REGION,
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    import boto3

    boto3.client("s3", endpoint_url=f"http://{host}", region_name=REGION, aws_access_key_id=key_id,
                 aws_secret_access_key=secret).create_bucket(Bucket="serve")
    url = f"s3://{host}/serve/models"
    proc = subprocess.run([sys.executable, "-m", "bls_pipeline.serve.s3", str(local_repo), url],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ensemble_resnet50/1/ is empty: wrote ensemble_resnet50/1/{PLACEHOLDER}" in proc.stdout
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # what the launcher and tritonserver read
    try:
        server = TritonServer(ServerOptions.on_free_ports(url, tmp_path_factory.mktemp("s3logs") / "tritonserver.log",
                                                          models=MODELS))
        server.start()
        yield server
        server.stop()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_the_models_load_from_the_bucket(s3_server):
    assert str(s3_server.options.model_repository).startswith("s3://")
    for model in ("classify_bls", "efficientnet_lite0_onnx", "resnet50_onnx", "ensemble_resnet50"):
        assert model in s3_server.loaded and s3_server.is_model_ready(model), model


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classifies_from_the_bucket_like_the_local_repository(s3_server, server, protocol, sample_images):
    """Same answers as the session's server on the local copy: same flow, same weights."""
    images = [sample_images["mug"], sample_images["coffee"]]
    remote = ClassifyClient(s3_server.url(protocol), protocol).classify(images)
    local = ClassifyClient(server.url(protocol), protocol).classify(images)
    np.testing.assert_array_equal(remote["CLASS_IDS"], local["CLASS_IDS"])
    np.testing.assert_allclose(remote["SCORES"], local["SCORES"], atol=1e-5)
    assert remote["LABELS"][0][0].decode().endswith(":coffee mug")
    assert remote["ROUTE"][0][0].decode() == "efficientnet_lite0_onnx:confident"
    ensemble = ClassifyClient(s3_server.url(protocol), protocol, model="ensemble_resnet50")
    tc = ensemble._tc
    image = tc.InferInput("IMAGE", [1, 1], "BYTES")
    image.set_data_from_numpy(np.array([sample_images["mug"]], dtype=object).reshape(1, 1))
    assert ensemble._client.infer("ensemble_resnet50", [image]).as_numpy("CLASS_IDS").shape[0] == 1


def _version_ready(server, model: str, version: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/versions/{version}/ready",
                                    timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def test_rolls_a_new_version(s3_server, local_repo, sample_images, tmp_path):
    """Upload efficientnet_lite0_onnx/2 with bls-publish --models, load it: version 2 serves,
    version 1 is gone (Triton's default policy: the latest), and classify_bls answers through it."""
    model = "efficientnet_lite0_onnx"
    assert _version_ready(s3_server, model, 1) and not _version_ready(s3_server, model, 2)
    staged = tmp_path / "models"
    (staged / model).mkdir(parents=True)
    shutil.copy2(local_repo / model / "config.pbtxt", staged / model)
    shutil.copy2(local_repo / model / "labels.txt", staged / model)
    for version in ("1", "2"):
        shutil.copytree(local_repo / model / "1", staged / model / version)
    url = s3_server.options.model_repository
    assert publish(staged, url, models=(model,), progress=False).uploaded
    s3_server.load_model(model)
    assert _version_ready(s3_server, model, 2)
    assert not _version_ready(s3_server, model, 1)
    out = ClassifyClient(s3_server.url("http"), "http").classify([sample_images["mug"]])
    assert out["ROUTE"][0][0].decode() == "efficientnet_lite0_onnx:confident"


def test_a_missing_region_is_a_clear_error(s3_endpoint, aws_env, monkeypatch, tmp_path):
    url = _bucket(s3_endpoint, "noregion")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    server = TritonServer(ServerOptions.on_free_ports(url, tmp_path / "t.log"))
    with pytest.raises(S3Error, match="no AWS region: set AWS_DEFAULT_REGION"):
        try:
            server.start()
        finally:
            server.stop()
    proc = subprocess.run([sys.executable, "-m", "bls_pipeline.serve.cli", "--model-repository", url],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "bls-serve: error: no AWS region: set AWS_DEFAULT_REGION" in proc.stderr, proc.stderr


@pytest.mark.parametrize("wrong, code", [("AWS_ACCESS_KEY_ID", "InvalidAccessKeyId"),
                                         ("AWS_SECRET_ACCESS_KEY", "SignatureDoesNotMatch")])
def test_bad_credentials_are_a_clear_error(s3_endpoint, aws_env, monkeypatch, local_repo, tmp_path, wrong, code):
    url = _bucket(s3_endpoint, f"creds-{code.lower()}")
    monkeypatch.setenv(wrong, "AKIAWRONGWRONGWRONG0")
    message = f"S3 refused the credentials for {url} ({code}): check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    server = TritonServer(ServerOptions.on_free_ports(url, tmp_path / "t.log"))
    with pytest.raises(S3Error) as info:
        try:
            server.start()
        finally:
            server.stop()
    assert str(info.value) == message
    with pytest.raises(S3Error, match="S3 refused the credentials"):
        publish(local_repo, url, progress=False)
