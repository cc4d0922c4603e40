"""The Triton-facing glue: what models/*/1/model.py hands over to (pb_utils passed in).

    flow_model(pb_utils)       every flow folder (models/classify_bls, ...): runs its flow.py
    onnx_model(pb_utils)       every *_onnx folder: onnxruntime on the folder's ONNX file
    torch_model(pb_utils)      every *_torch folder: torch on the instance's GPU
    function_model(pb_utils)   a python child whose work is one numpy function (image_quality)
"""

from .flow_model import flow_model
from .function_model import function_model
from .onnx_model import onnx_model
from .torch_model import torch_model

__all__ = ["flow_model", "function_model", "onnx_model", "torch_model"]
