"""Encoded bytes -> upright RGB PIL image, ready for the resize in preprocess.py.

Contract: `decode(data, policy)` returns an RGB `PIL.Image.Image` or raises
`ImageError` with a message fit to send to a client (no paths, no traceback). `data` is
the encoded image, or that image as base64 text (from clients that can only send JSON).
"""

from __future__ import annotations

import base64
import io
import re
import struct
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

__all__ = ["DECODE_SCALE", "DecodePolicy", "IMAGE_SUFFIXES", "ImageError", "decode", "decode_scale", "from_base64"]

# In a decoded image's `info`: the encoded image's pixels per decoded pixel (a JPEG decoded
# at 1/2, 1/4 or 1/8 scale), absent when 1. Regions report boxes in the encoded image's pixels.
DECODE_SCALE = "bls_decode_scale"


def decode_scale(img: Image.Image) -> float:
    return float(img.info.get(DECODE_SCALE, 1.0))

# Formats a client may send. Anything else Pillow can open (EPS, PSD, ICO...) is refused:
# every extra plugin is extra attack surface for no classification value.
DEFAULT_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF")
# The file names of those formats: what bls-classify sends from a folder, and what engine_build
# calibrates with.
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})


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
    draft_min_side: int = 256  # = the resize target: decode at the smallest scale that still covers it
    background: tuple[int, int, int] = (255, 255, 255)  # alpha is composited onto this


def decode(data: bytes, policy: DecodePolicy = DecodePolicy()) -> Image.Image:
    if not data:
        raise ImageError("empty", "empty image payload (0 bytes)")
    if len(data) > policy.max_bytes:
        raise ImageError("too_large", f"image payload is {len(data)} bytes, over the {policy.max_bytes}-byte limit")
    text = from_base64(data)
    if text is None:
        return _decode_binary(data, policy)
    try:
        return _decode_binary(text, policy)
    except ImageError as exc:
        raise ImageError(exc.reason, f"{exc} (in the base64 text sent)") from None


# A client that can only send text (KServe v2 JSON, curl) sends the image as base64, plain
# or as a data URI. Binary images never look like that: every format's first bytes fall
# outside the base64 alphabet (JPEG 0xFF, PNG 0x89, GIF/WebP/TIFF/BMP binary header fields).
_DATA_URI = re.compile(rb"data:image/[A-Za-z0-9.+-]+;base64,")
_BASE64 = re.compile(rb"[A-Za-z0-9+/]+={0,2}")
_WHITESPACE = re.compile(rb"\s+")


def from_base64(data: bytes) -> bytes | None:
    """The bytes inside base64 text (plain, or a `data:image/...;base64,` URI), or None when
    `data` is not base64 text. Strict: the whole payload must be base64 (whitespace aside),
    so a binary image never takes this path, and what it decodes to is then decoded as
    any image is, with the same errors."""
    uri = _DATA_URI.match(data)
    if not uri and not _BASE64.fullmatch(_WHITESPACE.sub(b"", data[:64]).rstrip(b"=") or b"="):
        return None  # a binary image: its first bytes are not base64 (the common case, checked cheaply)
    body = _WHITESPACE.sub(b"", data[uri.end():] if uri else data)
    if len(body) % 4 or len(body) < 8 or not _BASE64.fullmatch(body):
        if uri:
            raise ImageError("corrupt", "the data URI's payload is not valid base64")
        return None
    return base64.b64decode(body, validate=True)


def _decode_binary(data: bytes, policy: DecodePolicy) -> Image.Image:
    try:
        with warnings.catch_warnings():
            # Pillow warns (and only warns) between MAX_IMAGE_PIXELS and 2x; we check size ourselves.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=list(policy.formats))
    except Image.DecompressionBombError:
        # Pillow refuses outright above 2 * MAX_IMAGE_PIXELS (~179 M), whatever max_pixels says.
        limit = min(policy.max_pixels, 2 * Image.MAX_IMAGE_PIXELS)
        raise ImageError("too_many_pixels", f"image declares more than {limit} pixels") from None
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types on bad headers
        claimed = _claimed_format(data, policy.formats)
        if isinstance(exc, UnidentifiedImageError):
            if claimed is None:
                raise ImageError("unsupported_format",
                                 f"not a decodable image (allowed formats: {', '.join(policy.formats)})") from None
            problem = _header_problem(data, claimed)  # e.g. a PNG whose header CRC is broken
        else:
            problem = _short(exc)
        raise ImageError("corrupt", f"cannot read {claimed or 'image'} header: {problem}") from None

    width, height = img.size
    if width < 1 or height < 1:
        raise ImageError("corrupt", f"image has an empty size {width}x{height}")
    if width * height > policy.max_pixels:
        raise ImageError("too_many_pixels",
                         f"image is {width}x{height} = {width * height} pixels, over the {policy.max_pixels}-pixel "
                         "limit")

    try:
        if img.format == "JPEG" and policy.draft_min_side > 0:
            img.draft("RGB", (policy.draft_min_side, policy.draft_min_side))
        # Animated GIF/WebP and multi-page TIFF: Image.open leaves us on frame 0.
        img.load()
        scale = width / img.width  # > 1 when the JPEG was decoded at a reduced scale (draft)
        ImageOps.exif_transpose(img, in_place=True)  # a copy of every image otherwise, turned or not
        rgb = _to_rgb(img, policy.background)
        if scale != 1:
            rgb.info[DECODE_SCALE] = scale
        return rgb
    except ImageError:
        raise
    except Exception as exc:  # noqa: BLE001 - truncated data, bad CRC, codec errors
        raise ImageError("corrupt", f"cannot decode {img.format} image: {_short(exc)}") from None


