"""TensorRT plan built by engine_build agrees with onnxruntime (GPU + TensorRT only)."""

import numpy as np
import pytest

from bls_pipeline import contract

pytestmark = pytest.mark.gpu
REQUIRES = ("tensorrt", "cuda")


@pytest.mark.parametrize("fp16,tol", [(False, 1e-2), (True, 5e-2)])
def test_plan_matches_onnxruntime(onnx_model, tmp_path, fp16, tol):
    import onnxruntime as ort
    import tensorrt as trt
    import torch

    from engine_build.build_trt import build_plan, set_max_batch_size

    plan = tmp_path / "model.plan"
    build_plan(onnx_model, plan, fp16=fp16, min_batch=1, opt_batch=4, max_batch=8, workspace_gib=2)
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(plan.read_bytes())
    context = engine.create_execution_context()
    x = np.random.default_rng(0).standard_normal((4, *contract.CLASSIFIER_INPUT.dims), dtype=np.float32)
    x_gpu = torch.from_numpy(x).cuda()
    y_gpu = torch.empty((4, contract.NUM_CLASSES), device="cuda")
    context.set_input_shape(contract.CLASSIFIER_INPUT.name, tuple(x.shape))
    context.set_tensor_address(contract.CLASSIFIER_INPUT.name, x_gpu.data_ptr())
    context.set_tensor_address(contract.CLASSIFIER_OUTPUT.name, y_gpu.data_ptr())
    assert context.execute_async_v3(torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    session = ort.InferenceSession(str(onnx_model), providers=["CPUExecutionProvider"])
    expected = session.run(["output"], {"input": x})[0]
    got = y_gpu.cpu().numpy()
    assert np.array_equal(got.argmax(1), expected.argmax(1))
    assert np.abs(got - expected).max() <= tol * max(1.0, np.abs(expected).max())

    config = tmp_path / "config.pbtxt"
    config.write_text('name: "resnet50_trt"\nmax_batch_size: 32\n')
    set_max_batch_size(config, 8)
    assert "max_batch_size: 8" in config.read_text()
