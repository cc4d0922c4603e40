"""An OpenVINO IR run by OpenVINO (efficientnet_lite0_openvino links here): the file named
by the `artifact` parameter, tensor names from config.pbtxt."""

import triton_python_backend_utils as pb_utils

from bls_pipeline.adapter.openvino_model import openvino_model

TritonPythonModel = openvino_model(pb_utils)
