"""The few helpers models/*/model.py share to talk to the python backend.

`pb_utils` (triton_python_backend_utils) exists only inside the Triton python stub, so
it is passed in rather than imported: this module imports cleanly anywhere, and
nothing here pretends to be pb_utils.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import numpy as np

from .pipeline import ChildCallError

__all__ = ["bridge_logging", "infer_child", "model_parameters", "tensor_from_numpy", "tensor_to_numpy"]


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
    """numpy -> pb_utils.Tensor through DLPack (torch.from_numpy shares the buffer). Not
    numpy's own DLPack: the python backend renames the capsule it consumes in a way
    numpy 1.x's capsule destructor rejects, which took the stub down when tried here."""
    import torch

    from torch.utils.dlpack import to_dlpack

    return pb_utils.Tensor.from_dlpack(name, to_dlpack(torch.from_numpy(np.ascontiguousarray(array))))


def tensor_to_numpy(tensor: Any) -> np.ndarray:
    """pb_utils.Tensor -> numpy through DLPack: numpy's own for CPU tensors (a view, no
    copy); CUDA tensors go through torch and are copied to host."""
    if tensor.is_cpu():
        return np.from_dlpack(tensor)
    from torch.utils.dlpack import from_dlpack

    return from_dlpack(tensor.to_dlpack()).cpu().numpy()


def infer_child(pb_utils: Any, model: str, input_name: str, output_name: str, batch: np.ndarray) -> np.ndarray:
    """One BLS child request: `batch` in through DLPack, `output_name` back as numpy the
    caller owns. A failed call raises pipeline.ChildCallError with the server's message."""
    request = pb_utils.InferenceRequest(model_name=model, requested_output_names=[output_name],
                                        inputs=[tensor_from_numpy(pb_utils, input_name, batch)])
    response = request.exec()
    if response.has_error():
        raise ChildCallError(response.error().message())
    output = pb_utils.get_output_tensor_by_name(response, output_name)
    return tensor_to_numpy(output).copy()  # own it: the response's buffer goes away


class PipelineMetrics:
    """classify_bls's custom metrics on Triton's /metrics endpoint (pb_utils.MetricFamily).

    bls_images_total{route}            images answered, by route ("<classifier>:<branch>")
    bls_rejected_images_total{reason}  images in failed requests, by reason
    bls_stage_seconds_total{stage}     seconds in decode_preprocess and classify (child calls)
    bls_executions_total               execute() calls (mean stage latency = seconds / executions)
    Every series also carries model and instance labels (one series per model instance).

    Each Metric.increment is a round trip to the Triton process, so counts accumulate
    here and go out at most every `flush_s` (and at finalize): the endpoint lags by up
    to that much, and execute() stays ~2 ms faster at concurrency 1.
    """

    def __init__(self, pb_utils: Any, model: str, instance: str, flush_s: float = 0.5):
        family = pb_utils.MetricFamily
        self._labels = {"model": model, "instance": instance}
        self._families = {
            "images": family(name="bls_images_total", description="Images answered by classify_bls, by route", kind=family.COUNTER),
            "rejected": family(name="bls_rejected_images_total", description="Images in rejected requests, by reason", kind=family.COUNTER),
            "seconds": family(name="bls_stage_seconds_total", description="Seconds spent per pipeline stage", kind=family.COUNTER),
            "executions": family(name="bls_executions_total", description="execute() calls of classify_bls", kind=family.COUNTER),
        }
        self._metrics: dict[tuple, Any] = {}
        self._pending: dict[tuple, float] = {}
        self._flush_s = flush_s
        self._flushed_at = time.monotonic()

    def _add(self, family: str, value: float, **labels: str) -> None:
        key = (family, *sorted(labels.items()))
        self._pending[key] = self._pending.get(key, 0.0) + value

    def record(self, timings: Any) -> None:
        self._add("executions", 1)
        self._add("seconds", timings.decode_preprocess, stage="decode_preprocess")
        self._add("seconds", timings.classify, stage="classify")
        for route, n in timings.routes.items():
            self._add("images", n, route=route)
        for reason, n in timings.rejected.items():
            self._add("rejected", n, reason=reason)
        if time.monotonic() - self._flushed_at >= self._flush_s:
            self.flush()

    def flush(self) -> None:
        for key, value in self._pending.items():
            if key not in self._metrics:
                family, *labels = key
                self._metrics[key] = self._families[family].Metric(labels={**self._labels, **dict(labels)})
            self._metrics[key].increment(value)
        self._pending.clear()
        self._flushed_at = time.monotonic()


def freeze_startup_objects() -> None:
    """Call at the end of initialize(): move everything imported so far (torch's millions
    of objects) out of the garbage collector's reach. Without it, the full collections
    that tensor/capsule allocations trigger walk all of them: measured here as ~11 ms
    added to every classify_bls execute() on average."""
    import gc

    import torch  # noqa: F401 - the DLPack glue imports it at the first request anyway: freeze it too

    gc.collect()
    gc.freeze()
