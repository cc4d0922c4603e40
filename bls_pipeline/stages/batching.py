"""Many requests' encoded images -> one preprocessed batch, with per-request failures.

Shared by the flow runtime and the ensemble baseline's preprocessing model,
so both do exactly the same work per image.
"""

from __future__ import annotations

import logging
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

import numpy as np
from PIL import Image

from .decode import DecodePolicy, ImageError, decode, decode_scale
from .preprocess import PreprocessSpec, preprocess_into, preprocess_region

__all__ = ["DecodedBatch", "crop_batch", "decode_to_batch", "preprocess_batch"]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class DecodedBatch:
    batch: np.ndarray  # (rows, *spec.input_shape), rows of the good requests only
    owners: np.ndarray  # (rows,) index of the request each row belongs to
    errors: dict[int, ImageError]  # request index -> its first bad image's error
    bad_index: dict[int, int]  # request index -> index of that image within the request
    images: list[Image.Image] | None = None  # the decoded images of those rows, if kept
    scales: np.ndarray | None = None  # with them: each one's pixels as sent per decoded pixel (decode_scale)


def decode_to_batch(images: Sequence[Sequence[bytes] | None], policy: DecodePolicy, spec: PreprocessSpec,
                    pool: Executor | None, keep_images: bool = False) -> DecodedBatch:
    """Decode + preprocess every image (None = skip that request) on `pool` (None: here).

    Each image is written straight into its row of the batch tensor, which is then handed
    to the model as is when no request failed. `keep_images` also keeps the decoded
    images, for models that want other geometry (see preprocess_batch).
    """
    jobs = [(r, i, data) for r, imgs in enumerate(images) if imgs is not None for i, data in enumerate(imgs)]
    batch = np.empty((len(jobs), *spec.input_shape), dtype=spec.numpy_dtype)
    kept: list[Image.Image | None] = [None] * len(jobs)

    def work(row: int) -> ImageError | None:
        try:
            img = decode(jobs[row][2], policy)
            preprocess_into(img, spec, batch[row])
            if keep_images:
                kept[row] = img
            return None
        except ImageError as exc:
            # A fresh copy: the caught one's traceback and context reach this frame and so
            # `batch` and `jobs`, in a cycle only the garbage collector breaks; under steady
            # bad traffic that held tens of MB per stub (the soak test's RSS).
            return ImageError(exc.reason, str(exc))
        except Exception:  # noqa: BLE001 - one image's surprise (MemoryError...) fails its request only
            log.exception("decode/preprocess failed unexpectedly for one image")
            return ImageError("internal",
                              "could not decode or preprocess this image (internal error, logged on the server)")

    outcomes = _map_rows(len(jobs), work, pool)
    errors: dict[int, ImageError] = {}
    bad_index: dict[int, int] = {}
    for (r, i, _), err in zip(jobs, outcomes):
        if err is not None and r not in errors:
            errors[r], bad_index[r] = err, i
    owners = np.fromiter((r for r, _, _ in jobs), dtype=np.int64, count=len(jobs))
    rows = np.flatnonzero(~np.isin(owners, list(errors))) if errors else np.arange(len(jobs))
    images = [kept[i] for i in rows] if keep_images else None
    scales = np.array([decode_scale(img) for img in images], dtype=np.float64) if keep_images else None
    if errors:
        return DecodedBatch(batch[rows], owners[rows], errors, bad_index, images, scales)
    return DecodedBatch(batch, owners, errors, bad_index, images, scales)


def preprocess_batch(images: Sequence[Image.Image], spec: PreprocessSpec, pool: Executor | None) -> np.ndarray:
    """Already decoded images -> one (rows, *spec.input_shape) batch for `spec`."""
    batch = np.empty((len(images), *spec.input_shape), dtype=spec.numpy_dtype)

    _map_rows(len(images), lambda row: preprocess_into(images[row], spec, batch[row]), pool)
    return batch


def crop_batch(images: Sequence[Image.Image], image_rows: np.ndarray, boxes: np.ndarray, spec: PreprocessSpec,
               pool: Executor | None) -> np.ndarray:
    """Regions -> one (len(boxes), *spec.input_shape) batch for `spec`: region i is
    boxes[i] (x0, y0, x1, y1 in pixels) of images[image_rows[i]], each resampled straight
    from its image (preprocess.preprocess_region)."""
    batch = np.empty((len(boxes), *spec.input_shape), dtype=spec.numpy_dtype)

    _map_rows(len(boxes), lambda row: preprocess_region(images[image_rows[row]], tuple(boxes[row]), spec, batch[row]),
              pool)
    return batch


def _map_rows(rows: int, work: Callable[[int], T], pool: Executor | None) -> list[T]:
    """[work(row) for every row], on the pool's threads when there is more than one row."""
    if pool is not None and rows > 1:
        return list(pool.map(work, range(rows)))
    return [work(row) for row in range(rows)]
