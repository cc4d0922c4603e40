"""A python model whose work is one numpy function (the `function` parameter)."""

import triton_python_backend_utils as pb_utils

from bls_pipeline.adapter import function_model

TritonPythonModel = function_model(pb_utils)
