"""RGB image -> one model's input tensor; by default the ImageNet eval transform.

A `PreprocessSpec` is what one model's config.pbtxt asks for (runtime/children.py reads
it): the resize mode and sizes, colour (RGB, BGR, 1-channel GRAY), layout (NCHW, NHWC),
element type (FP32, FP16, UINT8) and normalisation. The default, RGB NCHW float32, gives the
same result as torchvision's `Resize(resize) + CenterCrop(crop) + ToTensor + Normalize`
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


# Layouts, colour modes and element types a child model's input can ask for.
LAYOUTS = ("NCHW", "NHWC")
COLOURS = {"RGB": 3, "BGR": 3, "GRAY": 1}
RESIZE_MODES = ("shorter_side", "stretch")
DTYPES = {"FP32": np.float32, "FP16": np.float16, "UINT8": np.uint8}


@dataclass(frozen=True)
class PreprocessSpec:
    """How one model wants its input: per model (from its config.pbtxt), not a global constant.

    shorter_side: the shorter side is resized to `resize`, then the centre crop x crop is
    kept (the ImageNet eval transform). stretch: the whole image is resized to crop x crop,
    aspect ratio not kept. Floating-point inputs get x * scale, then (x - mean) / std per
    channel (mean and std in scaled units); UINT8 inputs get the pixels as they are.
    """

    resize: int = 256  # shorter side after resize (shorter_side mode)
    crop: int = 224  # square input side
    mean: tuple[float, ...] = IMAGENET_MEAN  # per channel, RGB (or GRAY) order
    std: tuple[float, ...] = IMAGENET_STD
    mode: str = "shorter_side"
    colour: str = "RGB"
    layout: str = "NCHW"
    dtype: str = "FP32"
    scale: float = 1.0 / 255.0
    # x_norm = x_uint8 * _scale - _offset, per channel: built once, used per image.
    _scale: np.ndarray = field(init=False, repr=False, compare=False)
    _offset: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in RESIZE_MODES or self.colour not in COLOURS or self.layout not in LAYOUTS or self.dtype not in DTYPES:
            raise ValueError(f"preprocessing mode/colour/layout/dtype must be one of {RESIZE_MODES}/{tuple(COLOURS)}/"
                             f"{LAYOUTS}/{tuple(DTYPES)}, got {self.mode}/{self.colour}/{self.layout}/{self.dtype}")
        if not 0 < self.crop <= (self.resize if self.mode == "shorter_side" else self.crop):
            raise ValueError(f"preprocessing needs 0 < crop <= resize, got crop={self.crop} resize={self.resize}")
        channels = COLOURS[self.colour]
        if len(self.mean) != channels or len(self.std) != channels or min(self.std) <= 0 or not self.scale > 0:
            raise ValueError(f"mean and std need {channels} value{'s' if channels > 1 else ''} each for {self.colour}, std > 0 and scale > 0; "
                             f"got mean={self.mean} std={self.std} scale={self.scale}")
        shape = (channels, 1, 1) if self.layout == "NCHW" else (1, 1, channels)
        std = np.asarray(self.std, dtype=np.float32)
        mean = np.asarray(self.mean, dtype=np.float32)
        object.__setattr__(self, "_scale", (np.float32(self.scale) / std).reshape(shape))
        object.__setattr__(self, "_offset", (mean / std).reshape(shape))

    @property
    def channels(self) -> int:
        return COLOURS[self.colour]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        c, s = self.channels, self.crop
        return (c, s, s) if self.layout == "NCHW" else (s, s, c)

    @property
    def numpy_dtype(self) -> type:
        return DTYPES[self.dtype]

    @property
    def width_axis(self) -> int:
        """The axis of a batch (N, ...) that a horizontal flip reverses."""
        return -1 if self.layout == "NCHW" else -2

    @property
    def geometry(self) -> tuple:
        """What decides the pixels before normalisation: equal geometry, same pixels."""
        return (self.mode, self.resize if self.mode == "shorter_side" else None, self.crop)


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
    if spec.mode == "stretch":
        cropped = img.resize((spec.crop, spec.crop), Image.BILINEAR)
    else:
        new_h, top, (x0, y0, x1, y1) = _geometry(img.width, img.height, spec)
        if spec.crop * new_h <= _MAX_RESIZED_AREA * spec.resize ** 2:
            # A box on the vertical axis makes Pillow round many pixels differently: keep all rows.
            columns = img.resize((spec.crop, new_h), Image.BILINEAR, box=(x0, 0, x1, img.height))
            cropped = columns.crop((0, top, spec.crop, top + spec.crop))
        else:
            cropped = img.resize((spec.crop, spec.crop), Image.BILINEAR, box=(x0, y0, x1, y1))
    if spec.colour == "GRAY":
        cropped = cropped.convert("L")
    hwc = np.asarray(cropped).reshape(spec.crop, spec.crop, spec.channels)  # uint8
    if spec.colour == "BGR":
        hwc = hwc[..., ::-1]
    pixels = hwc.transpose(2, 0, 1) if spec.layout == "NCHW" else hwc
    if spec.dtype == "UINT8":
        out[...] = pixels
        return
    np.multiply(pixels, spec._scale, out=out, casting="unsafe")
    out -= spec._offset


def renormalize(batch: np.ndarray, have: PreprocessSpec, want: PreprocessSpec) -> np.ndarray | None:
    """Re-express a batch preprocessed with `have` in `want`'s normalisation, without
    decoding again; None when the pixels differ (geometry, colour, layout) or either side
    is UINT8, and the images must be preprocessed afresh."""
    same_pixels = (have.geometry, have.colour, have.layout) == (want.geometry, want.colour, want.layout)
    if not same_pixels or "UINT8" in (have.dtype, want.dtype):
        return None
    # x = (n + o_have) / s_have  and  n' = x * s_want - o_want
    gain = (want._scale / have._scale).astype(np.float32)
    bias = (have._offset * gain - want._offset).astype(np.float32)
    out = np.multiply(batch, gain, dtype=np.float32)
    out += bias
    return out.astype(want.numpy_dtype, copy=False)
