"""Decoded images -> one model's input batch with torch, on the device the images are on.

The GPU path's counterpart of preprocess.py: the same PreprocessSpec and the same geometry
(preprocess.py's resize size and centre-crop offsets, torchvision's), computed with torch,
so it runs on CUDA and, for the parity tests, on the CPU:

    uint8 (3, H, W) images ─> grouped by size, antialiased bilinear resize of each group at
    once (the shorter side to `resize`, or the whole image to crop x crop) ─> centre crop ─>
    rounded to whole pixel values ─> GRAY / BGR / NHWC ─> x * scale - offset (float32, then
    the spec's dtype), the same arithmetic as preprocess.py on the same rounded pixels.

What differs from the CPU path, and why the parity tests allow it: Pillow resamples in two
passes with fixed-point weights, rounding to uint8 in between, and resamples only the
columns its crop keeps; torch resamples in float in one pass over the whole image
(torchvision's Resize + CenterCrop). A pixel value then differs by at most a step or two,
a few percent of them by one step. Image decoding is not here: see decode_jpegs.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..base.dtypes import PIXEL_TYPES, numpy_dtype
from .preprocess import PreprocessSpec, _crop_offset, _resized_size, placement

__all__ = ["TORCH_DTYPES", "crop_batch", "decode_jpegs", "flip", "orient", "preprocess_batch", "renormalize"]

# Above this many times resize**2 pixels, a resized image is not materialised: the crop's
# source box is resampled instead (preprocess.py's guard against slivers, same limit).
_MAX_RESIZED_AREA = 16
# ITU-R 601-2 luma, as Pillow's convert("L").
_LUMA = (0.299, 0.587, 0.114)
# The same types as torch's, keyed like stages/preprocess.py's DTYPES (torch names them as numpy does).
TORCH_DTYPES = {name: getattr(torch, np.dtype(numpy_dtype(name)).name) for name in PIXEL_TYPES}


def decode_jpegs(datas: Sequence[bytes], device: torch.device | str) -> list[torch.Tensor]:
    """JPEG bytes -> uint8 (3, H, W) RGB tensors on `device` (nvjpeg on CUDA, in one batched
    call), EXIF orientation not applied. Raises RuntimeError when the decoder refuses any
    of them (it returns no partial result)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchvision >= 0.29 warns that its decoders move to TorchCodec
        # One buffer for the batch, cut into views: a tensor built per image cost about 20 µs
        # (frombuffer warns that bytes are read-only; the decoder only reads them).
        joined = torch.frombuffer(b"".join(datas), dtype=torch.uint8)
        encoded = list(joined.split([len(data) for data in datas]))
        return list(decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device))


