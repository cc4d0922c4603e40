"""A real tritonserver on a temporary copy of models/, shared by the integration tests.

The copy gets a freshly exported random-weight resnet50 ONNX (seeded), efficientnet_lite0
exported with its shipped ImageNet weights, and variants of classify_bls's config (same
code, other parameters): see model_repo. Tests that only need a server use `server` (one
per session); only tests that break or stop a server start their own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from google.protobuf import text_format

from bls_pipeline.base.modelconfig import ModelConfig, config_variant
from bls_pipeline.serve.options import ServerOptions, free_port
from bls_pipeline.serve.server import TritonServer

pytestmark = pytest.mark.integration


def _copy_repo(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst,
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.onnx.json", "*.plan", "*.xml", "*.bin",
                                                          "*.xml.json", "__pycache__"))  # no engine built here


def _variant(repo: Path, base: str, name: str, params: dict[str, str], instances: int | None = None,
             queue_delay_us: int | None = None) -> None:
    shutil.copytree(repo / base, repo / name)
    # Every call through Triton unless the variant says otherwise: the tests of routing,
    # faults and statistics watch the child models' own stubs.
    params = {"run_in_process": "none", **params} if base == "classify_bls" else params
    config = text_format.Parse(config_variant(repo / base, name, params), ModelConfig())
    if instances is not None:
        config.instance_group[0].count = instances
    if queue_delay_us is not None:
        config.dynamic_batching.max_queue_delay_microseconds = queue_delay_us
    (repo / name / "config.pbtxt").write_text(text_format.MessageToString(config))


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory, repo_root, onnx_model, effnet_onnx_model, place_exports) -> Path:
    repo = tmp_path_factory.mktemp("repo") / "models"
    _copy_repo(repo_root / "models", repo)
    from engine_build.ocr import build_ocr_models

    build_ocr_models(repo)  # read_text's children: PP-OCR from the rapidocr wheel (cached under build/)
    place_exports(repo, {"resnet50_onnx": onnx_model, "efficientnet_lite0_onnx": effnet_onnx_model})
    # On standby (behind resnet50 in classify_bls_failover, on its own servers), it lets go of
    # its engine after 2 s without a call, not 30: test_faults sees it.
    with open(repo / "efficientnet_lite0_onnx" / "config.pbtxt", "a") as config:
        config.write('parameters { key: "standby_release_s", value: { string_value: "2" } }\n')
    # resnet50 alone, no cascade: parity with onnxruntime and the ensemble.
    _variant(repo, "classify_bls", "classify_bls_resnet50", {"cascade_classifiers": "none"})
    _variant(repo, "classify_bls", "classify_bls_tta", {"cascade_classifiers": "none", "tta_threshold": "1.0"})
    # resnet50 first, efficientnet next, re-checked every second: the failover tests.
    _variant(repo, "classify_bls", "classify_bls_failover", {"cascade_classifiers": "none", "tta_threshold": "0",
                                                              "classifiers": "resnet50_onnx,efficientnet_lite0_onnx",
                                                              "route_recheck_s": "1"})
    # The cascade as bls-bench's cascade@0.5 target makes it (no flip pass): the cat photo
    # (~0.4 on efficientnet_lite0) escalates to resnet50, the mug, espresso and tripod do not.
    _variant(repo, "classify_bls", "classify_bls_cascade_05", {"cascade_threshold": "0.5", "tta_threshold": "0"})
    # The cascade whose main classifier never loads here (no plan is copied): unsure images
    # keep the cheap answer, ROUTE ...:degraded.
    _variant(repo, "classify_bls", "classify_bls_degraded", {"classifiers": "resnet50_trt"}, instances=1)
    # One instance, resnet50 alone, no flip pass: each execute() makes exactly one child call,
    # so resnet50_onnx's execution count is the flow's child-call count (the batching test).
    _variant(repo, "classify_bls", "classify_bls_one_instance",
             {"cascade_classifiers": "none", "classifiers": "resnet50_onnx", "tta_threshold": "0"},
             instances=1, queue_delay_us=100_000)
    _status_models(repo)
    # One instance that waits 0.3 s for a batch and logs each execute(): the tracing test.
    _variant(repo, "classify_bls", "classify_bls_traced",
             {"cascade_classifiers": "none", "classifiers": "resnet50_onnx",
                                                            "tta_threshold": "0", "log_executions": "true"},
             instances=1, queue_delay_us=300_000)
    return repo


# ---- what the status-code tests need (test_status_codes.py): broken parts, a missing one ------
_BROKEN_CHILDREN = '''"""Children that break their config's contract (tests only)."""
import numpy as np


def wrong_shape(inputs):
    return {"output": np.zeros((len(inputs["input"]), 10), np.float32)}


def wrong_dtype(inputs):
    return {"output": np.zeros((len(inputs["input"]), 1000), np.float64)}
'''
_RAISING_FLOW = '''"""A flow with a bug: it raises on a batch of two or more images (the load check sends one)."""
from bls_pipeline.flow import Answer, Batch, Candidates, Settings


class RaisingSettings(Settings):
    classifiers: Candidates = "resnet50_onnx"


def flow(batch: Batch, settings: RaisingSettings) -> Answer:
    answer = batch.answer().set(batch.classify(settings.classifiers), "ok")
    if len(batch) >= 2:
        raise KeyError("/secret/path")
    return answer
