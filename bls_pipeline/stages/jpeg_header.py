"""Which images the GPU decoder may take, read from their headers alone (no pixel decoded).

`gpu_jpeg(data, policy)` returns the JpegHeader of a plain JPEG that the GPU path decodes
itself, or None: that image then goes through stages/decode.py on the CPU, which answers
it exactly as the CPU path would (same pixels, same error). So only images the CPU path
would accept as they are come here: binary JPEG (not base64 text), JPEG allowed by the
policy, within its byte and pixel limits, RGB (YCbCr) or one grey component, ending with
the end-of-image marker (a truncated file is the CPU decoder's to refuse), not an Adobe
file stored as plain RGB or CMYK. The EXIF orientation is read here and applied on the GPU.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image

from .decode import DecodePolicy

__all__ = ["JpegHeader", "gpu_jpeg"]

_SOI = b"\xff\xd8\xff"  # start of image, then the first marker
_EOI = b"\xff\xd9"  # end of image
_ORIENTATION = 0x0112  # EXIF tag


@dataclass(frozen=True)
class JpegHeader:
    width: int
    height: int
    orientation: int  # EXIF orientation, 1..8 (1: as stored); other values are ignored, as by Pillow
    grey: bool  # one component: decoded as RGB with the grey replicated, as Pillow's convert("RGB")
    progressive: bool

    @property
    def kind(self) -> str:
        """What a decoder may refuse as a whole: "progressive", "grey" or "baseline"."""
        return "progressive" if self.progressive else "grey" if self.grey else "baseline"


def gpu_jpeg(data: bytes, policy: DecodePolicy) -> JpegHeader | None:
    """The header of a JPEG the GPU path may decode, or None (decode it on the CPU)."""
    if "JPEG" not in policy.formats or not 0 < len(data) <= policy.max_bytes:
        return None
    if not data.startswith(_SOI) or not data.endswith(_EOI):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=["JPEG"]) as img:
                width, height = img.size
                mode, info = img.mode, img.info
                orientation = img.getexif().get(_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - any header Pillow refuses: the CPU decode says why
        return None
    if mode not in ("RGB", "L") or info.get("adobe_transform") == 0:
        return None
    if width < 1 or height < 1 or width * height > policy.max_pixels:
        return None
    return JpegHeader(width, height, orientation if isinstance(orientation, int) and 1 <= orientation <= 8 else 1,
                      grey=mode == "L", progressive=bool(info.get("progressive") or info.get("progression")))
