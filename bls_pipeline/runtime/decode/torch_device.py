"""TorchDevice: a flow's pixels and scores in torch, on one device (the GPU path).

    the request images ─> headers read on the CPU (stages/jpeg_header.py)
       ├─ plain JPEGs ─> decoded on the device in batches (torchvision: nvjpeg on CUDA)
       │                 ─> EXIF orientation ─> resize / crop / normalise there
       └─ the rest (PNG, CMYK, base64, damaged, refused by the decoder) ─> the CPU path for
                         that image alone (stages/decode.py + preprocess.py: same pixels, same
                         errors), then copied into its row
    ─> one batch tensor on the device: handed to the children as is (DLPack); their outputs
       are asked for in the same GPU's memory; softmax and top-k there, only the top-k leave.

Imported only when a flow model's instance is KIND_GPU (or a test asks for the torch path on
the CPU): a CPU stub never imports torch.
"""

from __future__ import annotations

import io
import logging
from concurrent.futures import Executor

import numpy as np

from ...stages.batching import DecodedBatch, decode_to_batch
from ...stages.decode import ImageError
from ...stages.jpeg_header import JpegHeader, gpu_jpeg
from ...stages.postprocess import TopK, format_label
from ...base.errors import ConfigError

__all__ = ["TorchDevice"]

log = logging.getLogger(__name__)

# Decoded pixels per batched decode call (bounds the decoder's device memory: 64 MP is
# 192 MB of RGB, e.g. 170 ImageNet photos or five 12 MP ones).
MAX_DECODE_PIXELS = 64_000_000


def _require_torch():
    try:
        import torch
        import torchvision  # noqa: F401 - its decode_jpeg is the GPU decoder
    except ImportError as exc:
        raise ConfigError("decoding on the GPU (a flow model with a KIND_GPU instance) needs torch and torchvision "
                          f"with CUDA in the Python the stub runs ({exc}); install them there, or make the model's "
                          "instance_group KIND_CPU to decode on the CPU") from None
    return torch


