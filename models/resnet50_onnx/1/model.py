"""Triton adapter for the *_onnx classifiers (efficientnet_lite0_onnx links here): one
onnxruntime run per execute() batch, the model file named by the `artifact` parameter."""

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from bls_pipeline import contract
from bls_pipeline.onnx_classifier import OnnxClassifier
from bls_pipeline.triton_glue import bridge_logging, freeze_startup_objects, model_parameters, tensor_from_numpy, tensor_to_numpy


class TritonPythonModel:
    def initialize(self, args):
        bridge_logging(pb_utils)
        params = model_parameters(args)
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self.classifier = OnnxClassifier(
            version_dir / params["artifact"],
            intra_op_threads=int(params.get("intra_op_threads", "0")),
            allow_spinning=params.get("allow_spinning", "0") == "1",
        )
        freeze_startup_objects()

    def execute(self, requests):
        arrays = [tensor_to_numpy(pb_utils.get_input_tensor_by_name(r, contract.CLASSIFIER_INPUT.name)) for r in requests]
        sizes = [len(a) for a in arrays]
        batch = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        logits = self.classifier.run(batch)
        assert len(logits) == sum(sizes), "output batch must equal the summed input batch"
        responses, start = [], 0
        for n in sizes:
            out = tensor_from_numpy(pb_utils, contract.CLASSIFIER_OUTPUT.name, logits[start:start + n])
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            start += n
        return responses
