"""Tensor names, dtypes and dims: the one source of truth for every model in models/.

tests/unit/test_model_configs.py checks each config.pbtxt and the exported ONNX
against these tables, so a renamed tensor fails a test instead of a request.
Dims exclude the batch dimension (every model here has max_batch_size > 0).
"""

from __future__ import annotations

from .base.tensors import TensorInfo

# classify_bls: encoded images in, top-k predictions out.
IMAGE = TensorInfo("IMAGE", "STRING", (1,))
TOPK = TensorInfo("TOPK", "INT32", (1,), optional=True)
LABELS = TensorInfo("LABELS", "STRING", (-1,))
SCORES = TensorInfo("SCORES", "FP32", (-1,))
CLASS_IDS = TensorInfo("CLASS_IDS", "INT32", (-1,))
ROUTE = TensorInfo("ROUTE", "STRING", (1,))

# Optional: each image's answer (route, labels, its own outputs, its regions) as one UTF-8
# JSON document, for clients that read JSON rather than tensors. Written by the runtime from
# the other outputs (runtime/answer/answer_json.py, which gives its schema); a model that does not
# declare it does not pay for it.
JSON = TensorInfo("JSON", "STRING", (1,))

CLASSIFY_INPUTS = (IMAGE, TOPK)
CLASSIFY_OUTPUTS = (LABELS, SCORES, CLASS_IDS, ROUTE)  # every flow model's
# The outputs the runtime fills, never answer.output(): the four every flow model declares,
# and JSON, which it may declare.
STANDARD_OUTPUTS = tuple(t.name for t in CLASSIFY_OUTPUTS) + (JSON.name,)

# A flow model that answers regions (answer.attach) declares those of these it sends. Per
# image, a variable number of regions R: a request's images are padded to the most regions
# of any of them (boxes 0, labels b"", scores 0, class ids -1, route b""); REGION_COUNT
# says how many of each image's rows are real (Triton's convention for ragged outputs, as
# TensorRT's EfficientNMS: num_detections + padded boxes).
REGION_COUNT = TensorInfo("REGION_COUNT", "INT32", (1,))
REGION_BOXES = TensorInfo("REGION_BOXES", "FP32", (-1, 4))  # x0, y0, x1, y1 in the image's pixels, as sent
REGION_LABELS = TensorInfo("REGION_LABELS", "STRING", (-1, -1))  # (R, k) "score:index:label"
REGION_SCORES = TensorInfo("REGION_SCORES", "FP32", (-1, -1))
REGION_CLASS_IDS = TensorInfo("REGION_CLASS_IDS", "INT32", (-1, -1))
REGION_ROUTE = TensorInfo("REGION_ROUTE", "STRING", (-1,))
REGION_SPECS = (REGION_COUNT, REGION_BOXES, REGION_LABELS, REGION_SCORES, REGION_CLASS_IDS, REGION_ROUTE)
REGION_OUTPUTS = tuple(t.name for t in REGION_SPECS)

# Every classifier (resnet50_trt, resnet50_onnx, ...): preprocessed NCHW in, logits out.
NUM_CLASSES = 1000
CLASSIFIER_INPUT = TensorInfo("input", "FP32", (3, 224, 224))
CLASSIFIER_OUTPUT = TensorInfo("output", "FP32", (NUM_CLASSES,))

BLS_MODEL = "classify_bls"
# An inference request parameter: {"bls_probe": true} marks a request as a health probe (the
# watchdog's). Flow models answer it as any request and keep it out of their bls_* metrics.
PROBE_PARAMETER = "bls_probe"
# Set by bls-serve in the environment of each tritonserver it starts (so of its python stubs):
# how often it started one again after it died on its own. Flow models publish it as the gauge
# bls_server_restarts.
RESTARTS_ENV = "BLS_SERVER_RESTARTS"
# Set by bls-serve likewise: the models on standby, comma-separated. A flow calls each of them
# only when a candidate before it in a list is gone, so its engine (an *_onnx, *_int8 or
# *_openvino model) is held only while calls come (engines/standby.py).
STANDBY_ENV = "BLS_STANDBY_MODELS"
# The request id the watchdog's probes carry, so that what reads Triton's traces (bls-serve's
# latency histograms) leaves them out as the flows leave them out of their metrics.
PROBE_REQUEST_ID = "bls_probe"
# Set by bls-serve likewise: a JSON file it keeps current with every model's state in Triton's
# repository index and, for one that failed to load, why ({"model": {"state": "UNAVAILABLE",
# "reason": "..."}}). A flow whose candidates are not READY reads it to tell a load that failed
# (a broken part: INTERNAL) from a model still to come (UNAVAILABLE) (runtime/load/states_file.py).
MODEL_STATES_ENV = "BLS_MODEL_STATES"
# Set by bls-serve likewise: a Unix datagram socket it reads; each flow instance sends it one
# JSON record per execute() (adapter/records.py), which `bls-explain` joins with Triton's trace
# of each request.
EXECUTIONS_ENV = "BLS_EXECUTIONS_SOCKET"
