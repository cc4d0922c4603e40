"""Tensor names, dtypes and dims: the one source of truth for every model in models/.

tests/unit/test_model_configs.py checks each config.pbtxt and the exported ONNX
against these tables, so a renamed tensor fails a test instead of a request.
Dims exclude the batch dimension (every model here has max_batch_size > 0).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # Triton config data_type without the TYPE_ prefix
    dims: tuple[int, ...]
    optional: bool = False


# classify_bls: encoded images in, top-k predictions out.
IMAGE = TensorSpec("IMAGE", "STRING", (1,))
TOPK = TensorSpec("TOPK", "INT32", (1,), optional=True)
LABELS = TensorSpec("LABELS", "STRING", (-1,))
SCORES = TensorSpec("SCORES", "FP32", (-1,))
CLASS_IDS = TensorSpec("CLASS_IDS", "INT32", (-1,))
ROUTE = TensorSpec("ROUTE", "STRING", (1,))

CLASSIFY_INPUTS = (IMAGE, TOPK)
CLASSIFY_OUTPUTS = (LABELS, SCORES, CLASS_IDS, ROUTE)

# Every classifier (resnet50_trt, resnet50_onnx, ...): preprocessed NCHW in, logits out.
NUM_CLASSES = 1000
CLASSIFIER_INPUT = TensorSpec("input", "FP32", (3, 224, 224))
CLASSIFIER_OUTPUT = TensorSpec("output", "FP32", (NUM_CLASSES,))

BLS_MODEL = "classify_bls"
