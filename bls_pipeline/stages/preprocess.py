"""RGB image -> one model's input tensor; by default the ImageNet eval transform.

A `PreprocessSpec` is what one model's config.pbtxt asks for (runtime/load/children.py reads
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

from ..base.dtypes import PIXEL_TYPES, numpy_dtype

__all__ = ["PAD_PLACES", "PreprocessSpec", "crop_box", "placement", "preprocess_into", "renormalize"]

# Column-cropped intermediates up to this many times resize**2 pixels are materialised;
# beyond it, the crop box is resampled in both directions.
_MAX_RESIZED_AREA = 16

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# Layouts, colour modes and element types a child model's input can ask for.
LAYOUTS = ("NCHW", "NHWC")
COLOURS = {"RGB": 3, "BGR": 3, "GRAY": 1}
RESIZE_MODES = ("shorter_side", "stretch", "keep_aspect")
# keep_aspect: where the scaled image sits in the input, the rest padded.
PAD_PLACES = ("bottom_right", "centre")
DTYPES = {name: numpy_dtype(name) for name in PIXEL_TYPES}


@dataclass(frozen=True)
class PreprocessSpec:
    """How one model wants its input: per model (from its config.pbtxt), not a global constant.

    shorter_side: the shorter side is resized to `resize`, then the centre crop x crop is
    kept (the ImageNet eval transform). stretch: the whole image is resized to the input
    size, aspect ratio not kept. keep_aspect: scaled to fit the input with its aspect ratio
    kept, placed at the top left (pad "bottom_right") or centred, the rest filled with
    `pad_value` (in pixel units, 0-255, normalised like a pixel: 127.5 is 0 for mean/std 0.5).
    The input is crop (height) x width; only shorter_side needs it square. Floating-point
    inputs get x * scale, then (x - mean) / std per channel (mean and std in scaled units);
    UINT8 inputs get the pixels as they are.
    """

    resize: int = 256  # shorter side after resize (shorter_side mode)
    crop: int = 224  # input height (and width, unless `width` says otherwise)
    mean: tuple[float, ...] = IMAGENET_MEAN  # per channel, RGB (or GRAY) order
    std: tuple[float, ...] = IMAGENET_STD
    mode: str = "shorter_side"
    colour: str = "RGB"
    layout: str = "NCHW"
    dtype: str = "FP32"
    scale: float = 1.0 / 255.0
    width: int = 0  # input width; 0: crop (square)
    pad: str = "bottom_right"  # keep_aspect only
    pad_value: float = 0.0  # keep_aspect only, pixel units
    # x_norm = x_uint8 * _scale - _offset, per channel: built once, used per image.
    _scale: np.ndarray = field(init=False, repr=False, compare=False)
    _offset: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.mode not in RESIZE_MODES or self.colour not in COLOURS or self.layout not in LAYOUTS
                or self.dtype not in DTYPES):
            raise ValueError(f"preprocessing mode/colour/layout/dtype must be one of {RESIZE_MODES}/{tuple(COLOURS)}/"
                             f"{LAYOUTS}/{tuple(DTYPES)}, got {self.mode}/{self.colour}/{self.layout}/{self.dtype}")
        if not 0 < self.crop <= (self.resize if self.mode == "shorter_side" else self.crop):
            raise ValueError(f"preprocessing needs 0 < crop <= resize, got crop={self.crop} resize={self.resize}")
        if self.width < 0 or (self.mode == "shorter_side" and self.width not in (0, self.crop)):
            raise ValueError(f"a {self.crop}x{self.width} input needs resize mode stretch or keep_aspect: "
                             "shorter_side centre-crops a square")
        if self.pad not in PAD_PLACES or not 0 <= self.pad_value <= 255:
            raise ValueError(f"pad must be one of {PAD_PLACES} and pad_value within 0..255, got {self.pad} "
                             f"{self.pad_value}")
        channels = COLOURS[self.colour]
        if len(self.mean) != channels or len(self.std) != channels or min(self.std) <= 0 or not self.scale > 0:
            raise ValueError(f"mean and std need {channels} value{'s' if channels > 1 else ''} each for {self.colour}, "
                             f"std > 0 and scale > 0; got mean={self.mean} std={self.std} scale={self.scale}")
        shape = (channels, 1, 1) if self.layout == "NCHW" else (1, 1, channels)
        std = np.asarray(self.std, dtype=np.float32)
        mean = np.asarray(self.mean, dtype=np.float32)
        object.__setattr__(self, "_scale", (np.float32(self.scale) / std).reshape(shape))
        object.__setattr__(self, "_offset", (mean / std).reshape(shape))

    @property
    def channels(self) -> int:
        return COLOURS[self.colour]

    @property
    def height(self) -> int:
        return self.crop

    @property
    def input_width(self) -> int:
        return self.width or self.crop

    @property
    def input_shape(self) -> tuple[int, int, int]:
        c, h, w = self.channels, self.crop, self.input_width
        return (c, h, w) if self.layout == "NCHW" else (h, w, c)

    @property
    def pad_normalized(self) -> np.ndarray:
        """pad_value as this input's element values, per channel (broadcastable to a row)."""
        if self.dtype == "UINT8":
            return np.full(self._scale.shape, round(self.pad_value), dtype=np.uint8)
        return (np.float32(self.pad_value) * self._scale - self._offset).astype(self.numpy_dtype)

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
        keep_aspect = (self.pad, self.pad_value) if self.mode == "keep_aspect" else None
        return (self.mode, self.resize if self.mode == "shorter_side" else None, self.crop, self.input_width,
                keep_aspect)


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


Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in source pixels


