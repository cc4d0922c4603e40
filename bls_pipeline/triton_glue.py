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


class PipelineMetrics:
    """classify_bls's custom metrics on Triton's /metrics endpoint (pb_utils.MetricFamily).

    bls_images_total{route}            images answered, by route ("<classifier>:<branch>")
    bls_rejected_images_total{reason}  images in failed requests, by reason
    bls_stage_seconds_total{stage}     seconds in decode_preprocess and classify (child calls)
    bls_executions_total               execute() calls (mean stage latency = seconds / executions)
    Every series also carries model and instance labels (one series per model instance).
    """

    def __init__(self, pb_utils: Any, model: str, instance: str):
        family = pb_utils.MetricFamily
        self._labels = {"model": model, "instance": instance}
        self._families = {
            "images": family(name="bls_images_total", description="Images answered by classify_bls, by route", kind=family.COUNTER),
            "rejected": family(name="bls_rejected_images_total", description="Images in rejected requests, by reason", kind=family.COUNTER),
            "seconds": family(name="bls_stage_seconds_total", description="Seconds spent per pipeline stage", kind=family.COUNTER),
            "executions": family(name="bls_executions_total", description="execute() calls of classify_bls", kind=family.COUNTER),
        }
        self._metrics: dict[tuple, Any] = {}

    def _metric(self, family: str, **labels: str) -> Any:
        key = (family, *sorted(labels.items()))
        if key not in self._metrics:
            self._metrics[key] = self._families[family].Metric(labels={**self._labels, **labels})
        return self._metrics[key]

    def record(self, timings: Any) -> None:
        self._metric("executions").increment(1)
        self._metric("seconds", stage="decode_preprocess").increment(timings.decode_preprocess)
        self._metric("seconds", stage="classify").increment(timings.classify)
        for route, n in timings.routes.items():
            self._metric("images", route=route).increment(n)
        for reason, n in timings.rejected.items():
            self._metric("rejected", reason=reason).increment(n)
