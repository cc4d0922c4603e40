"""Triton's data types, and what numpy, onnxruntime and OpenVINO call them: one table per
other side, Triton's names on one of them, read both ways where needed. PIXEL_TYPES: those
an image input of pixels may take (its preprocessing writes them)."""

from __future__ import annotations

import numpy as np

__all__ = ["ONNX_TYPES", "OPENVINO_TYPES", "PIXEL_TYPES", "numpy_dtype", "triton_dtype"]

_NUMPY = {"FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "INT8": np.int8, "INT16": np.int16,
          "INT32": np.int32, "INT64": np.int64, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
          "UINT64": np.uint64, "BOOL": np.bool_, "STRING": np.object_, "BYTES": np.object_}


def numpy_dtype(triton: str, default: type | None = None) -> type:
    """The numpy type of a Triton data type ("FP32" -> np.float32); `default` for one numpy
    has none (BF16), else KeyError."""
    return _NUMPY[triton] if default is None else _NUMPY.get(triton, default)


# numpy's (and torch's) names of those types -> Triton's: the same table read backwards.
_TRITON = {np.dtype(t).name: name for name, t in _NUMPY.items() if t is not np.object_} | {"bfloat16": "BF16"}


def triton_dtype(name: str) -> str:
    """Triton's data type for a numpy or torch dtype name ("float32" -> "FP32"); the name
    itself where Triton has none."""
    return _TRITON.get(name, name)


# The element types an image input of pixels may declare ([C,H,W] or [H,W,C]): what the
# runtime's preprocessing writes (stages/preprocess.py, stages/torch_preprocess.py).
PIXEL_TYPES = ("FP32", "FP16", "UINT8")

# An engine file's own words for its tensors' types -> Triton's (engines/artifact_io.py).
ONNX_TYPES = {"float": "FP32", "float16": "FP16", "double": "FP64", "bfloat16": "BF16", "int8": "INT8",
              "int16": "INT16",
              "int32": "INT32", "int64": "INT64", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32",
              "uint64": "UINT64", "bool": "BOOL", "string": "STRING"}
OPENVINO_TYPES = {"f32": "FP32", "f16": "FP16", "f64": "FP64", "bf16": "BF16", "i8": "INT8", "i16": "INT16",
                  "i32": "INT32",
                  "i64": "INT64", "u8": "UINT8", "u16": "UINT16", "u32": "UINT32", "u64": "UINT64", "boolean": "BOOL",
                  "string": "STRING"}