def placement(width: float, height: float, spec: PreprocessSpec) -> tuple[Box, tuple[int, int, int, int]]:
    """Where a width x height source lands in spec's input: (the source box that is
    resampled, relative to the source's top left; the input rectangle it fills, as
    left, top, width, height). The rest of the input is padding (keep_aspect only).

    Every mode is this one affine map per axis, so a point in the input maps back to the
    source as x_src = box.x0 + (x_in - left) * box.width / rect.width (runtime/decode/boxes.py uses it
    to put a detector's boxes back on the image)."""
    h_in, w_in = spec.crop, spec.input_width
    if spec.mode == "stretch":
        return (0.0, 0.0, float(width), float(height)), (0, 0, w_in, h_in)
    if spec.mode == "keep_aspect":
        s = min(w_in / width, h_in / height)
        w, h = min(w_in, max(1, round(width * s))), min(h_in, max(1, round(height * s)))
        left, top = ((w_in - w) // 2, (h_in - h) // 2) if spec.pad == "centre" else (0, 0)
        return (0.0, 0.0, float(width), float(height)), (left, top, w, h)
    return crop_box(width, height, spec), (0, 0, spec.crop, spec.crop)


def preprocess_region(img: Image.Image, box: Box, spec: PreprocessSpec, out: np.ndarray) -> None:
    """Write spec's input for the region `box` (image pixels, within the image) of `img`
    into `out`: the region is treated as an image of its own (resize mode, padding), with
    one resample straight from the image (no intermediate crop)."""
    (sx0, sy0, sx1, sy1), (left, top, w, h) = placement(box[2] - box[0], box[3] - box[1], spec)
    source = (max(0.0, box[0] + sx0), max(0.0, box[1] + sy0), min(img.width, box[0] + sx1),
              min(img.height, box[1] + sy1))
    _write(img.resize((w, h), Image.BILINEAR, box=source), spec, out, (left, top, w, h))


def _write(pixels_img: Image.Image, spec: PreprocessSpec, out: np.ndarray, rect: tuple[int, int, int, int]) -> None:
    """Normalise an RGB image of rect's size into rect of `out`; pad the rest."""
    left, top, w, h = rect
    if (w, h) != (spec.input_width, spec.crop):
        out[...] = spec.pad_normalized
        out = out[:, top:top + h, left:left + w] if spec.layout == "NCHW" else out[top:top + h, left:left + w]
    if spec.colour == "GRAY":
        pixels_img = pixels_img.convert("L")
    hwc = np.asarray(pixels_img).reshape(h, w, spec.channels)  # uint8
    if spec.colour == "BGR":
        hwc = hwc[..., ::-1]
    pixels = hwc.transpose(2, 0, 1) if spec.layout == "NCHW" else hwc
    if spec.dtype == "UINT8":
        out[...] = pixels
        return
    np.multiply(pixels, spec._scale, out=out, casting="unsafe")
    out -= spec._offset


def preprocess_into(img: Image.Image, spec: PreprocessSpec, out: np.ndarray) -> None:
    """Write the normalised (3, crop, crop) float32 tensor for `img` into `out` in place.

    `out` is typically one row of the batch tensor that goes to the classifier, so the
    only copies between the decoder and the DLPack handoff are the resample and this
    one fused uint8 -> float32 normalisation.
    """
    if img.mode != "RGB":
        raise ValueError(f"preprocess expects an RGB image, got mode {img.mode}")
    if spec.mode != "shorter_side":
        _, rect = placement(img.width, img.height, spec)
        _write(img.resize(rect[2:], Image.BILINEAR), spec, out, rect)
        return
    new_h, top, (x0, y0, x1, y1) = _geometry(img.width, img.height, spec)
    if spec.crop * new_h <= _MAX_RESIZED_AREA * spec.resize ** 2:
        # A box on the vertical axis makes Pillow round many pixels differently: keep all rows.
        columns = img.resize((spec.crop, new_h), Image.BILINEAR, box=(x0, 0, x1, img.height))
        cropped = columns.crop((0, top, spec.crop, top + spec.crop))
    else:
        cropped = img.resize((spec.crop, spec.crop), Image.BILINEAR, box=(x0, y0, x1, y1))
    _write(cropped, spec, out, (0, 0, spec.crop, spec.crop))


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
