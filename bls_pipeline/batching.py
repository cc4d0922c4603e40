"""Many requests' encoded images -> one preprocessed batch, with per-request failures.

Shared by classify_bls (pipeline.py) and the ensemble baseline's preprocessing model,
so both do exactly the same work per image.
"""

from __future__ import annotations

import logging
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .decode import DecodePolicy, ImageError, decode
from .preprocess import PreprocessSpec, preprocess_into

__all__ = ["DecodedBatch", "decode_to_batch"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodedBatch:
    batch: np.ndarray  # (rows, 3, crop, crop) float32, rows of the good requests only
    owners: np.ndarray  # (rows,) index of the request each row belongs to
    errors: dict[int, ImageError]  # request index -> its first bad image's error
    bad_index: dict[int, int]  # request index -> index of that image within the request


def decode_to_batch(images: Sequence[Sequence[bytes] | None], policy: DecodePolicy, spec: PreprocessSpec,
                    pool: Executor | None) -> DecodedBatch:
    """Decode + preprocess every image (None = skip that request) on `pool` (None: here).

    Each image is written straight into its row of the batch tensor, which is then handed
    to the classifier as is when no request failed.
    """
    jobs = [(r, i, data) for r, imgs in enumerate(images) if imgs is not None for i, data in enumerate(imgs)]
    batch = np.empty((len(jobs), *spec.input_shape), dtype=np.float32)

    def work(row: int) -> ImageError | None:
        try:
            preprocess_into(decode(jobs[row][2], policy), spec, batch[row])
            return None
        except ImageError as exc:
            # A fresh copy: the caught one's traceback and context reach this frame and so
            # `batch` and `jobs`, in a cycle only the garbage collector breaks; under steady
            # bad traffic that held tens of MB per stub (the soak test's RSS).
            return ImageError(exc.reason, str(exc))
        except Exception:  # noqa: BLE001 - one image's surprise (MemoryError...) fails its request only
            log.exception("decode/preprocess failed unexpectedly for one image")
            return ImageError("internal", "could not decode or preprocess this image (internal error, logged on the server)")

    if pool is not None and len(jobs) > 1:
        outcomes = list(pool.map(work, range(len(jobs))))
    else:
        outcomes = [work(row) for row in range(len(jobs))]
    errors: dict[int, ImageError] = {}
    bad_index: dict[int, int] = {}
    for (r, i, _), err in zip(jobs, outcomes):
        if err is not None and r not in errors:
            errors[r], bad_index[r] = err, i
    owners = np.fromiter((r for r, _, _ in jobs), dtype=np.int64, count=len(jobs))
    if errors:
        keep = np.flatnonzero(~np.isin(owners, list(errors)))
        return DecodedBatch(batch[keep], owners[keep], errors, bad_index)
    return DecodedBatch(batch, owners, errors, bad_index)