'''


def _status_models(repo: Path) -> None:
    """Two python classifiers that break their contract (a wrong output shape, a wrong dtype),
    a flow on each, a cascade escalating to the first, a flow whose only classifier is never
    loaded here, a flow that raises, and read_text allowing one region per image."""
    for name, fn in (("broken_shape", "wrong_shape"), ("broken_dtype", "wrong_dtype")):
        folder = repo / name
        (folder / "1").mkdir(parents=True)
        shutil.copy(repo / "image_quality" / "1" / "model.py", folder / "1" / "model.py")
        (folder / "1" / "broken.py").write_text(_BROKEN_CHILDREN)
        shutil.copy(repo / "resnet50_onnx" / "labels.txt", folder / "labels.txt")
        (folder / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
            'input [ { name: "input", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] } ]\n'
            'output [ { name: "output", data_type: TYPE_FP32, dims: [ 1000 ], label_filename: "labels.txt" } ]\n'
            'instance_group [ { count: 1, kind: KIND_CPU } ]\n'
            f'parameters {{ key: "function", value: {{ string_value: "broken.py:{fn}" }} }}\n')
        _variant(repo, "classify_bls", f"classify_bls_{name}", {"cascade_classifiers": "none", "classifiers": name,
                                                                  "tta_threshold": "0"}, instances=1)
    _variant(repo, "classify_bls", "classify_bls_unready",
             {"cascade_classifiers": "none", "classifiers": "resnet50_trt"},
             instances=1)
    # The cascade whose main classifier (broken_shape) breaks its contract: one instance that
    # waits 0.3 s for a batch, so concurrent requests share an execute(); the cat photo
    # escalates to it, the espresso does not.
    _variant(repo, "classify_bls", "classify_bls_cascade_broken",
             {"classifiers": "broken_shape", "cascade_threshold": "0.5",
                                                                    "tta_threshold": "0"}, instances=1,
             queue_delay_us=300_000)
    _variant(repo, "classify_bls", "raising_flow", {"classifiers": "resnet50_onnx"}, instances=1)
    (repo / "raising_flow" / "1" / "flow.py").write_text(_RAISING_FLOW)
    _variant(repo, "read_text", "read_text_one_region", {"max_regions_per_image": "1"})


def python_child(repo: Path, shipped: Path, name: str, source: str, function: str, max_batch_size: int = 8) -> None:
    """A test-only classifier child: a python model running `function` of `source` (a children.py)
    on 3x224x224 inputs, with ImageNet's 1000 labels (image_quality's model.py runs it)."""
    (repo / name / "1").mkdir(parents=True)
    shutil.copy(shipped / "image_quality" / "1" / "model.py", repo / name / "1" / "model.py")
    (repo / name / "1" / "children.py").write_text(source)
    shutil.copy(shipped / "resnet50_onnx" / "labels.txt", repo / name / "labels.txt")
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "input", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] } ]\n'
        'output [ { name: "output", data_type: TYPE_FP32, dims: [ 1000 ], label_filename: "labels.txt" } ]\n'
        'instance_group [ { count: 1, kind: KIND_CPU } ]\n'
        f'parameters {{ key: "function", value: {{ string_value: "children.py:{function}" }} }}\n')


def start_server(repo: Path, log_dir: Path, **kwargs) -> TritonServer:
    server = TritonServer(ServerOptions.on_free_ports(repo, log_dir / "tritonserver.log", **kwargs))
    server.start()
    return server


@pytest.fixture(scope="session")
def child_factory():
    """python_child: make a test-only classifier child in a repository."""
    return python_child


@pytest.fixture(scope="session")
def server_factory():
    """Start another server (the caller stops it): for tests that kill or restart one."""
    return start_server


@pytest.fixture(scope="session")
def server(model_repo, tmp_path_factory):
    srv = start_server(model_repo, tmp_path_factory.mktemp("logs"))
    yield srv
    srv.stop()


# ---- S3: a real S3-compatible server (moto in server mode), for the S3 tests -----------------
REGION = "us-east-1"


def _moto_server() -> Path:
    path = Path(sys.executable).parent / "moto_server"
    if not path.exists():
        pytest.fail(f"{path} is missing: install the test extra (pip install 'bls-pipeline[test]'; scripts/setup.sh "
                    "does)")
    return path


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """A moto S3 server on a free port that checks credentials: the first three requests
    (creating an IAM user, its policy and its key) go through unsigned, every later one
    needs that key. Yields (host:port, key id, secret)."""
    import boto3

    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")
    proc = subprocess.Popen([str(_moto_server()), "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).close()
                break
            except (urllib.error.URLError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"moto_server did not start (exit {proc.poll()}); see {log.name}")
                time.sleep(0.2)
        iam = boto3.client("iam", endpoint_url=f"http://127.0.0.1:{port}", region_name=REGION,
                           aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        iam.create_user(UserName="triton")
        iam.put_user_policy(UserName="triton", PolicyName="models", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="triton")["AccessKey"]
        yield f"127.0.0.1:{port}", key["AccessKeyId"], key["SecretAccessKey"]
    finally:
        proc.kill()
        proc.wait(timeout=10)
        log.close()


@pytest.fixture
def aws_env(s3_endpoint, monkeypatch):
    """The environment tritonserver and bls-publish read: the key, the region."""
    _, key_id, secret = s3_endpoint
    for name in ("AWS_REGION", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    # No ~/.aws of the machine's: only what is set here counts.
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