def orient(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """(C, H, W) stored pixels -> upright, for an EXIF orientation (Pillow's exif_transpose)."""
    if orientation == 2:
        return image.flip(-1)
    if orientation == 3:
        return image.flip(-2, -1)
    if orientation == 4:
        return image.flip(-2)
    if orientation == 5:
        return image.transpose(-2, -1)
    if orientation == 6:
        return image.rot90(-1, dims=(-2, -1))
    if orientation == 7:
        return image.transpose(-2, -1).flip(-2, -1)
    if orientation == 8:
        return image.rot90(1, dims=(-2, -1))
    return image


def _resize_crop(images: torch.Tensor, spec: PreprocessSpec) -> torch.Tensor:
    """(n, 3, H, W) float images of one size -> (n, 3, crop, crop), resized and centre-cropped."""
    height, width = images.shape[-2:]
    crop = spec.crop
    if spec.mode == "stretch":
        return F.interpolate(images, size=(crop, crop), mode="bilinear", antialias=True, align_corners=False)
    new_w, new_h = _resized_size(width, height, spec)
    left, top = _crop_offset(new_w, new_h, spec)
    if new_w * new_h <= _MAX_RESIZED_AREA * spec.resize ** 2:
        resized = F.interpolate(images, size=(new_h, new_w), mode="bilinear", antialias=True, align_corners=False)
        return resized[..., top:top + crop, left:left + crop]
    # A sliver: resample the source box the crop keeps (whole source pixels around it).
    sx, sy = width / new_w, height / new_h
    x0, x1 = int(left * sx), min(width, max(int(left * sx) + 1, round((left + crop) * sx)))
    y0, y1 = int(top * sy), min(height, max(int(top * sy) + 1, round((top + crop) * sy)))
    return F.interpolate(images[..., y0:y1, x0:x1], size=(crop, crop), mode="bilinear", antialias=True,
                         align_corners=False)


def preprocess_batch(images: Sequence[torch.Tensor], spec: PreprocessSpec, device: torch.device | str) -> torch.Tensor:
    """uint8 (3, H, W) RGB images -> one (n, *spec.input_shape) batch of spec's dtype on `device`."""
    crop = spec.crop
    pixels = torch.empty((len(images), 3, crop, crop), dtype=torch.float32, device=device)
    by_size: dict[tuple[int, int], list[int]] = {}
    for row, image in enumerate(images):
        by_size.setdefault(tuple(image.shape[-2:]), []).append(row)
    for rows in by_size.values():
        group = torch.stack([images[r] for r in rows]).to(device=device, dtype=torch.float32)
        resized = _resize_crop(group, spec)
        if len(rows) == len(images):
            pixels.copy_(resized)
        else:
            pixels[torch.tensor(rows, device=device)] = resized
    return _finish(pixels.round_().clamp_(0, 255), spec, device)  # whole pixel values, as Pillow's uint8 output


def _finish(pixels: torch.Tensor, spec: PreprocessSpec, device) -> torch.Tensor:
    """(n, 3, H, W) float RGB pixel values -> spec's colour, layout, normalisation and dtype."""
    if spec.colour == "GRAY":
        luma = torch.tensor(_LUMA, dtype=torch.float32, device=device).view(1, 3, 1, 1)
        pixels = (pixels * luma).sum(dim=1, keepdim=True).round_()
    elif spec.colour == "BGR":
        pixels = pixels.flip(1)
    if spec.layout == "NHWC":
        pixels = pixels.permute(0, 2, 3, 1)
    if spec.dtype == "UINT8":
        return pixels.to(torch.uint8).contiguous()
    scale = torch.from_numpy(spec._scale).to(device)
    offset = torch.from_numpy(spec._offset).to(device)
    return (pixels * scale - offset).to(TORCH_DTYPES[spec.dtype]).contiguous()


def crop_batch(images: Sequence[torch.Tensor], image_rows: np.ndarray, boxes: np.ndarray, spec: PreprocessSpec,
               device: torch.device | str) -> torch.Tensor:
    """Regions -> one (len(boxes), *spec.input_shape) batch on `device`, the counterpart of
    batching.crop_batch: region i is boxes[i] (x0, y0, x1, y1 in pixels) of the uint8 (3, H, W)
    image images[image_rows[i]], placed as preprocess.placement says (stretch, keep_aspect
    with its padding, or a centre crop). All regions of one image are sampled in one
    torchvision.ops.roi_align call (bilinear, averaging ceil(scale) samples per output pixel
    when shrinking, as an antialiased resize does): each box is widened to the whole input
    so that its placed rectangle lands where it should, and the rest is padding."""
    from torchvision.ops import roi_align

    h_in, w_in = spec.crop, spec.input_width
    n = len(boxes)
    pixels = torch.zeros((n, 3, h_in, w_in), dtype=torch.float32, device=device)
    sampled = np.empty((n, 4), dtype=np.float64)
    rects = np.empty((n, 4), dtype=np.int64)
    for i, (x0, y0, x1, y1) in enumerate(boxes):
        (bx0, by0, bx1, by1), (left, top, rw, rh) = placement(x1 - x0, y1 - y0, spec)
        gx, gy = (bx1 - bx0) / rw, (by1 - by0) / rh
        sampled[i] = (x0 + bx0 - left * gx, y0 + by0 - top * gy, x0 + bx0 + (w_in - left) * gx,
                      y0 + by0 + (h_in - top) * gy)
        rects[i] = (left, top, rw, rh)
    for image_row in np.unique(image_rows):
        members = np.flatnonzero(image_rows == image_row)
        image = images[image_row].to(device=device, dtype=torch.float32)[None]
        rois = torch.zeros((len(members), 5), dtype=torch.float32, device=device)
        rois[:, 1:] = torch.from_numpy(sampled[members]).to(device=device, dtype=torch.float32)
        out = roi_align(image, rois, output_size=(h_in, w_in), spatial_scale=1.0, sampling_ratio=-1, aligned=True)
        pixels[torch.as_tensor(members, device=device)] = out
    pixels = pixels.round_().clamp_(0, 255)
    if spec.mode == "keep_aspect":
        inside = torch.zeros((n, 1, h_in, w_in), dtype=torch.bool, device=device)
        for i, (left, top, rw, rh) in enumerate(rects.tolist()):
            inside[i, :, top:top + rh, left:left + rw] = True
        pixels = torch.where(inside, pixels, torch.tensor(float(spec.pad_value), device=device))
    out = _finish(pixels, spec, device)
    if spec.mode == "keep_aspect" and spec.dtype != "UINT8":
        # The padding is pad_value normalised exactly (it need not be a whole pixel value).
        pad = torch.from_numpy(spec.pad_normalized.reshape(-1)).to(device=device, dtype=out.dtype)
        mask = inside if spec.layout == "NCHW" else inside.permute(0, 2, 3, 1)
        shape = (1, -1, 1, 1) if spec.layout == "NCHW" else (1, 1, 1, -1)
        out = torch.where(mask, out, pad.view(shape))
    return out


def renormalize(batch: torch.Tensor, have: PreprocessSpec, want: PreprocessSpec) -> torch.Tensor | None:
    """preprocess.renormalize for a tensor: `have`'s normalisation re-expressed as `want`'s,
    or None when the pixels differ (geometry, colour, layout) or either side is UINT8."""
    same_pixels = (have.geometry, have.colour, have.layout) == (want.geometry, want.colour, want.layout)
    if not same_pixels or "UINT8" in (have.dtype, want.dtype):
        return None
    gain = (want._scale / have._scale).astype(np.float32)
    bias = (have._offset * gain - want._offset).astype(np.float32)
    out = batch.to(torch.float32) * torch.from_numpy(gain).to(batch.device) + torch.from_numpy(bias).to(batch.device)
    return out.to(TORCH_DTYPES[want.dtype])


def flip(batch: torch.Tensor, axis: int) -> torch.Tensor:
    """The batch mirrored along `axis` (a new contiguous tensor)."""
    return batch.flip(axis)
