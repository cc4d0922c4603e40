"""Rows: how a flow says which rows of a batch a call or an answer is about, and the
full-length per-row arrays it reads back (rows a call did not cover filled)."""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

from ..errors import FlowError

__all__ = ["Rows"]

Rows = Union[np.ndarray, Sequence[int], Sequence[bool], None]  # a boolean mask, row indices, or None (all)


def _fill(dtype: np.dtype):
    if dtype.kind == "f":
        return np.nan
    if dtype.kind in "iu":
        return -1
    if dtype.kind == "b":
        return False
    return b""


def _spread(size: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`values` for `rows`, placed in a full-length array (the other rows filled)."""
    full = np.full((size, *values.shape[1:]), _fill(values.dtype), dtype=values.dtype)
    full[rows] = values
    return full


def _mask(size: int, rows: np.ndarray) -> np.ndarray:
    mask = np.zeros(size, dtype=bool)
    mask[rows] = True
    return mask


def _as_rows(size: int, rows: Rows) -> np.ndarray:
    """Row indices, ascending, from a boolean mask, indices or None (every row)."""
    if rows is None:
        return np.arange(size)
    picked = np.asarray(rows)
    if picked.dtype == bool:
        if picked.shape != (size,):
            raise FlowError(f"a boolean row mask needs one entry per row ({size}), got shape {picked.shape}")
        return np.flatnonzero(picked)
    if picked.size == 0:
        return np.empty(0, dtype=np.int64)
    if picked.dtype.kind not in "iu" or picked.ndim != 1:
        raise FlowError(f"rows must be a boolean mask or a 1-d array of row indices, got {picked.dtype} with shape "
                        f"{picked.shape}")
    if picked.min() < 0 or picked.max() >= size:
        raise FlowError(f"row indices must be in 0..{size - 1}, got {picked.min()}..{picked.max()}")
    unique, counts = np.unique(picked, return_counts=True)
    if (counts > 1).any():
        repeated = unique[counts > 1].tolist()
        raise FlowError(f"rows= repeats row(s) {repeated[:10]}{' ...' if len(repeated) > 10 else ''}: each row is "
                        "called once per call; for one call per region, make regions with batch.regions(...)")
    return unique
