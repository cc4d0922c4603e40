"""The Triton model behind a python child whose work is one numpy function.

    import triton_python_backend_utils as pb_utils
    from bls_pipeline.adapter import function_model
    TritonPythonModel = function_model(pb_utils)

The function is the `function` parameter's (runtime/functions.py). Every request of one
execute() goes to it as one batch per input; its outputs are split back per request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..runtime.functions import FUNCTION_PARAMETER, load_function
from .glue import bridge_logging, freeze_startup_objects, model_parameters, tensor_to_numpy

__all__ = ["function_model"]


def function_model(pb_utils: Any) -> type:
    class TritonPythonModel:
        def initialize(self, args):
            bridge_logging(pb_utils)
            version_dir = Path(args["model_repository"]) / args["model_version"]
            self.fn = load_function(version_dir, model_parameters(args)[FUNCTION_PARAMETER])
            config = json.loads(args["model_config"])
            self.inputs = [t["name"] for t in config["input"]]
            self.outputs = [t["name"] for t in config["output"]]
            freeze_startup_objects()

        def execute(self, requests):
            parts = {n: [tensor_to_numpy(pb_utils.get_input_tensor_by_name(r, n)) for r in requests] for n in self.inputs}
            sizes = [len(a) for a in parts[self.inputs[0]]]
            outputs = self.fn({n: p[0] if len(p) == 1 else np.concatenate(p) for n, p in parts.items()})
            responses, start = [], 0
            for n in sizes:
                tensors = [pb_utils.Tensor(name, np.ascontiguousarray(outputs[name][start:start + n])) for name in self.outputs]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
                start += n
            return responses

    return TritonPythonModel
