"""One stand-in model for every hop of classify_bls and of the ensemble, doing no work.

`bls-overhead` (bls_pipeline/overhead.py) copies it into each probe model's version
folder; the config parameter `role` says which hop it plays:

    classifier  FP32 batch in -> zero logits out, after holding each execute() `hold_ms`:
                asleep (hold_mode "sleep"), or reading 128 MB, as a CPU classifier streams
                its weights through the caches (hold_mode "stream")
    stub        IMAGE in -> zero logits out: a python model answering the client, nothing else
    bls         IMAGE in -> zero batch -> ONE child call to probe_classifier with every
                flow model's own child-call code (adapter.transport) -> its logits out
    prep        IMAGE in -> zero batch out: the ensemble's first step (probe_ensemble)
"""

import time

import numpy as np
import triton_python_backend_utils as pb_utils

from bls_pipeline.adapter.glue import freeze_startup_objects, model_parameters
from bls_pipeline.adapter.transport import TritonTransport
from bls_pipeline.contract import CLASSIFIER_INPUT, CLASSIFIER_OUTPUT, IMAGE, NUM_CLASSES
from bls_pipeline.runtime.call.calls import ChildRequest
from bls_pipeline.runtime.errors import ChildCallError

CHILD = "probe_classifier"


class TritonPythonModel:
    def initialize(self, args):
        params = model_parameters(args)
        self.role = params["role"]
        self.hold_s = float(params.get("hold_ms", "0")) / 1e3
        # hold_mode "stream": 128 MB read one float per 64-byte cache line, in 2 MB parts
        self.parts = (np.array_split(np.ones(32_000_000, np.float32)[::16], 64)
                      if params.get("hold_mode") == "stream" else None)
        self.transport = TritonTransport(pb_utils)
        freeze_startup_objects()  # as classify_bls does

    def execute(self, requests):
        if self.role == "classifier" and self.hold_s:
            self._hold()
        return [self._answer(r) for r in requests]

    def _hold(self):
        if self.parts is None:
            time.sleep(self.hold_s)
            return
        end = time.perf_counter() + self.hold_s
        while True:
            for part in self.parts:
                part.sum()
                if time.perf_counter() >= end:
                    return

    def _answer(self, request):
        if self.role == "classifier":
            n = len(pb_utils.get_input_tensor_by_name(request, CLASSIFIER_INPUT.name).as_numpy())
            return _response(CLASSIFIER_OUTPUT.name, np.zeros((n, NUM_CLASSES), np.float32))
        n = len(pb_utils.get_input_tensor_by_name(request, IMAGE.name).as_numpy())
        if self.role == "stub":
            return _response(CLASSIFIER_OUTPUT.name, np.zeros((n, NUM_CLASSES), np.float32))
        batch = np.zeros((n, *CLASSIFIER_INPUT.dims), np.float32)
        if self.role == "prep":
            return _response(CLASSIFIER_INPUT.name, batch)
        (reply,) = self.transport.send([ChildRequest(CHILD, {CLASSIFIER_INPUT.name: batch}, (CLASSIFIER_OUTPUT.name,))])
        if isinstance(reply, ChildCallError):
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(reply)))
        return _response(CLASSIFIER_OUTPUT.name, reply[CLASSIFIER_OUTPUT.name])


def _response(name, array):
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, array)])
