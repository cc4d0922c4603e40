"""The CPU engines: an ONNX model run by onnxruntime (the logic behind models/*_onnx and
*_int8, and what LocalFlow runs a child with when its folder holds the ONNX file), and an
OpenVINO IR run by OpenVINO (models/*_openvino)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .artifact_io import Declared, onnx_tensors, openvino_tensors

__all__ = ["ENGINE_SUFFIXES", "OnnxModel", "OpenVinoModel", "open_engine"]

log = logging.getLogger(__name__)

ENGINE_SUFFIXES = (".onnx", ".xml")  # the engine files a CPU engine model's `artifact` names: onnxruntime, OpenVINO


class OnnxModel:
    """One onnxruntime session; `run` takes a whole batch in one call.

    `inputs` and `outputs` are the tensor names the model's config.pbtxt declares; the
    ONNX file must have exactly these, so a renamed tensor fails the load, not a request.
    `declared`: the whole config side (artifact_io.Declared), to compare data types and
    dims as well.
    """

    def __init__(self, model_path: Path, inputs: Sequence[str], outputs: Sequence[str], intra_op_threads: int = 0,
                 allow_spinning: bool = False, memory_arena: bool = True, prepacking: bool = True,
                 declared: Declared | None = None):
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise ImportError("onnxruntime is needed for the CPU models: pip install 'bls-pipeline[serve]'") from exc
        if not Path(model_path).exists():
            raise FileNotFoundError(f"{model_path} is missing: export it with engine_build (python -m engine_build "
                                    "export --help)")
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
        if declared is not None:  # names, data types and dims
            declared.check(Path(model_path).name, onnx_tensors(self._session.get_inputs()),
                           onnx_tensors(self._session.get_outputs()))
        names_in = sorted(i.name for i in self._session.get_inputs())
        names_out = sorted(o.name for o in self._session.get_outputs())
        if names_in != sorted(inputs) or names_out != sorted(outputs):
            raise ValueError(f"{model_path} has inputs {names_in} and outputs {names_out}, but its config.pbtxt "
                             f"declares {sorted(inputs)} and {sorted(outputs)}: re-export it or fix the config")
        self.inputs, self.outputs = tuple(inputs), tuple(outputs)
        log.info("onnxruntime session on %s (intra-op threads: %s)", model_path, intra_op_threads or "one per core")

    def run(self, feeds: dict[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        names = list(outputs or self.outputs)
        return dict(zip(names, self._session.run(names, feeds)))


class OpenVinoModel:
    """An OpenVINO IR (model.xml beside model.bin) compiled for the CPU: the logic behind
    models/*_openvino, with OnnxModel's interface (`run` takes a whole batch in one call).

    `threads` 0 lets OpenVINO use one per core; `precision` "" keeps OpenVINO's choice for
    the CPU (bf16 where the CPU has it, else f32), "f32" forces FP32 arithmetic. An INT8 IR
    (NNCF) runs its quantized layers in INT8 whatever `precision` says.
    """

    def __init__(self, model_path: Path, inputs: Sequence[str], outputs: Sequence[str], threads: int = 0,
                 precision: str = "", declared: Declared | None = None):
        try:
            import openvino as ov
        except ImportError as exc:
            raise ImportError("openvino is needed for the *_openvino models: pip install "
                              "'bls-pipeline[openvino]'") from exc
        model_path = Path(model_path)
        if not model_path.exists() or not model_path.with_suffix(".bin").exists():
            raise FileNotFoundError(f"{model_path} (and its .bin) is missing: build it with engine_build "
                                    "(python -m engine_build openvino --help)")
        core = ov.Core()
        model = core.read_model(os.path.realpath(model_path))
        if declared is not None:  # names, data types and dims
            declared.check(model_path.name, openvino_tensors(model.inputs, inputs),
                           openvino_tensors(model.outputs, outputs))
        names_in = (sorted(n for p in model.inputs for n in p.get_names() if n in inputs)
                    or sorted(p.get_any_name() for p in model.inputs))
        names_out = (sorted(n for p in model.outputs for n in p.get_names() if n in outputs)
                     or sorted(p.get_any_name() for p in model.outputs))
        if names_in != sorted(inputs) or names_out != sorted(outputs):
            raise ValueError(f"{model_path} has inputs {names_in} and outputs {names_out}, but its config.pbtxt "
                             f"declares {sorted(inputs)} and {sorted(outputs)}: rebuild it or fix the config")
        config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"}
        if threads:
            config["INFERENCE_NUM_THREADS"] = str(threads)
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        self._compiled = core.compile_model(model, "CPU", config)
        self._request = self._compiled.create_infer_request()  # one execute() at a time per instance
        self.inputs, self.outputs = tuple(inputs), tuple(outputs)
        log.info("OpenVINO on %s (threads: %s, precision: %s)", model_path, threads or "one per core",
                 self._compiled.get_property("INFERENCE_PRECISION_HINT"))

    def run(self, feeds: dict[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        result = self._request.infer(feeds)
        return {name: result[self._compiled.output(name)] for name in (outputs or self.outputs)}


def open_engine(path: Path, inputs: Sequence[str], outputs: Sequence[str], params: Mapping[str, str],
                declared: Declared | None = None) -> OnnxModel | OpenVinoModel:
    """The engine a CPU engine model runs for `path` (an IR, .xml: OpenVINO; else
    onnxruntime), set up by its config.pbtxt's parameters: what the served model's adapter
    opens, and what a tool measuring that model (bls-bench's peer, engine_build accuracy)
    opens in process."""
    if Path(path).suffix == ".xml":
        return OpenVinoModel(path, inputs, outputs, threads=int(params.get("inference_threads", "0")),
                             precision=params.get("inference_precision", ""), declared=declared)
    return OnnxModel(path, inputs, outputs, intra_op_threads=int(params.get("intra_op_threads", "0")),
                     allow_spinning=params.get("allow_spinning", "0") == "1",
                     memory_arena=params.get("memory_arena", "1") == "1",
                     prepacking=params.get("prepack_weights", "1") == "1", declared=declared)
