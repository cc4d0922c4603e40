"""An ONNX model run by onnxruntime (efficientnet_lite0_onnx links here): the file named by
the `artifact` parameter, tensor names from config.pbtxt."""

import triton_python_backend_utils as pb_utils

from bls_pipeline.adapter import onnx_model

TritonPythonModel = onnx_model(pb_utils)
