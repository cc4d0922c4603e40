"""Triton adapter for classify_bls: pb_utils in and out, bls_pipeline does the work.

Images of all requests in one execute() become one batch and ONE child request per
classifier call (bls_pipeline/pipeline.py); a bad image fails only its own request.
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from bls_pipeline import contract
from bls_pipeline.config import load_classifier_info, parse_pipeline_config
from bls_pipeline.labels import imagenet_labels
from bls_pipeline.pipeline import ImageRequest, Pipeline, Prediction
from bls_pipeline.triton_glue import PipelineMetrics, bridge_logging, freeze_startup_objects, infer_child, model_parameters


class TritonPythonModel:
    def initialize(self, args):
        bridge_logging(pb_utils)
        config = parse_pipeline_config(model_parameters(args))
        repo = Path(args["model_repository"]).parent
        classifiers = {name: load_classifier_info(repo, name) for name in config.classifiers + config.cascade_classifiers}
        instances = sum(g.get("count", 1) for g in json.loads(args["model_config"]).get("instance_group", [])) or 1
        self.pipeline = Pipeline(config, classifiers, list(imagenet_labels()), is_ready=pb_utils.is_model_ready,
                                 instances=instances)
        self.metrics = PipelineMetrics(pb_utils, args["model_name"], args["model_instance_name"])
        freeze_startup_objects()

    def execute(self, requests):
        inputs = [self._read(r) for r in requests]
        results, timings = self.pipeline.run(inputs, self._infer)
        self.metrics.record(timings)
        responses = [self._respond(res, set(r.requested_output_names())) for res, r in zip(results, requests)]
        assert len(responses) == len(requests), "one response per request"
        return responses

    def finalize(self):
        self.metrics.flush()
        self.pipeline.close()

    # ---- pb_utils <-> bls_pipeline ----------------------------------------------------
    @staticmethod
    def _read(request) -> ImageRequest:
        image = pb_utils.get_input_tensor_by_name(request, contract.IMAGE.name)
        topk = pb_utils.get_input_tensor_by_name(request, contract.TOPK.name)
        return ImageRequest(
            images=[] if image is None else list(image.as_numpy().reshape(-1)),  # none: the pipeline says so
            topk=None if topk is None else tuple(int(k) for k in topk.as_numpy().reshape(-1)),
        )

    @staticmethod
    def _infer(model: str, batch: np.ndarray) -> np.ndarray:
        return infer_child(pb_utils, model, contract.CLASSIFIER_INPUT.name, contract.CLASSIFIER_OUTPUT.name, batch)

    @staticmethod
    def _respond(result, wanted: set[str]):
        """Only the outputs the client asked for (Triton lists all of them when it named none)."""
        if not isinstance(result, Prediction):
            code = pb_utils.TritonError.UNAVAILABLE if result.reason == "classifier" else pb_utils.TritonError.INVALID_ARG
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(result.message, code))
        outputs = ((contract.LABELS, result.labels), (contract.SCORES, result.scores),
                   (contract.CLASS_IDS, result.class_ids), (contract.ROUTE, result.routes))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(o.name, value) for o, value in outputs if o.name in wanted])