class TorchDevice:
    def __init__(self, name: str, pool: Executor | None = None):
        torch = _require_torch()
        from ...stages import torch_preprocess

        self._torch, self._ops = torch, torch_preprocess
        self.device = torch.device(name)
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError(f"torch sees no CUDA device here, so the flow cannot decode on {name}; make the "
                                  "model's instance_group KIND_CPU, or install a CUDA build of torch")
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
        self.name = str(self.device)
        self.gpu: int | None = self.device.index if self.device.type == "cuda" else None
        self._pool = pool
        self._refused: set[str] = set()  # header kinds the decoder refused once: decoded on the CPU from then on
        self._fallbacks: dict[str, int] = {}
        self._check_decoder()

    def _check_decoder(self) -> None:
        """Decode one small JPEG at load: a decoder that does not work fails the load, loudly,
        instead of sending every image to the CPU."""
        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (16, 16), (200, 100, 50)).save(buf, "JPEG", quality=95)
        try:
            (image,) = self._ops.decode_jpegs([buf.getvalue()], self.device)
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(f"torchvision cannot decode JPEGs on {self.name} ({type(exc).__name__}: {exc}); "
                              "make the model's instance_group KIND_CPU to decode on the CPU") from None
        if tuple(image.shape) != (3, 16, 16):
            raise ConfigError(f"torchvision decoded a 16x16 JPEG on {self.name} to shape {tuple(image.shape)}")
        log.info("decoding JPEGs on %s (torchvision %s), other images on the CPU", self.name,
                 "nvjpeg" if self.device.type == "cuda" else "libjpeg")

    # ---- pixels -------------------------------------------------------------------------
    def decode(self, images, policy, spec, keep_images) -> DecodedBatch:
        torch = self._torch
        jobs = [(r, i, data) for r, imgs in enumerate(images) if imgs is not None for i, data in enumerate(imgs)]
        headers = [gpu_jpeg(data, policy) for _, _, data in jobs]
        decoded = self._decode_on_device(jobs, headers)
        batch = torch.empty((len(jobs), *spec.input_shape), dtype=self._ops.TORCH_DTYPES[spec.dtype],
                            device=self.device)
        kept: list = [None] * len(jobs)
        scales = np.ones(len(jobs), dtype=np.float64)  # decoded here at full size
        if decoded:
            rows = sorted(decoded)
            pixels = self.preprocess([decoded[row] for row in rows], spec)
            self._put(batch, rows, pixels)
            if keep_images:
                for row in rows:
                    kept[row] = decoded[row]
        errors: dict[int, ImageError] = {}
        bad_index: dict[int, int] = {}
        on_cpu = [row for row in range(len(jobs)) if row not in decoded]
        if on_cpu:
            cpu = decode_to_batch([[jobs[row][2]] for row in on_cpu], policy, spec, self._pool, keep_images=keep_images)
            good = [on_cpu[k] for k in cpu.owners]
            if good:
                self._put(batch, good, torch.from_numpy(cpu.batch).to(self.device))
            if keep_images:
                for row, img, scale in zip(good, cpu.images, cpu.scales):
                    kept[row], scales[row] = self._from_pil(img), scale
            for k in sorted(cpu.errors):  # rows in order: a request's first bad image is reported
                r, i, _ = jobs[on_cpu[k]]
                if r not in errors or i < bad_index[r]:
                    errors[r], bad_index[r] = cpu.errors[k], i
        owners = np.fromiter((r for r, _, _ in jobs), dtype=np.int64, count=len(jobs))
        if errors:
            keep = np.flatnonzero(~np.isin(owners, list(errors)))
            return DecodedBatch(self.take(batch, keep), owners[keep], errors, bad_index,
                                [kept[i] for i in keep] if keep_images else None, scales[keep] if keep_images else None)
        return DecodedBatch(batch, owners, errors, bad_index, kept if keep_images else None,
                            scales if keep_images else None)

    def _put(self, batch, rows: list[int], values) -> None:
        if len(rows) == len(batch):
            batch.copy_(values)
        else:
            batch[self._torch.tensor(rows, device=self.device)] = values

    def _decode_on_device(self, jobs, headers: list[JpegHeader | None]) -> dict[int, object]:
        """{row: upright uint8 (3, H, W) tensor on the device} for the rows decoded here."""
        rows = [row for row, h in enumerate(headers) if h is not None and h.kind not in self._refused]
        out: dict[int, object] = {}
        for chunk in self._chunks(rows, headers):
            try:
                images = self._ops.decode_jpegs([jobs[row][2] for row in chunk], self.device)
            except RuntimeError:  # one image spoils the batched call: find it, decode the rest
                images = [self._decode_one(jobs[row][2], headers[row]) for row in chunk]
            for row, image in zip(chunk, images):
                if image is not None:
                    out[row] = self._ops.orient(image, headers[row].orientation)
        return out

    def _decode_one(self, data: bytes, header: JpegHeader):
        try:
            return self._ops.decode_jpegs([data], self.device)[0]
        except RuntimeError as exc:
            if header.kind != "baseline" and header.kind not in self._refused:
                self._refused.add(header.kind)
                log.warning("the decoder on %s refused a %s JPEG (%s): %s JPEGs are decoded on the CPU from now on",
                            self.name, header.kind, _short(exc), header.kind)
            self._count_fallback(f"{header.kind} JPEG the decoder refused")
            return None

    def _count_fallback(self, why: str) -> None:
        n = self._fallbacks[why] = self._fallbacks.get(why, 0) + 1
        if n == 1 or n % 1000 == 0:
            log.warning("decoded on the CPU instead of %s: %d image(s) so far (%s)", self.name, n, why)

    @staticmethod
    def _chunks(rows: list[int], headers) -> list[list[int]]:
        chunks, current, pixels = [], [], 0
        for row in rows:
            size = headers[row].width * headers[row].height
            if current and pixels + size > MAX_DECODE_PIXELS:
                chunks.append(current)
                current, pixels = [], 0
            current.append(row)
            pixels += size
        return chunks + ([current] if current else [])

    def _from_pil(self, img):
        return self._torch.from_numpy(np.array(img)).permute(2, 0, 1).to(self.device)

    def preprocess(self, images, spec):
        if spec.mode == "keep_aspect" or spec.input_width != spec.crop:
            # Inputs the square resize-and-crop does not make: each whole image as a region.
            boxes = np.array([(0, 0, int(img.shape[-1]), int(img.shape[-2])) for img in images], dtype=np.float64)
            return self.crop(images, np.arange(len(images)), boxes, spec)
        return self._ops.preprocess_batch(images, spec, self.device)

    def crop(self, images, image_rows, boxes, spec):
        return self._ops.crop_batch(images, np.asarray(image_rows), boxes, spec, self.device)

    def renormalize(self, batch, have, want):
        return self._ops.renormalize(self._tensor(batch), have, want)

    # ---- arrays and scores ----------------------------------------------------------------
    def _tensor(self, array):
        if isinstance(array, self._torch.Tensor):
            return array
        return self._torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def take(self, array, rows):
        tensor = self._tensor(array)
        return tensor[self._torch.as_tensor(np.asarray(rows, dtype=np.int64), device=tensor.device)]

    def flip(self, batch, axis):
        return self._ops.flip(self._tensor(batch), axis)

    def concat(self, parts):
        return self._torch.cat([self._tensor(p) for p in parts])

    def probabilities(self, scores, kind):
        tensor = self._tensor(scores).to(self._torch.float32)
        return self._torch.softmax(tensor, dim=1) if kind == "logits" else tensor

    def top1(self, probs):
        probs = self._tensor(probs)
        return probs.amax(dim=1).cpu().numpy() if len(probs) else np.empty(0, np.float32)

    def top1_class(self, probs):
        probs = self._tensor(probs)
        return probs.argmax(dim=1).cpu().numpy() if len(probs) else np.empty(0, np.int64)

    def to_host(self, array):
        if isinstance(array, self._torch.Tensor):
            return array.cpu().numpy()
        return np.asarray(array)

    def top_k(self, asks):
        """One sort per classifier answer, over all the rows asked of it, and one copy of the
        top k (the largest k asked) to the host; equal scores keep ascending class order,
        as stages.postprocess.top_k."""
        torch = self._torch
        results: list[TopK | None] = [None] * len(asks)
        by_source: dict[int, list[int]] = {}
        for a, (scores, _, _) in enumerate(asks):
            by_source.setdefault(id(scores), []).append(a)
        for members in by_source.values():
            scores = asks[members[0]][0]
            rows = np.concatenate([asks[a][1] for a in members])
            k = max(asks[a][2] for a in members)
            probs = self._tensor(scores.probs_for(rows))
            if not 1 <= k <= probs.shape[1]:
                raise ValueError(f"top-k must be between 1 and {probs.shape[1]}, got {k}")
            values, order = torch.sort(probs, dim=1, descending=True, stable=True)
            top = torch.stack([values[:, :k], order[:, :k].to(values.dtype)]).cpu().numpy()
            values_k, ids_k = top[0].astype(np.float32), top[1].astype(np.int64)
            start = 0
            for a in members:
                n, want = len(asks[a][1]), asks[a][2]
                results[a] = _top(values_k[start:start + n, :want], ids_k[start:start + n, :want], scores.labels)
                start += n
        return results  # type: ignore[return-value]

    def close(self) -> None:
        if self._fallbacks:
            log.info("images decoded on the CPU instead of %s: %s", self.name, self._fallbacks)


def _top(scores: np.ndarray, class_ids: np.ndarray, labels) -> TopK:
    formatted = np.array([[format_label(s, c, labels).encode() for s, c in zip(row_scores, row_ids)]
                          for row_scores, row_ids in zip(scores.tolist(), class_ids.tolist())], dtype=object)
    return TopK(scores=scores, class_ids=class_ids.astype(np.int32), labels=formatted.reshape(scores.shape))


def _short(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]
