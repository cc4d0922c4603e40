"""The Triton glue's GPU side without a server: what the transport asks the python backend
for (preferred_memory, DLPack inputs) and what it does with tensors that come back in GPU
memory, checked against a minimal stand-in of pb_utils that records the calls (the names
and arguments are the python backend's, r24.10)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bls_pipeline.adapter.glue import instance_device, tensor_from_numpy, tensor_to_array  # noqa: E402
from bls_pipeline.adapter.transport import TritonTransport  # noqa: E402
from bls_pipeline.runtime.call.calls import ChildRequest  # noqa: E402
from bls_pipeline.runtime.errors import ChildCallError  # noqa: E402


class _Tensor:
    """A python backend tensor: numpy when on the CPU, DLPack either way."""

    def __init__(self, name, value, on_gpu=False):
        self.name, self.value, self.on_gpu = name, value, on_gpu

    @classmethod
    def from_dlpack(cls, name, obj):
        assert hasattr(obj, "__dlpack__") and not isinstance(obj, np.ndarray), "from_dlpack gets the tensor itself"
        return cls(name, obj, on_gpu=getattr(obj, "is_cuda", False))

    def is_cpu(self):
        return not self.on_gpu

    def as_numpy(self):
        assert not self.on_gpu
        return np.asarray(self.value)

    def to_dlpack(self):
        return torch.as_tensor(self.value).__dlpack__()


class _PbUtils:
    TRITONSERVER_MEMORY_GPU, TRITONSERVER_MEMORY_CPU = "GPU", "CPU"
    Tensor = _Tensor

    def __init__(self, outputs_on_gpu: bool):
        self.requests, self.outputs_on_gpu = [], outputs_on_gpu

    def PreferredMemory(self, memory_type, device_id):  # noqa: N802 - the backend's name
        return (memory_type, device_id)

    def InferenceRequest(self, model_name, requested_output_names, inputs, **options):  # noqa: N802
        pb = self

        class Request:
            def exec(self):
                pb.requests.append((model_name, inputs, options))
                return Response({name: _Tensor(name, torch.ones(len(inputs[0].value), 3) * 2, on_gpu=pb.outputs_on_gpu)
                                 if pb.outputs_on_gpu
                                 else _Tensor(name, np.ones((len(inputs[0].value), 3), np.float32) * 2)
                                 for name in requested_output_names})
        return Request()

    @staticmethod
    def get_output_tensor_by_name(response, name):
        return response.tensors.get(name)


class Response:
    def __init__(self, tensors):
        self.tensors = tensors

    def has_error(self):
        return False


def test_a_gpu_request_asks_for_its_outputs_in_that_gpus_memory():
    pb = _PbUtils(outputs_on_gpu=False)
    transport = TritonTransport(pb)
    pixels = torch.zeros((2, 3, 4, 4))
    (out,) = transport.send([ChildRequest("resnet50_torch", {"input": pixels}, ("output",), output_gpu=1)])
    (model, inputs, options) = pb.requests[0]
    assert options == {"preferred_memory": ("GPU", 1)}
    assert inputs[0].value is pixels  # the tensor itself went to from_dlpack: the stub syncs on its stream
    assert isinstance(out["output"], np.ndarray) and out["output"].shape == (2, 3)
    transport.send([ChildRequest("resnet50_onnx", {"input": np.zeros((1, 3, 4, 4), np.float32)}, ("output",))])
    # A request without output_gpu (a flow on the CPU) asks for host memory: no CUDA context in its stub.
    assert pb.requests[1][2] == {"preferred_memory": ("CPU", 0)} and isinstance(pb.requests[1][1][0].value, np.ndarray)


def test_outputs_that_come_back_on_the_device_stay_tensors_for_a_gpu_flow_and_become_numpy_for_a_cpu_flow():
    pb = _PbUtils(outputs_on_gpu=True)
    transport = TritonTransport(pb)
    (on_gpu,) = transport.send([ChildRequest("m", {"input": np.zeros((2, 3), np.float32)}, ("output",), output_gpu=0)])
    assert isinstance(on_gpu["output"], torch.Tensor) and on_gpu["output"].shape == (2, 3)
    # A flow on the CPU (no output_gpu) calling a child that answers in GPU memory, e.g.
    # classify_bls_cpu on resnet50_torch: numpy, which the HostDevice computes with.
    (on_host,) = transport.send([ChildRequest("m", {"input": np.zeros((2, 3), np.float32)}, ("output",))])
    assert isinstance(on_host["output"], np.ndarray) and on_host["output"].shape == (2, 3)
    assert np.all(on_host["output"] == 2)


def test_a_missing_output_is_a_failed_call():
    pb = _PbUtils(outputs_on_gpu=False)
    pb.get_output_tensor_by_name = lambda response, name: None
    (out,) = TritonTransport(pb).send([ChildRequest("m", {"input": np.zeros((1, 3), np.float32)}, ("output",))])
    assert isinstance(out, ChildCallError) and "returned no output" in str(out)


def test_glue_tensors_and_devices():
    pb = _PbUtils(outputs_on_gpu=False)
    assert isinstance(tensor_from_numpy(pb, "x", np.zeros(3, np.float32)).value, np.ndarray)
    t = torch.zeros(3)
    assert tensor_from_numpy(pb, "x", t).value is t
    assert isinstance(tensor_to_array(_Tensor("x", np.zeros(2))), np.ndarray)
    assert isinstance(tensor_to_array(_Tensor("x", torch.zeros(2), on_gpu=True)), torch.Tensor)
    assert instance_device({"model_instance_kind": "GPU", "model_instance_device_id": "2"}) == "cuda:2"
    assert instance_device({"model_instance_kind": "CPU", "model_instance_device_id": "0"}) is None


@pytest.mark.parametrize("message, unavailable", [
    ("Failed to process the request(s) for model instance 'resnet50_onnx_0_0', message: Stub process "
     "'resnet50_onnx_0_0' is not healthy.", True),
    ("Request for unknown model: 'resnet50_onnx' version 2 is not found", True),
    ("Request for unknown model: 'resnet50_onnx' has no available versions", True),
    ("Model resnet50_onnx - Error when running inference: Failed for execute the inference request. "
     "Model 'resnet50_onnx' is not ready.", True),
    ("onnxruntime: invalid input shape", False),
])
def test_a_failed_call_is_unavailable_only_when_the_model_could_not_take_it(message, unavailable):
    from bls_pipeline.adapter.transport import child_error

    assert child_error(message).unavailable is unavailable and str(child_error(message)) == message
