"""Which images the GPU decoder may take, read from their headers alone (no pixel decoded).

`gpu_jpeg(data, policy)` returns the JpegHeader of a plain JPEG that the GPU path decodes
itself, or None: that image then goes through stages/decode.py on the CPU, which answers
it exactly as the CPU path would (same pixels, same error). So only images the CPU path
would accept as they are come here: binary JPEG (not base64 text), JPEG allowed by the
policy, within its byte and pixel limits, 8-bit RGB (YCbCr) or one grey component,
baseline, extended or progressive, ending with the end-of-image marker (a truncated file
is the CPU decoder's to refuse), not an Adobe file stored as plain RGB or CMYK. The EXIF
orientation is read here and applied on the GPU.

The markers are walked here in Python, not by Pillow: opening each image with Pillow cost
about 35 µs, a quarter of the GPU path's time per image at batch 256. The walk is strict:
anything it does not read exactly as Pillow would (junk between segments, a second frame
header or EXIF block, an orientation stored other than as one SHORT, XMP with no EXIF
orientation, since Pillow versions read XMP differently) sends the image to the CPU path,
which is right for every image, only slower. tests/unit/test_jpeg_header.py holds the
walk to Pillow's reading over crafted and real files.
"""

from __future__ import annotations

from dataclasses import dataclass
from struct import error as StructError, unpack_from

from PIL import Image

from .decode import DecodePolicy

__all__ = ["JpegHeader", "gpu_jpeg"]

_SOI = b"\xff\xd8\xff"  # start of image, then the first marker
_EOI = b"\xff\xd9"  # end of image
_ORIENTATION = 0x0112  # EXIF tag
_SOS, _DQT, _APP0, _APP1, _APP2, _APP13, _APP14 = 0xDA, 0xDB, 0xE0, 0xE1, 0xE2, 0xED, 0xEE
_FRAMES = {0xC0: False, 0xC1: False, 0xC2: True}  # frame headers nvjpeg decodes: baseline, extended, progressive
_OTHER_FRAMES = {0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF, 0xDE}  # lossless, hierarchical, arithmetic
# Bytes per value of the TIFF types (BYTE, ASCII, SHORT, LONG, RATIONAL, SBYTE, UNDEFINED,
# SSHORT, SLONG, SRATIONAL, FLOAT, DOUBLE, IFD).
_TIFF_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4}
_EXIF, _XMP = b"Exif\x00\x00", b"http://ns.adobe.com/xap/1.0/\x00"


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
        header = _walk(data)
    except (IndexError, StructError):  # a segment or an EXIF entry runs past the data
        return None
    if header is None or header.width * header.height > policy.max_pixels:
        return None
    if Image.MAX_IMAGE_PIXELS and header.width * header.height > 2 * Image.MAX_IMAGE_PIXELS:
        return None  # Pillow refuses to open it at all (a decompression bomb): the CPU path says so
    return header


