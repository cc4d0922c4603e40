"""An ONNX model run by onnxruntime: the file named by the `artifact` parameter, tensor names
from config.pbtxt. Every ONNX model's folder holds a copy of this file (a copy, not a link: a
folder copied from one is its own; tests/unit/test_model_configs.py keeps the copies equal)."""

import triton_python_backend_utils as pb_utils

from bls_pipeline.adapter import onnx_model

TritonPythonModel = onnx_model(pb_utils)
