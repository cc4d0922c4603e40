"""Baseline ensemble, step 1: bls_pipeline's decode + preprocess, one batch per execute()."""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import triton_python_backend_utils as pb_utils

from bls_pipeline.adapter.glue import bridge_logging, freeze_startup_objects, model_parameters, tensor_from_numpy
from bls_pipeline.stages.batching import decode_to_batch
from bls_pipeline.stages.decode import DecodePolicy
from bls_pipeline.runtime.load.children import load_child


class TritonPythonModel:
    def initialize(self, args):
        bridge_logging(pb_utils)
        classifier = load_child(Path(args["model_repository"]).parent, model_parameters(args)["classifier"],
                                Path(args["model_repository"]))
        self.spec = classifier.preprocess
        config = json.loads(args["model_config"])
        self.image, self.output = config["input"][0]["name"], config["output"][0]["name"]
        self.policy = DecodePolicy()
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="decode")
        freeze_startup_objects()

    def execute(self, requests):
        images = [list(pb_utils.get_input_tensor_by_name(r, self.image).as_numpy().reshape(-1)) for r in requests]
        decoded = decode_to_batch(images, self.policy, self.spec, self.pool)
        responses = []
        for r in range(len(requests)):
            if r in decoded.errors:
                msg = f"IMAGE[{decoded.bad_index[r]}]: {decoded.errors[r]}"
                error = pb_utils.TritonError(msg, pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                rows = decoded.batch[decoded.owners == r]
                tensor = tensor_from_numpy(pb_utils, self.output, rows)
                responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses

    def finalize(self):
        self.pool.shutdown()
