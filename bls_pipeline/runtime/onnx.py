"""An ONNX model run by onnxruntime on CPU: the logic behind models/*_onnx, and what
LocalFlow runs a child with when its folder holds the ONNX file."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["OnnxModel"]

log = logging.getLogger(__name__)


class OnnxModel:
    """One onnxruntime session; `run` takes a whole batch in one call.

    `inputs` and `outputs` are the tensor names the model's config.pbtxt declares; the
    ONNX file must have exactly these, so a renamed tensor fails the load, not a request.
    """

    def __init__(self, model_path: Path, inputs: Sequence[str], outputs: Sequence[str], intra_op_threads: int = 0,
                 allow_spinning: bool = False, memory_arena: bool = True, prepacking: bool = True):
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise ImportError("onnxruntime is needed for the CPU models: pip install 'bls-pipeline[serve]'") from exc
        if not Path(model_path).exists():
            raise FileNotFoundError(f"{model_path} is missing: export it with engine_build (python -m engine_build export --help)")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Spinning worker threads burn the cores that decode/preprocess (other stubs) need.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if allow_spinning else "0")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # The arena keeps the activations of the largest batch seen, and the memory pattern
        # plans them ahead; prepacking keeps a second, GEMM-ready copy of weights. Each buys
        # speed with resident memory; the model's config says which it wants.
        opts.enable_cpu_mem_arena = memory_arena
        opts.enable_mem_pattern = memory_arena
        if not prepacking:
            opts.add_session_config_entry("session.disable_prepacking", "1")
        # The real path: onnxruntime (>= 1.30) refuses external data outside the directory of
        # the file it is given after resolving links, so a linked model.onnx is opened where
        # it lies, beside its model.onnx.data.
        real = os.path.realpath(model_path)
        self._session = ort.InferenceSession(real, sess_options=opts, providers=["CPUExecutionProvider"])
        names_in = sorted(i.name for i in self._session.get_inputs())
        names_out = sorted(o.name for o in self._session.get_outputs())
        if names_in != sorted(inputs) or names_out != sorted(outputs):
            raise ValueError(f"{model_path} has inputs {names_in} and outputs {names_out}, but its config.pbtxt declares "
                             f"{sorted(inputs)} and {sorted(outputs)}: re-export it or fix the config")
        self.inputs, self.outputs = tuple(inputs), tuple(outputs)
        log.info("onnxruntime session on %s (intra-op threads: %s)", model_path, intra_op_threads or "one per core")

    def run(self, feeds: dict[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        names = list(outputs or self.outputs)
        return dict(zip(names, self._session.run(names, feeds)))
