"""Baseline ensemble, step 3: softmax + top-k, the same function classify_bls uses."""

import numpy as np
import triton_python_backend_utils as pb_utils

from bls_pipeline import contract
from bls_pipeline.labels import imagenet_labels
from bls_pipeline.postprocess import softmax, top_k
from bls_pipeline.triton_glue import bridge_logging, freeze_startup_objects, model_parameters, tensor_to_numpy


class TritonPythonModel:
    def initialize(self, args):
        bridge_logging(pb_utils)
        self.k = int(model_parameters(args)["default_topk"])
        self.labels = list(imagenet_labels())
        freeze_startup_objects()

    def execute(self, requests):
        logits = [tensor_to_numpy(pb_utils.get_input_tensor_by_name(r, contract.CLASSIFIER_OUTPUT.name)) for r in requests]
        sizes = [len(x) for x in logits]
        top = top_k(softmax(np.concatenate(logits)), self.k, self.labels)
        responses, start = [], 0
        for n in sizes:
            rows = slice(start, start + n)
            start += n
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor(contract.LABELS.name, top.labels[rows]),
                pb_utils.Tensor(contract.SCORES.name, top.scores[rows]),
                pb_utils.Tensor(contract.CLASS_IDS.name, top.class_ids[rows]),
            ]))
        return responses
