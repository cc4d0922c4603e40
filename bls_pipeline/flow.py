"""The flow API: write a model's conditional multi-model logic as one Python function.

A flow model is a folder in the model repository:

    models/<name>/config.pbtxt    IMAGE (+ TOPK) in; LABELS, SCORES, CLASS_IDS, ROUTE out;
                                  backend "python"; its settings as `parameters`
    models/<name>/1/model.py      the same three lines in every flow folder
    models/<name>/1/flow.py       the logic:

        import numpy as np
        from bls_pipeline.flow import Answer, Batch, Candidates, NoModelReady, Settings

        CATS = [281, 282, 283, 284, 285]  # ImageNet's cats

        class CatSettings(Settings):
            cheap: Candidates = "efficientnet_lite0_trt,efficientnet_lite0_onnx"
            expert: Candidates = "resnet50_trt,resnet50_onnx"

        def flow(batch: Batch, settings: CatSettings) -> Answer:
            answer = batch.answer()
            first = batch.classify(settings.cheap)                  # every image, one call
            if first is None:                                       # no candidate READY
                raise NoModelReady
            answer.set(first, "first_look")
            cats = np.isin(first.top1_class, CATS)
            second = batch.classify(settings.expert, rows=cats)     # the cats only, one call
            if second is not None:
                answer.set(second, "second_opinion")
            return answer

The flow gets every image of every request in one execute() as the rows of `batch`.
`batch.classify` and `batch.infer` call a model (the first READY of a Candidates list) on
all rows or a selection, as one batched child request; `batch.together` runs several
calls concurrently. The runtime does the rest: decoding and per-image errors, each
model's own preprocessing (from its config.pbtxt), DLPack, chunking at max_batch_size,
rerouting around a model that went away, top-k and labels, metrics.

`LocalFlow` runs the same folder in-process, for tests: `classify(images)` sends one
request, `run([ImageRequest(images, topk), ...])` several at once, as one execute() gets
them, each answered by a Prediction or failed with a RequestError. docs/extending.md is the
guide.
"""

from .runtime.call.batch import Answer, Batch, ChildCallError, Classify, FlowError, Infer, NoModelReady, Outputs, Scores
from .runtime.local import LocalFlow, RequestFailed
from .runtime.load.parameters import Parameters
from .runtime.results import ImageRequest, Prediction, RequestError
from .runtime.load.fields import Candidates, Probability
from .runtime.load.settings import Settings

__all__ = [
    "Answer",
    "Batch",
    "Candidates",
    "ChildCallError",
    "Classify",
    "FlowError",
    "ImageRequest",
    "Infer",
    "LocalFlow",
    "NoModelReady",
    "Outputs",
    "Parameters",
    "Prediction",
    "Probability",
    "RequestError",
    "RequestFailed",
    "Scores",
    "Settings",
]
