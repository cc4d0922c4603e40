"""One input or output as a model's config.pbtxt declares it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TensorInfo"]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # Triton data type without TYPE_ ("FP32", "STRING", ...)
    dims: tuple[int, ...]  # without the batch dimension
    optional: bool = False
