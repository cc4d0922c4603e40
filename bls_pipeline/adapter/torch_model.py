"""The Triton model behind every *_torch folder: one torch run per execute() batch.

    import triton_python_backend_utils as pb_utils
    from bls_pipeline.adapter import torch_model
    TritonPythonModel = torch_model(pb_utils)

On a KIND_GPU instance the model runs on that GPU: inputs that arrive in GPU memory (a flow
on the GPU, with FORCE_CPU_ONLY_INPUT_TENSORS "no") are used where they are, the others
are copied over; the logits go back as CUDA tensors through DLPack, so a flow that asked
for them in GPU memory gets them without a trip to the host. torch is imported at load,
not when this module is imported (CPU stubs import the adapter package too).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from .glue import (bridge_logging, freeze_startup_objects, instance_device, model_parameters, tensor_from_numpy,
                   tensor_to_array)

__all__ = ["torch_model"]

log = logging.getLogger(__name__)


def torch_model(pb_utils: Any) -> type:
    class TritonPythonModel:
        def initialize(self, args):
            from ..engines.torch_classifier import TorchClassifier, TorchSettings

            bridge_logging(pb_utils)
            config = json.loads(args["model_config"])
            settings = TorchSettings.parse(model_parameters(args), args["model_name"])
            (tensor_in,), (tensor_out,) = config["input"], config["output"]
            self.input, self.output = tensor_in["name"], tensor_out["name"]
            self.name = args["model_name"]
            self._seen: set[str] = set()  # where inputs arrived from, said once each in the log
            self.model = TorchClassifier(Path(args["model_repository"]) / args["model_version"] / settings.artifact,
                                         settings, instance_device(args) or "cpu", int(config["max_batch_size"]),
                                         tuple(int(d) for d in tensor_in["dims"]))
            freeze_startup_objects()

        def execute(self, requests):
            import torch

            arrays = [tensor_to_array(pb_utils.get_input_tensor_by_name(r, self.input)) for r in requests]
            for array in arrays:
                where = "GPU" if getattr(array, "is_cuda", False) else "CPU"
                if where not in self._seen:
                    self._seen.add(where)
                    log.info("%s: inputs arrive in %s memory%s", self.name, where,
                             " (DLPack, no copy)" if where == "GPU" else "")
            parts = [self.model.as_input(a) for a in arrays]
            sizes = [len(p) for p in parts]
            logits = self.model(parts[0] if len(parts) == 1 else torch.cat(parts))
            assert len(logits) == sum(sizes), "output batch must equal the summed input batch"
            responses, start = [], 0
            for n in sizes:
                rows = logits[start:start + n]
                value = rows if rows.is_cuda else rows.numpy()
                tensor = tensor_from_numpy(pb_utils, self.output, value)
                responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
                start += n
            return responses

    return TritonPythonModel
