"""Triton's data types and numpy's: one table, read both ways."""

from __future__ import annotations

import numpy as np

__all__ = ["numpy_dtype", "triton_dtype"]

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
