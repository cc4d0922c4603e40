"""A torchvision classifier run by torch (on the instance's GPU): the state dict named by the
`artifact` parameter, tensor names from config.pbtxt."""

import triton_python_backend_utils as pb_utils

from bls_pipeline.adapter import torch_model

TritonPythonModel = torch_model(pb_utils)
