"""An ONNX classifier run by onnxruntime on CPU: the logic behind models/*_onnx."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from .contract import CLASSIFIER_INPUT, CLASSIFIER_OUTPUT

__all__ = ["OnnxClassifier"]

log = logging.getLogger(__name__)


class OnnxClassifier:
    """One onnxruntime session; `run` takes the whole execute() batch in one call."""

    def __init__(self, model_path: Path, intra_op_threads: int = 0, allow_spinning: bool = False):
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise ImportError("onnxruntime is needed for the CPU classifier: pip install 'bls-pipeline[serve]'") from exc
        if not Path(model_path).exists():
            raise FileNotFoundError(f"{model_path} is missing: export it with `python -m engine_build export --model ...`")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Spinning worker threads burn the cores that decode/preprocess (other stubs) need.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if allow_spinning else "0")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(str(model_path), sess_options=opts, providers=["CPUExecutionProvider"])
        names_in = [i.name for i in self._session.get_inputs()]
        names_out = [o.name for o in self._session.get_outputs()]
        if names_in != [CLASSIFIER_INPUT.name] or names_out != [CLASSIFIER_OUTPUT.name]:
            raise ValueError(f"{model_path} has inputs {names_in} and outputs {names_out}; expected "
                             f"[{CLASSIFIER_INPUT.name!r}] -> [{CLASSIFIER_OUTPUT.name!r}]: re-export with engine_build")
        log.info("onnxruntime session on %s (intra-op threads: %s)", model_path, intra_op_threads or "one per core")

    def run(self, batch: np.ndarray) -> np.ndarray:
        return self._session.run([CLASSIFIER_OUTPUT.name], {CLASSIFIER_INPUT.name: batch})[0]
