"""Encoded bytes -> upright RGB PIL image, ready for the resize in preprocess.py.

Contract: `decode(data, policy)` returns an RGB `PIL.Image.Image` or raises
`ImageError` with a message fit to send to a client (no paths, no traceback).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

__all__ = ["DecodePolicy", "ImageError", "decode"]

# Formats a client may send. Anything else Pillow can open (EPS, PSD, ICO...) is refused:
# every extra plugin is extra attack surface for no classification value.
DEFAULT_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF")


class ImageError(ValueError):
    """A client-side problem with one image; the message is safe to return."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason  # short machine-readable tag, used for metrics


@dataclass(frozen=True)
class DecodePolicy:
    max_pixels: int = 40_000_000  # header-declared width*height; above this is a bomb
    max_bytes: int = 32 * 1024 * 1024
    formats: tuple[str, ...] = DEFAULT_FORMATS
    # JPEG DCT-domain downscale: decode at 1/2, 1/4 or 1/8 scale as long as the shorter
    # side stays >= draft_min_side. 0 disables it (full decode).
    draft_min_side: int = 512
    background: tuple[int, int, int] = (255, 255, 255)  # alpha is composited onto this


def decode(data: bytes, policy: DecodePolicy = DecodePolicy()) -> Image.Image:
    if not data:
        raise ImageError("empty", "empty image payload (0 bytes)")
    if len(data) > policy.max_bytes:
        raise ImageError("too_large", f"image payload is {len(data)} bytes, over the {policy.max_bytes}-byte limit")
    try:
        with warnings.catch_warnings():
            # Pillow warns (and only warns) between MAX_IMAGE_PIXELS and 2x; we check size ourselves.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=list(policy.formats))
    except UnidentifiedImageError:
        if _has_allowed_signature(data, policy.formats):  # e.g. a PNG whose header CRC is broken
            raise ImageError("corrupt", "cannot read image header: the file starts like an allowed format but is damaged") from None
        raise ImageError("unsupported_format", f"not a decodable image (allowed formats: {', '.join(policy.formats)})") from None
    except Image.DecompressionBombError:
        raise ImageError("too_many_pixels", f"image declares more than {policy.max_pixels} pixels") from None
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types on bad headers
        raise ImageError("corrupt", f"cannot read image header: {_short(exc)}") from None

    width, height = img.size
    if width < 1 or height < 1:
        raise ImageError("corrupt", f"image has an empty size {width}x{height}")
    if width * height > policy.max_pixels:
        raise ImageError("too_many_pixels", f"image is {width}x{height} = {width * height} pixels, over the {policy.max_pixels}-pixel limit")

    try:
        if img.format == "JPEG" and policy.draft_min_side > 0:
            img.draft("RGB", (policy.draft_min_side, policy.draft_min_side))
        # Animated GIF/WebP and multi-page TIFF: Image.open leaves us on frame 0.
        img.load()
        img = ImageOps.exif_transpose(img)
        return _to_rgb(img, policy.background)
    except ImageError:
        raise
    except Exception as exc:  # noqa: BLE001 - truncated data, bad CRC, codec errors
        raise ImageError("corrupt", f"cannot decode {img.format} image: {_short(exc)}") from None


def _to_rgb(img: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    mode = img.mode
    if mode == "RGB":
        return img
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        # 16-bit greyscale: scale the full range to 8 bits. Pillow's convert("L") clips at 255.
        grey = np.asarray(img, dtype=np.float32)
        grey = np.clip(grey / 257.0 + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    if mode == "F":
        grey = np.clip(np.asarray(img, dtype=np.float32) + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    if mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif mode in ("LA", "La", "PA", "RGBa"):
        img = img.convert("RGBA")
    if img.mode == "RGBA":
        canvas = Image.new("RGB", img.size, background)
        canvas.paste(img, mask=img.getchannel("A"))
        return canvas
    # L, 1, CMYK (Adobe-inverted handled by Pillow), YCbCr, LAB, HSV.
    return img.convert("RGB")


def _has_allowed_signature(data: bytes, formats: tuple[str, ...]) -> bool:
    Image.init()
    head = data[:16]
    return any(fmt in Image.OPEN and Image.OPEN[fmt][1] is not None and bool(Image.OPEN[fmt][1](head)) for fmt in formats)


def _short(exc: Exception) -> str:
    """One line from an exception, without anything that looks like a file path."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]
