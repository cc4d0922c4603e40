"""Baseline ensemble, step 3: softmax + top-k with the classifier's labels, the same
functions a flow model's answers go through."""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from bls_pipeline.adapter.glue import bridge_logging, freeze_startup_objects, model_parameters, tensor_to_numpy
from bls_pipeline.stages.postprocess import softmax, top_k
from bls_pipeline.runtime.load.children import load_child


class TritonPythonModel:
    def initialize(self, args):
        bridge_logging(pb_utils)
        params = model_parameters(args)
        self.k = int(params["default_topk"])
        repository = Path(args["model_repository"])
        self.labels = load_child(repository.parent, params["classifier"], repository).labels
        self.input = json.loads(args["model_config"])["input"][0]["name"]
        freeze_startup_objects()

    def execute(self, requests):
        logits = [tensor_to_numpy(pb_utils.get_input_tensor_by_name(r, self.input)) for r in requests]
        sizes = [len(x) for x in logits]
        top = top_k(softmax(np.concatenate(logits)), self.k, self.labels)
        responses, start = [], 0
        for n in sizes:
            rows = slice(start, start + n)
            start += n
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("LABELS", top.labels[rows]),
                pb_utils.Tensor("SCORES", top.scores[rows]),
                pb_utils.Tensor("CLASS_IDS", top.class_ids[rows]),
            ]))
        return responses
