"""The Triton model behind a python child whose work is one numpy function.

    import triton_python_backend_utils as pb_utils
    from bls_pipeline.adapter import function_model
    TritonPythonModel = function_model(pb_utils)

The function is the `function` parameter's (engines/functions.py). Every request of one
execute() goes to it as one batch per input; its outputs are split back per request. Outputs
that break the config's contract (a missing one, a wrong shape or data type) fail every
request of the execute() as INTERNAL, naming the function and what it returned: whoever
calls the model, a flow or a client, is told it is broken.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..engines.functions import FUNCTION_PARAMETER, check_outputs, load_function
from .glue import bridge_logging, declared_outputs, freeze_startup_objects, model_parameters, tensor_to_numpy

__all__ = ["function_model"]

log = logging.getLogger(__name__)


def function_model(pb_utils: Any) -> type:
    class TritonPythonModel:
        def initialize(self, args):
            bridge_logging(pb_utils)
            version_dir = Path(args["model_repository"]) / args["model_version"]
            self.spec = model_parameters(args)[FUNCTION_PARAMETER]
            self.fn = load_function(version_dir, self.spec)
            config = json.loads(args["model_config"])
            self.name = args["model_name"]
            self.inputs = [t["name"] for t in config["input"]]
            self.outputs = declared_outputs(args)
            freeze_startup_objects()

        def execute(self, requests):
            parts = {n: [tensor_to_numpy(pb_utils.get_input_tensor_by_name(r, n)) for r in requests]
                     for n in self.inputs}
            sizes = [len(a) for a in parts[self.inputs[0]]]
            outputs = self.fn({n: p[0] if len(p) == 1 else np.concatenate(p) for n, p in parts.items()})
            broken = check_outputs(outputs, self.outputs, sum(sizes))
            if broken is not None:
                message = f"{self.name} {broken} (function {self.spec})"
                log.error("%s", message)
                error = pb_utils.TritonError(message, pb_utils.TritonError.INTERNAL)
                return [pb_utils.InferenceResponse(error=error) for _ in requests]
            responses, start = [], 0
            for n in sizes:
                tensors = [pb_utils.Tensor(o.name, np.ascontiguousarray(outputs[o.name][start:start + n]))
                           for o in self.outputs]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
                start += n
            return responses

    return TritonPythonModel
