"""classify_bls on a KIND_GPU instance through a real server: JPEGs decoded on the GPU, the
pixels handed to resnet50_torch as CUDA tensors (DLPack), its logits asked for in GPU
memory; against the same flow on a CPU instance (numpy decode) and against onnxruntime."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from bls_pipeline.tools import gpubench_results, gpubench_serve
from engine_build.export_onnx import artifact_files

pytestmark = pytest.mark.gpu
REQUIRES = ("cuda", "server")


@pytest.fixture(scope="module")
def gpu_server(resnet50_artifacts, tmp_path_factory, repo_root):
    from bls_pipeline.serve.options import ServerOptions
    from bls_pipeline.serve.server import TritonServer

    base = tmp_path_factory.mktemp("gpu_repo")
    src = base / "src"
    shutil.copytree(repo_root / "models", src, symlinks=True,
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.pt", "*.plan", "*.json", "__pycache__"))
    for kind, model in (("onnx", "resnet50_onnx"), ("torch", "resnet50_torch")):
        artifact = resnet50_artifacts[kind]
        if artifact is None:  # no ONNX here: resnet50_onnx stays out (the GPU flows do not call it)
            continue
        files = (artifact_files(artifact) if kind == "onnx"
                 else (artifact, artifact.with_suffix(artifact.suffix + ".json")))
        for path in files:  # the ONNX with its external data (model.onnx.data) and stamp
            shutil.copy(path, src / model / "1" / path.name)
    gpubench_serve.gpu_repository(src, base / "models", gpu=True)
    log = base / "tritonserver.log"
    server = TritonServer(ServerOptions.on_free_ports(base / "models", log, startup_timeout_s=300,
                                                      models=(gpubench_results.GPU_FLOW, gpubench_results.CPU_FLOW,
                                                              "resnet50_torch", "resnet50_onnx")))
    server.start()
    server.test_log = log
    yield server
    server.stop()


def _classify(server, model: str, data: bytes):
    import tritonclient.grpc as tc

    client = tc.InferenceServerClient(server.grpc_url)
    inp = tc.InferInput("IMAGE", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[data]], dtype=object))
    outputs = [tc.InferRequestedOutput(n) for n in ("SCORES", "CLASS_IDS", "ROUTE")]
    try:
        result = client.infer(model, [inp], outputs=outputs)
        return {n: result.as_numpy(n) for n in ("SCORES", "CLASS_IDS", "ROUTE")}
    finally:
        client.close()


def test_the_gpu_flow_answers_as_the_cpu_flow(gpu_server, sample_images, repo_root):
    images = dict(sample_images)
    images["blank.png"] = (repo_root / "samples" / "blank.png").read_bytes()  # decoded on the CPU, then on the GPU
    agree = 0
    for name, data in images.items():
        on_gpu = _classify(gpu_server, gpubench_results.GPU_FLOW, data)
        on_cpu = _classify(gpu_server, gpubench_results.CPU_FLOW, data)
        assert on_gpu["ROUTE"][0, 0] == b"resnet50_torch:direct" == on_cpu["ROUTE"][0, 0]
        agree += int(on_gpu["CLASS_IDS"][0, 0] == on_cpu["CLASS_IDS"][0, 0])
        print(f"{name}: GPU {on_gpu['CLASS_IDS'][0, :3]} {on_gpu['SCORES'][0, :3]}, CPU {on_cpu['CLASS_IDS'][0, :3]} "
              f"{on_cpu['SCORES'][0, :3]}")
    # Random weights and pixels a step or two apart: a near tie may flip, not more than one.
    assert agree >= len(images) - 1


def test_pixels_cross_to_the_classifier_in_gpu_memory(gpu_server, sample_images):
    """What the stubs log: the flow decodes on the GPU, resnet50_torch gets CUDA inputs from
    it (DLPack, no copy) and host inputs from a client."""
    from bls_pipeline.tools.bench_images import tensor_set

    _classify(gpu_server, gpubench_results.GPU_FLOW, sample_images["mug"])
    import tritonclient.grpc as tc

    client = tc.InferenceServerClient(gpu_server.grpc_url)
    inp = tc.InferInput("input", [1, 3, 224, 224], "FP32")
    inp.set_data_from_numpy(tensor_set([sample_images["mug"]])[0])
    client.infer("resnet50_torch", [inp])
    client.close()
    log = gpu_server.test_log.read_text(errors="replace")
    assert "decoding JPEGs on cuda:0" in log
    assert "resnet50_torch: inputs arrive in GPU memory (DLPack, no copy)" in log
    assert "resnet50_torch: inputs arrive in CPU memory" in log


def test_a_bad_image_fails_alike_on_both_flows(gpu_server, sample_images):
    from tritonclient.utils import InferenceServerException

    messages = []
    for model in (gpubench_results.GPU_FLOW, gpubench_results.CPU_FLOW):
        with pytest.raises(InferenceServerException) as err:
            _classify(gpu_server, model, sample_images["mug"][:5000])  # a truncated JPEG
        messages.append(err.value.message())
    assert messages[0] == messages[1] and "IMAGE[0]" in messages[0]


def test_resnet50_torch_over_grpc_matches_onnxruntime(gpu_server, sample_images, onnx_reference):
    import tritonclient.grpc as tc

    from bls_pipeline.tools.bench_images import tensor_set

    x = np.concatenate(tensor_set(list(sample_images.values())))
    client = tc.InferenceServerClient(gpu_server.grpc_url)
    inp = tc.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = client.infer("resnet50_torch", [inp]).as_numpy("output")
    client.close()
    want = onnx_reference.run(["output"], {"input": x})[0]
    scale = max(1.0, float(np.abs(want).max()))
    print(f"resnet50_torch (fp16) vs onnxruntime (fp32): max abs diff {np.abs(got - want).max():.4f} at scale "
          f"{scale:.1f}")
    assert np.abs(got - want).max() <= 2e-2 * scale
    assert np.array_equal(got.argmax(1), want.argmax(1))