def _walk(data: bytes) -> JpegHeader | None:
    """The segments from the first marker to the start of scan."""
    frame = exif = xmp = None
    adobe_transform = -1
    pos, end = 2, len(data)
    while True:
        if data[pos] != 0xFF:
            return None  # junk between segments (Pillow skips it; we do not guess)
        while data[pos] == 0xFF:  # fill bytes before a marker
            pos += 1
        marker = data[pos]
        if marker < 0xC0 or 0xD0 <= marker <= 0xD9:
            return None  # no segment can start here: a stray restart, start or end of image marker
        length = (data[pos + 1] << 8) | data[pos + 2]
        start, pos = pos + 3, pos + 1 + length
        if length < 2 or pos > end:
            return None  # Pillow reads the scan's header too: it must be whole
        if marker == _SOS:
            break
        if marker in _FRAMES:
            if frame is not None:
                return None
            frame = (marker, data[start:pos])
        elif marker in _OTHER_FRAMES:
            return None
        elif marker == _DQT and not _tables_fit(data[start:pos]):
            return None  # Pillow refuses the file
        elif marker == _APP1:
            if data.startswith(_EXIF, start):
                if exif is not None:
                    return None  # Pillow versions differ: joined, or the last one
                exif = data[start + len(_EXIF):pos]
            elif data.startswith(_XMP, start):
                xmp = True
        elif marker == _APP14 and data.startswith(b"Adobe", start):
            if pos - start < 7:
                return None  # Pillow refuses the file
            if pos - start > 11:
                adobe_transform = data[start + 11]
        elif not _pillow_reads(marker, data[start:pos]):
            return None
    if frame is None or adobe_transform == 0:
        return None
    marker, sof = frame
    if len(sof) < 6:
        return None
    bits, height, width, layers = sof[0], (sof[1] << 8) | sof[2], (sof[3] << 8) | sof[4], sof[5]
    if bits != 8 or layers not in (1, 3) or len(sof) != 6 + 3 * layers or width < 1 or height < 1:
        return None
    orientation = 0 if exif is None else _exif_orientation(exif)
    if orientation is None:
        return None
    if orientation == 0 and xmp:
        return None  # Pillow would look for an orientation in the XMP
    return JpegHeader(width, height, orientation if 1 <= orientation <= 8 else 1, grey=layers == 1,
                      progressive=_FRAMES[marker])


def _pillow_reads(marker: int, segment: bytes) -> bool:
    """False for the few application segments whose truncation makes Pillow refuse the file:
    a JFIF APP0 without its version, an ICC profile chunk without its sequence numbers, a
    Photoshop resource block cut inside a resource's name."""
    if marker == _APP0 and segment.startswith(b"JFIF"):
        return len(segment) >= 7
    if marker == _APP2 and segment.startswith(b"ICC_PROFILE\x00"):
        return len(segment) >= 14
    if marker == _APP13 and segment.startswith(b"Photoshop 3.0\x00"):
        offset = 14
        while segment[offset:offset + 4] == b"8BIM":
            if offset + 6 >= len(segment):
                return offset + 6 > len(segment)  # cut in the resource's code: Pillow stops there, no error
            offset += 7 + segment[offset + 6]
            offset += offset & 1
            if offset + 4 > len(segment):
                return True  # cut in the resource's size: Pillow stops there
            offset += 4 + int.from_bytes(segment[offset:offset + 4], "big")
            offset += offset & 1
    return True


def _tables_fit(segment: bytes) -> bool:
    """A DQT segment holds whole quantisation tables (65 or 129 bytes each), as Pillow checks."""
    pos = 0
    while pos < len(segment):
        pos += 65 if segment[pos] < 16 else 129
    return pos == len(segment)


def _exif_orientation(tiff: bytes) -> int | None:
    """The orientation in an EXIF block's first directory: 0 where it has none, None where
    the block is anything but a whole classic TIFF directory (every value inside the block,
    of a known type, none empty) with at most one orientation, one SHORT."""
    if tiff[:4] == b"II*\x00":
        order = "<"
    elif tiff[:4] == b"MM\x00*":
        order = ">"
    else:
        return None  # an empty block, a second "Exif" prefix, BigTIFF, not TIFF at all
    (first,) = unpack_from(order + "I", tiff, 4)
    (count,) = unpack_from(order + "H", tiff, first)
    if first < 8 or first + 2 + 12 * count > len(tiff):
        return None
    found = 0
    for entry in range(first + 2, first + 2 + 12 * count, 12):
        tag, kind, values, where = unpack_from(order + "HHII", tiff, entry)
        size = values * _TIFF_SIZES.get(kind, 0)
        if not size or (size > 4 and where + size > len(tiff)):
            return None  # a type we do not know, or a value past the block: Pillow drops the whole directory
        if tag == _ORIENTATION:
            if found or kind != 3 or values != 1:
                return None
            (found,) = unpack_from(order + "H", tiff, entry + 8)
            if found == 0:
                return None  # stored as 0: "none" and "found" would look alike here
    return found
