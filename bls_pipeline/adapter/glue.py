"""The small helpers every model.py shares to talk to the python backend.

`pb_utils` (triton_python_backend_utils) exists only inside the Triton python stub, so it
is passed in rather than imported: this package imports cleanly anywhere, and nothing
here pretends to be pb_utils.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from ..contract import PROBE_PARAMETER
from ..base.tensors import TensorInfo

__all__ = ["bridge_logging", "declared_outputs", "freeze_startup_objects", "instance_count", "instance_device",
           "is_probe",
           "model_parameters", "request_parameters", "tensor_from_numpy", "tensor_to_array", "tensor_to_numpy"]


class _TritonLogHandler(logging.Handler):
    def __init__(self, pb_logger: Any):
        super().__init__()
        self._pb = pb_logger

    def emit(self, record: logging.LogRecord) -> None:
        msg = self.format(record)
        if record.levelno >= logging.ERROR:
            self._pb.log_error(msg)
        elif record.levelno >= logging.WARNING:
            self._pb.log_warn(msg)
        elif record.levelno >= logging.INFO:
            self._pb.log_info(msg)
        else:
            self._pb.log_verbose(msg)


def bridge_logging(pb_utils: Any, level: int = logging.INFO) -> None:
    """Send the bls_pipeline loggers to Triton's log (once per stub process)."""
    root = logging.getLogger("bls_pipeline")
    if not any(isinstance(h, _TritonLogHandler) for h in root.handlers):
        handler = _TritonLogHandler(pb_utils.Logger)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(level)
        root.propagate = False


def model_parameters(args: dict) -> dict[str, str]:
    """config.pbtxt `parameters` as a plain {key: string_value} dict."""
    config = json.loads(args["model_config"])
    return {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


def declared_outputs(args: dict) -> list[TensorInfo]:
    """The model's outputs as Triton serves them (its config, as loaded)."""
    config = json.loads(args["model_config"])
    return [TensorInfo(o["name"], o["data_type"].replace("TYPE_", ""), tuple(int(d) for d in o.get("dims", [])))
            for o in config.get("output", [])]


def instance_count(args: dict) -> int:
    """How many instances of this model the config asks for (all groups together)."""
    groups = json.loads(args["model_config"]).get("instance_group", [])
    return sum(int(g.get("count", 1)) for g in groups) or 1


def instance_device(args: dict) -> str | None:
    """The torch device of this model instance: "cuda:<id>" for a KIND_GPU instance, None
    for KIND_CPU (numpy on the CPU)."""
    if args.get("model_instance_kind") == "GPU":
        return f"cuda:{int(args.get('model_instance_device_id') or 0)}"
    return None


def tensor_from_numpy(pb_utils: Any, name: str, array: Any) -> Any:
    """An array -> pb_utils.Tensor. A numpy array goes in as it is: the python backend copies
    it into its shared memory either way, so a CPU tensor gains nothing from DLPack and
    the stub need not import torch. A CUDA tensor (anything with __dlpack__ that is not
    numpy, C-contiguous) crosses through DLPack with no copy to host: handed over as the
    object, so the stub asks it for its data on the stub's own CUDA stream and waits for
    that stream, i.e. for the kernels that wrote it."""
    if isinstance(array, np.ndarray):
        return pb_utils.Tensor(name, np.ascontiguousarray(array))
    return pb_utils.Tensor.from_dlpack(name, array)


def tensor_to_array(tensor: Any) -> Any:
    """pb_utils.Tensor -> numpy for a CPU tensor (tensor_to_numpy's view), a torch tensor on
    its GPU for a CUDA one (DLPack, no copy; it lives as long as the tensor's response)."""
    if tensor.is_cpu():
        return tensor.as_numpy()
    from torch.utils.dlpack import from_dlpack

    return from_dlpack(tensor.to_dlpack())


def tensor_to_numpy(tensor: Any) -> np.ndarray:
    """pb_utils.Tensor -> numpy: for a CPU tensor, the array the python backend already built
    over its shared memory (a view, no copy; strings included); CUDA tensors go through
    torch's DLPack and are copied to host."""
    if tensor.is_cpu():
        return tensor.as_numpy()
    from torch.utils.dlpack import from_dlpack

    return from_dlpack(tensor.to_dlpack()).cpu().numpy()


def freeze_startup_objects() -> None:
    """Call at the end of initialize(): move everything imported so far out of the garbage
    collector's reach, so that the full collections allocations trigger do not walk it
    (with torch imported, that added ~11 ms to every classify_bls execute())."""
    import gc

    gc.collect()
    gc.freeze()


def request_parameters(request: Any) -> dict:
    """The request's parameters (KServe v2 `parameters`, Triton's own among them); {} when
    it has none or they do not parse."""
    try:
        parameters = json.loads(request.parameters() or "{}")
    except (ValueError, AttributeError):
        return {}
    return parameters if isinstance(parameters, dict) else {}


def is_probe(request: Any, parameters: dict | None = None) -> bool:
    """Whether the request carries {PROBE_PARAMETER: true} among its parameters (the
    watchdog's); `parameters`: request_parameters(request), where already read."""
    return (request_parameters(request) if parameters is None else parameters).get(PROBE_PARAMETER) is True
