"""A flow model: the logic is flow.py beside this file; bls_pipeline runs it inside Triton."""

import triton_python_backend_utils as pb_utils

from bls_pipeline.adapter import flow_model

TritonPythonModel = flow_model(pb_utils)