_HIGH_BIT_GREY = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def _to_rgb(img: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    mode = img.mode
    # A PNG tRNS chunk on a 1/L/RGB/16-bit image is a colour key: pixels of exactly that
    # value are transparent, and get the background like any other transparent pixel.
    key = img.info.get("transparency")
    if mode in _HIGH_BIT_GREY:
        # 16-bit greyscale: scale the full range to 8 bits. Pillow's convert("L") clips at 255
        # (and so does its convert("RGBA"), hence the colour key is applied here too).
        raw = np.asarray(img)
        grey = np.clip(raw.astype(np.float32) / 257.0 + 0.5, 0, 255).astype(np.uint8)
        rgb = Image.fromarray(grey, "L").convert("RGB")
        if isinstance(key, int):
            rgb.paste(background, mask=Image.fromarray(raw == key))
        return rgb
    if mode == "F":
        grey = np.clip(np.asarray(img, dtype=np.float32) + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    if mode in ("1", "L", "RGB", "P") and key is not None:
        img = img.convert("RGBA")  # Pillow turns the key (or the palette's alpha) into an alpha channel
    elif mode == "RGB":
        return img
    elif mode == "P":
        img = img.convert("RGB")
    elif mode in ("LA", "La", "PA", "RGBa"):
        img = img.convert("RGBA")
    if img.mode == "RGBA":
        canvas = Image.new("RGB", img.size, background)
        canvas.paste(img, mask=img.getchannel("A"))
        return canvas
    # L, 1, CMYK (Adobe-inverted handled by Pillow), YCbCr, LAB, HSV.
    return img.convert("RGB")


def _claimed_format(data: bytes, formats: tuple[str, ...]) -> str | None:
    """The allowed format whose signature `data` starts with, if any."""
    Image.init()
    head = data[:16]
    for fmt in formats:
        accept = Image.OPEN[fmt][1] if fmt in Image.OPEN else None
        if accept is not None and accept(head):
            return fmt
    return None


def _header_problem(data: bytes, fmt: str) -> str:
    """Why `fmt`'s plugin refuses `data`: Image.open only says "cannot identify image file".

    Opening parses the header only (no pixels are decoded), so this costs no more than the
    Image.open call that already failed.
    """
    try:
        Image.OPEN[fmt][0](io.BytesIO(data), None).close()
    except Exception as exc:  # noqa: BLE001 - the plugins raise SyntaxError, struct.error, ...
        # ImageFile wraps the struct.error/EOFError of a header cut short in a SyntaxError.
        cause = exc.args[0] if isinstance(exc, SyntaxError) and exc.args else exc
        if isinstance(cause, (struct.error, EOFError)):
            return "the header is truncated"
        if isinstance(cause, KeyError):  # a header field value the plugin has no entry for
            return f"unsupported header value {_short(cause)}"
        if str(exc) == "not identified by this driver":  # parsed to the end without finding a frame
            return "no image found after the signature"
        return _short(exc)
    return "the file starts like one but is damaged"


# Pillow quotes bytes read from the payload in some messages: b'IHDR' is worth keeping
# (which chunk is broken), anything else is client bytes that may hold '/' and worse.
_BYTES_REPR = re.compile(r"""\bb(["'])((?:\\.|(?!\1).)*)\1""")


def _bytes_repr(match: re.Match) -> str:
    return match.group(2) if re.fullmatch(r"[A-Za-z0-9 ]{1,8}", match.group(2)) else "<bytes>"


def _short(exc: Exception) -> str:
    """One printable line from an exception, with bytes quoted from the payload left out.

    Pillow's messages never name a file here (images are opened from BytesIO); what they
    can carry is a repr of bytes read from the payload, which may hold anything, '/' included.
    """
    text = str(exc).splitlines()[0] if str(exc) else ""
    text = _BYTES_REPR.sub(_bytes_repr, text)
    text = "".join(ch for ch in text if ch.isprintable() and ch.isascii()).strip()
    return text[:200] or type(exc).__name__
