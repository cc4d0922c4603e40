"""An OpenVINO IR run by OpenVINO: the file named by the `artifact` parameter, tensor names
from config.pbtxt. efficientnet_lite0_openvino holds a copy of this file (a copy, not a link;
tests/unit/test_model_configs.py keeps the copies equal)."""

import triton_python_backend_utils as pb_utils

from bls_pipeline.adapter.openvino_model import openvino_model

TritonPythonModel = openvino_model(pb_utils)
