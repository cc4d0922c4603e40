"""classify_peer: classify_bls's work for one classifier, with no child call.

One python model that decodes, preprocesses, runs the classifier's engine in its own
process (the engine's file and settings read from the classifier's folder, as its own
adapter reads them) and answers top-k labels, all in execute(). bls-bench serves it as the
peer of classify_bls on the same engine: what the BLS hop to a separate classifier model
costs, against doing everything in one process. The stages are the library's own (decode,
preprocess, softmax, top-k): only where the classifier runs differs.
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from bls_pipeline.adapter.glue import bridge_logging, freeze_startup_objects, model_parameters
from bls_pipeline.runtime.load.children import load_child, version_folders
from bls_pipeline.runtime.call.in_process import open_model_engine
from bls_pipeline.stages.batching import decode_to_batch
from bls_pipeline.stages.decode import DecodePolicy
from bls_pipeline.stages.postprocess import softmax, top_k


class TritonPythonModel:
    def initialize(self, args):
        bridge_logging(pb_utils)
        params = model_parameters(args)
        repo = Path(args["model_repository"]).parent
        self.classifier = load_child(repo, params["engine"])
        self.input, self.output = self.classifier.image.name, self.classifier.scores_output.name
        # The classifier's engine as its model's adapter opens it (its settings, its file checked).
        self.engine = open_model_engine(repo / params["engine"], version_folders(repo / params["engine"])[0])
        self.labels = list(self.classifier.labels)
        self.topk = int(params.get("default_topk", "5"))
        self.image = json.loads(args["model_config"])["input"][0]["name"]
        self.policy = DecodePolicy()
        freeze_startup_objects()

    def execute(self, requests):
        images = [list(pb_utils.get_input_tensor_by_name(r, self.image).as_numpy().reshape(-1)) for r in requests]
        decoded = decode_to_batch(images, self.policy, self.classifier.preprocess, None)
        if len(decoded.batch):
            best = top_k(softmax(self.engine.run({self.input: decoded.batch})[self.output]), self.topk, self.labels)
        responses = []
        for r in range(len(requests)):
            if r in decoded.errors:
                error = pb_utils.TritonError(f"IMAGE[{decoded.bad_index[r]}]: {decoded.errors[r]}",
                                             pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                rows = best.labels[decoded.owners == r]
                labels = pb_utils.Tensor("LABELS", np.asarray(rows, dtype=object))
                responses.append(pb_utils.InferenceResponse(output_tensors=[labels]))
        return responses
