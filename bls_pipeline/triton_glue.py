"""The few helpers models/*/model.py share to talk to the python backend.

`pb_utils` (triton_python_backend_utils) exists only inside the Triton python stub, so
it is passed in rather than imported: this module imports cleanly anywhere, and
nothing here pretends to be pb_utils.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

__all__ = ["bridge_logging", "model_parameters", "tensor_from_numpy", "tensor_to_numpy"]


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


def tensor_from_numpy(pb_utils: Any, name: str, array: np.ndarray) -> Any:
    """numpy -> pb_utils.Tensor through DLPack (torch.from_numpy shares the buffer)."""
    import torch

    return pb_utils.Tensor.from_dlpack(name, torch.from_numpy(np.ascontiguousarray(array)))


def tensor_to_numpy(tensor: Any) -> np.ndarray:
    """pb_utils.Tensor (CPU or CUDA) -> numpy through DLPack; CUDA data is copied to host."""
    import torch

    t = torch.from_dlpack(tensor.to_dlpack())
    return t.numpy() if t.device.type == "cpu" else t.cpu().numpy()
