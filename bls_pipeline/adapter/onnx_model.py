"""The Triton model behind every *_onnx and *_int8 folder: one onnxruntime run per execute() batch.

    import triton_python_backend_utils as pb_utils
    from bls_pipeline.adapter import onnx_model
    TritonPythonModel = onnx_model(pb_utils)

The ONNX file is the `artifact` parameter's, in the version folder; its inputs and outputs
(names, data types, dims) are checked against the model's own config.pbtxt at load.

A model bls-serve names on standby (STANDBY_ENV: a fallback that a flow calls only when a
candidate before it is gone) holds its engine only while calls come (engines/standby.py).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..contract import STANDBY_ENV
from ..runtime import hooks
from ..base.dtypes import numpy_dtype
from ..engines.artifact_io import Declared
from ..engines.artifact_io import exported_weights
from ..engines.onnx import open_engine
from ..engines.standby import StandbyEngine
from .glue import bridge_logging, freeze_startup_objects, is_probe, model_parameters, tensor_from_numpy, tensor_to_numpy

log = logging.getLogger(__name__)

__all__ = ["onnx_model"]


def onnx_model(pb_utils: Any) -> type:
    return batch_model(pb_utils, "onnxruntime")


def batch_model(pb_utils: Any, stage: str) -> type:
    """A Triton model that runs its artifact's engine (engines.onnx.open_engine: onnxruntime
    here, OpenVINO in openvino_model) once per execute() batch, timed as `stage`. The engine
    compares its file with the config at load: a difference fails the load, naming the
    tensor and both sides."""

    class TritonPythonModel:
        def initialize(self, args):
            bridge_logging(pb_utils)
            params = model_parameters(args)
            declared = Declared.from_json(args["model_config"])
            self.inputs, self.outputs = declared.names
            path = Path(args["model_repository"]) / args["model_version"] / params["artifact"]
            if exported_weights(path) == "random":
                log.warning("%s: %s was exported with random weights: its answers mean nothing; export it with real "
                            "weights (python -m engine_build export --help)", args["model_name"], path.name)
            self._released = threading.Event()
            if args["model_name"] in os.environ.get(STANDBY_ENV, "").split(","):
                self.model = StandbyEngine(args["model_name"],
                                           lambda: open_engine(path, *declared.names, params, declared),
                                           float(params.get("standby_release_s", "30")))
                threading.Thread(target=self._release_when_idle, name="bls-standby", daemon=True).start()
            else:
                self.model = open_engine(path, *declared.names, params, declared)
            self._probe_answer = {t.name: np.zeros([1, *(max(d, 1) for d in t.dims)], numpy_dtype(t.dtype))
                                  for t in declared.outputs}
            freeze_startup_objects()

        def _release_when_idle(self):
            period = min(5.0, max(self.model.release_after_s / 4, 0.1))
            while not self._released.wait(period):
                self.model.release_if_idle()

        def finalize(self):
            self._released.set()

        def execute(self, requests):
            if isinstance(self.model, StandbyEngine) and all(map(is_probe, requests)):
                # The watchdog's probes find a standby's stub alive; they neither open its
                # engine nor keep it open (its calls judge it).
                return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, v)
                                                                   for n, v in self._probe_answer.items()])
                        for _ in requests]
            feeds = {name: [tensor_to_numpy(pb_utils.get_input_tensor_by_name(r, name)) for r in requests]
                     for name in self.inputs}
            sizes = [len(a) for a in feeds[self.inputs[0]]]
            with hooks.stage(stage):
                outputs = self.model.run({name: parts[0] if len(parts) == 1 else np.concatenate(parts)
                                          for name, parts in feeds.items()})
            assert all(len(v) == sum(sizes) for v in outputs.values()), "output batch must equal the summed input batch"
            responses, start = [], 0
            for n in sizes:
                tensors = [tensor_from_numpy(pb_utils, name, outputs[name][start:start + n]) for name in self.outputs]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
                start += n
            return responses

    return TritonPythonModel
