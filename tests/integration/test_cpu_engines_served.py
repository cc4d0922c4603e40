"""The CPU engines built by engine_build, served by bls-serve's tritonserver: INT8 models
calibrated here on a few sample photos, an OpenVINO IR, and a corrupt engine skipped with
its reason. The flows route to the engines ahead of FP32 onnxruntime, and ROUTE says so."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from bls_pipeline.runtime.load.children import load_child
from bls_pipeline.serve.client import ClassifyClient
from engine_build.build_cpu import calibration_tensors, convert_openvino, quantize

pytestmark = pytest.mark.integration
GOLDEN = {"mug": 504, "coffee": 967, "camera": 872}  # coffee mug, espresso, tripod


@pytest.fixture(scope="module")
def engine_repo(model_repo, repo_root, tmp_path_factory) -> Path:
    """The test repository with INT8 engines for both classifiers (calibrated on 3 photos
    and their mirror images, to stay quick), efficientnet_lite0 as OpenVINO IR, and a
    resnet50 IR cut short (a build that died)."""
    repo = tmp_path_factory.mktemp("engines") / "models"
    shutil.copytree(model_repo, repo, symlinks=True)
    for family in ("resnet50", "efficientnet_lite0"):
        onnx = repo / f"{family}_onnx" / "1" / "model.onnx"
        tensors = calibration_tensors(repo_root / "samples", load_child(repo, f"{family}_onnx").preprocess, limit=3)
        quantize(onnx, repo / f"{family}_int8" / "1" / "model.onnx", tensors, method="onnxruntime")
    pytest.importorskip("openvino", reason="the OpenVINO model needs openvino: pip install 'bls-pipeline[openvino]'")
    convert_openvino(repo / "efficientnet_lite0_onnx" / "1" / "model.onnx",
                     repo / "efficientnet_lite0_openvino" / "1" / "model.xml")
    cut = repo / "resnet50_openvino" / "1"
    shutil.copy(repo / "efficientnet_lite0_openvino" / "1" / "model.xml", cut / "model.xml")
    (cut / "model.bin").write_bytes(bytes(1000))
    return repo


@pytest.fixture(scope="module")
def engine_server(engine_repo, tmp_path_factory, server_factory):
    server = server_factory(engine_repo, tmp_path_factory.mktemp("engine-logs"),
                          models=("classify_bls", "efficientnet_lite0_openvino"))
    yield server
    server.stop()


def test_a_corrupt_engine_is_skipped_with_the_reason(engine_server):
    assert (engine_server.skipped["resnet50_openvino"].startswith("resnet50_openvino/1/model.xml is unusable "
                                                                  "(model.bin is shorter"))
    assert {"resnet50_int8", "efficientnet_lite0_int8", "efficientnet_lite0_openvino"} <= set(engine_server.loaded)


def test_classify_bls_answers_from_the_first_engine_that_loaded(engine_server, sample_images):
    client = ClassifyClient(engine_server.http_url, "http")
    # A 30 s deadline, which the flow aims at: the cat's escalation is what is checked, not what
    # a busy test machine makes of the 400 ms aim of a request without one.
    out = client.classify([sample_images[n] for n in GOLDEN] + [sample_images["chelsea"]], topk=1, timeout_s=30)
    assert out["CLASS_IDS"][:3, 0].tolist() == list(GOLDEN.values())  # real weights, quantized: the same golden classes
    routes = [r.decode() for r in out["ROUTE"][:, 0]]
    assert routes[:3] == ["efficientnet_lite0_openvino:confident"] * 3  # the first engine in the list that loaded
    # The cat (~0.4) goes to the main classifier: resnet50_openvino is corrupt and skipped,
    # so the next engine, onnxruntime's INT8, answers, and ROUTE names it.
    assert routes[3] == "resnet50_int8:escalated"


def test_the_openvino_engine_answers_as_the_fp32_onnx(engine_server, engine_repo, sample_images):
    from bls_pipeline.stages.decode import decode
    from bls_pipeline.stages.preprocess import preprocess_into
    from engine_build.agreement import runner

    spec = load_child(engine_repo, "efficientnet_lite0_openvino").preprocess
    batch = np.empty((len(GOLDEN), *spec.input_shape), np.float32)
    for i, name in enumerate(GOLDEN):
        preprocess_into(decode(sample_images[name]), spec, batch[i])
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(engine_server.http_url)
    inp = httpclient.InferInput("input", list(batch.shape), "FP32")
    inp.set_data_from_numpy(batch)
    served = client.infer("efficientnet_lite0_openvino", [inp]).as_numpy("output")
    fp32 = runner(engine_repo / "efficientnet_lite0_onnx" / "1" / "model.onnx")(batch)
    assert served.argmax(axis=1).tolist() == fp32.argmax(axis=1).tolist() == list(GOLDEN.values())
    assert np.abs(served - fp32).max() < 0.1 * np.abs(fp32).max()  # bf16 arithmetic where the CPU has it
