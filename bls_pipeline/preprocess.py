"""RGB image -> normalised CHW float32, the ImageNet eval transform.

Same result as torchvision's `Resize(resize) + CenterCrop(crop) + ToTensor + Normalize`
(tests/unit/test_preprocess.py holds the tolerance): the same Pillow bilinear
(antialiased) resize, the same centre crop. Only the columns the crop keeps are
resampled (a 224-wide resize with a source box, then the row crop): same filter taps and
scale, so ~0.1% of a landscape photo's values round one uint8 step differently (portrait:
none), for 0.8 instead of 1.2 ms on a 500x375 photo here. For extreme aspect ratios,
where even that would be huge (a 1x20000 sliver would become 224x5120000), the crop
box is resampled in both directions: a 224x224 resize instead of gigabytes (Pillow's
vertical box rounds more pixels one step differently; no photo gets there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image

__all__ = ["PreprocessSpec", "crop_box", "preprocess_into", "renormalize"]

# Column-cropped intermediates up to this many times resize**2 pixels are materialised;
# beyond it, the crop box is resampled in both directions.
_MAX_RESIZED_AREA = 16

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class PreprocessSpec:
    """How one classifier wants its input: per classifier, not a global constant."""

    resize: int = 256  # shorter side after resize
    crop: int = 224  # square centre crop
    mean: tuple[float, float, float] = IMAGENET_MEAN  # in [0, 1] units, RGB order
    std: tuple[float, float, float] = IMAGENET_STD
    # x_norm = x_uint8 * scale - offset, per channel: built once, used per image.
    _scale: np.ndarray = field(init=False, repr=False, compare=False)
    _offset: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.crop <= self.resize:
            raise ValueError(f"preprocessing needs 0 < crop <= resize, got crop={self.crop} resize={self.resize}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"mean and std need 3 values each, std > 0; got mean={self.mean} std={self.std}")
        std = np.asarray(self.std, dtype=np.float32)
        mean = np.asarray(self.mean, dtype=np.float32)
        object.__setattr__(self, "_scale", (1.0 / (255.0 * std)).reshape(3, 1, 1))
        object.__setattr__(self, "_offset", (mean / std).reshape(3, 1, 1))

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (3, self.crop, self.crop)


def _resized_size(width: int, height: int, spec: PreprocessSpec) -> tuple[int, int]:
    """torchvision Resize(int): the shorter side becomes `resize`, the longer one truncates."""
    if width <= height:
        return spec.resize, int(spec.resize * height / width)
    return int(spec.resize * width / height), spec.resize


def _crop_offset(new_w: int, new_h: int, spec: PreprocessSpec) -> tuple[int, int]:
    """torchvision CenterCrop's rounding."""
    return int(round((new_w - spec.crop) / 2.0)), int(round((new_h - spec.crop) / 2.0))


def _geometry(width: int, height: int, spec: PreprocessSpec) -> tuple[int, int, tuple[float, float, float, float]]:
    """The resized height, the crop's top row in the resized image, and the source-pixel
    box that the resize-then-centre-crop keeps."""
    new_w, new_h = _resized_size(width, height, spec)
    left, top = _crop_offset(new_w, new_h, spec)
    sx, sy = width / new_w, height / new_h
    return new_h, top, (left * sx, top * sy, (left + spec.crop) * sx, (top + spec.crop) * sy)


def crop_box(width: int, height: int, spec: PreprocessSpec) -> tuple[float, float, float, float]:
    """Source-pixel box that the resize-then-centre-crop keeps."""
    return _geometry(width, height, spec)[2]


def preprocess_into(img: Image.Image, spec: PreprocessSpec, out: np.ndarray) -> None:
    """Write the normalised (3, crop, crop) float32 tensor for `img` into `out` in place.

    `out` is typically one row of the batch tensor that goes to the classifier, so the
    only copies between the decoder and the DLPack handoff are the resample and this
    one fused uint8 -> float32 normalisation.
    """
    if img.mode != "RGB":
        raise ValueError(f"preprocess expects an RGB image, got mode {img.mode}")
    new_h, top, (x0, y0, x1, y1) = _geometry(img.width, img.height, spec)
    if spec.crop * new_h <= _MAX_RESIZED_AREA * spec.resize ** 2:
        # A box on the vertical axis makes Pillow round many pixels differently: keep all rows.
        columns = img.resize((spec.crop, new_h), Image.BILINEAR, box=(x0, 0, x1, img.height))
        cropped = columns.crop((0, top, spec.crop, top + spec.crop))
    else:
        cropped = img.resize((spec.crop, spec.crop), Image.BILINEAR, box=(x0, y0, x1, y1))
    hwc = np.asarray(cropped)  # (crop, crop, 3) uint8
    np.multiply(hwc.transpose(2, 0, 1), spec._scale, out=out, casting="unsafe")
    out -= spec._offset


def renormalize(batch: np.ndarray, have: PreprocessSpec, want: PreprocessSpec) -> np.ndarray | None:
    """Re-express a batch preprocessed with `have` in `want`'s mean/std, without decoding
    again; None when the geometry (resize, crop) differs and a fresh decode is needed."""
    if (have.resize, have.crop) != (want.resize, want.crop):
        return None
    # x = (n + o_have) / s_have  and  n' = x * s_want - o_want
    gain = (want._scale / have._scale).astype(np.float32)
    bias = (have._offset * gain - want._offset).astype(np.float32)
    out = batch * gain
    out += bias
    return out
