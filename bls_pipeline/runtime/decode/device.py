"""Where one execute()'s pixels and scores live, and the array work the runtime does on them.

The runtime (execution.py, calls.py, predictions.py) never touches pixels or scores itself: it asks a Device.

    HostDevice    numpy on the CPU: decode + preprocess in the thread pool (stages/), scores
                  as numpy. The CPU path, and every flow model with a KIND_CPU instance.
    TorchDevice   torch on one device (runtime/decode/torch_device.py): JPEGs decoded on the GPU in
                  batches, preprocessed there, handed to the children as CUDA tensors (DLPack),
                  softmax and top-k there; only the top-k labels leave it. A flow model with a
                  KIND_GPU instance; on the CPU, only for parity tests.

`device_for(None, pool)` is the HostDevice; `device_for("cuda:0", pool)` imports torch and
builds a TorchDevice, so a CPU stub never imports torch.
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any, Protocol, Sequence

import numpy as np

from ...stages.batching import DecodedBatch, crop_batch, decode_to_batch, preprocess_batch
from ...stages.decode import DecodePolicy
from ...stages.postprocess import TopK, softmax, top_k
from ...stages.preprocess import PreprocessSpec, renormalize

__all__ = ["Device", "HOST", "HostDevice", "TopKAsk", "device_for"]

# A device's array: numpy on the host, a torch tensor on a TorchDevice.
Array = Any
# One top-k the runtime wants: (a classifier's Scores, the rows, k).
TopKAsk = tuple[Any, np.ndarray, int]


class Device(Protocol):
    name: str  # "cpu" (numpy), or the torch device ("cuda:0", "cpu" for the torch path on the CPU)
    gpu: int | None  # the CUDA device a child's outputs are asked for in (BLS preferred_memory); None: anywhere

    def decode(self, images: Sequence[Sequence[bytes] | None], policy: DecodePolicy, spec: PreprocessSpec,
               keep_images: bool) -> DecodedBatch:
        """Every image of the requests (None: skip that request), decoded and preprocessed
        for `spec`; a bad image fails its own request (DecodedBatch.errors)."""
    def preprocess(self, images: Sequence[Any], spec: PreprocessSpec) -> Array:
        """Images kept by decode(keep_images=True) -> a batch for another spec."""
    def crop(self, images: Sequence[Any], image_rows: np.ndarray, boxes: np.ndarray, spec: PreprocessSpec) -> Array:
        """Regions (boxes[i] in pixels of images[image_rows[i]]) -> a batch for `spec`."""
    def renormalize(self, batch: Array, have: PreprocessSpec, want: PreprocessSpec) -> Array | None: ...
    def take(self, array: Array, rows: np.ndarray) -> Array: ...
    def flip(self, batch: Array, axis: int) -> Array: ...
    def concat(self, parts: Sequence[Array]) -> Array: ...
    def probabilities(self, scores: Array, kind: str) -> Array:
        """A classifier's output -> (rows, classes) float32 probabilities (softmax of "logits")."""
    def top1(self, probs: Array) -> np.ndarray: ...
    def top1_class(self, probs: Array) -> np.ndarray: ...
    def to_host(self, array: Array) -> np.ndarray: ...
    def top_k(self, asks: Sequence[TopKAsk]) -> list[TopK]:
        """Each ask's top-k labels, in order."""
    def close(self) -> None: ...


class HostDevice:
    """numpy on the CPU: the stage functions, called as the CPU path always called them."""

    name = "cpu"
    gpu = None

    def __init__(self, pool: Executor | None = None):
        self._pool = pool

    def decode(self, images, policy, spec, keep_images):
        return decode_to_batch(images, policy, spec, self._pool, keep_images=keep_images)

    def preprocess(self, images, spec):
        return preprocess_batch(images, spec, self._pool)

    def crop(self, images, image_rows, boxes, spec):
        return crop_batch(images, image_rows, boxes, spec, self._pool)

    def renormalize(self, batch, have, want):
        return renormalize(batch, have, want)

    def take(self, array, rows):
        return array[rows]

    def flip(self, batch, axis):
        return np.ascontiguousarray(np.flip(batch, axis=axis))

    def concat(self, parts):
        return np.concatenate(parts)

    def probabilities(self, scores, kind):
        return softmax(scores) if kind == "logits" else np.asarray(scores, dtype=np.float32)

    def top1(self, probs):
        return probs.max(axis=1) if len(probs) else np.empty(0, np.float32)

    def top1_class(self, probs):
        return probs.argmax(axis=1) if len(probs) else np.empty(0, np.int64)

    def to_host(self, array):
        return array

    def top_k(self, asks):
        return [top_k(scores.probs_for(rows), k, scores.labels) for scores, rows, k in asks]

    def close(self) -> None:
        pass


HOST = HostDevice()  # no pool: what a Scores made outside the runtime computes with


def device_for(name: str | None, pool: Executor | None) -> Device:
    """The HostDevice for None, else a TorchDevice on torch device `name` ("cuda:0", "cpu")."""
    if name is None:
        return HostDevice(pool)
    from .torch_device import TorchDevice

    return TorchDevice(name, pool)
