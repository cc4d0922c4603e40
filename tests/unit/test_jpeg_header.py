"""stages/jpeg_header.py's marker walk against Pillow's reading of the same headers.

The rule it must keep: for any bytes, gpu_jpeg either says "the CPU path" (None) or gives
exactly the header Pillow reads (size, grey, progressive, EXIF orientation); and the
JPEGs that cameras and encoders write stay on the GPU. The oracle below is the Pillow
reading the GPU path used before the walk.
"""

from __future__ import annotations

import io
import random
import struct
import warnings
from pathlib import Path

import pytest
from PIL import Image

from bls_pipeline.stages.decode import DecodePolicy
from bls_pipeline.stages.jpeg_header import JpegHeader, gpu_jpeg

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
SHARED_IMAGENET = Path(__file__).resolve().parents[3] / "shared" / "imagenet"
POLICY = DecodePolicy(max_pixels=400_000_000)


def pillow_header(data: bytes) -> JpegHeader | None:
    """What Pillow reads from the header: the GPU path's choice before the walk."""
    if not data.startswith(b"\xff\xd8\xff") or not data.endswith(b"\xff\xd9"):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data), formats=["JPEG"]) as img:
                (width, height), mode, info = img.size, img.mode, img.info
                orientation = img.getexif().get(0x0112, 1)
    except Exception:  # noqa: BLE001
        return None
    if mode not in ("RGB", "L") or info.get("adobe_transform") == 0 or width < 1 or height < 1:
        return None
    return JpegHeader(width, height, orientation if isinstance(orientation, int) and 1 <= orientation <= 8 else 1,
                      grey=mode == "L", progressive=bool(info.get("progressive") or info.get("progression")))


def agrees(data: bytes) -> bool:
    got = gpu_jpeg(data, POLICY)
    return got is None or got == pillow_header(data)


def _jpeg(image: Image.Image, **options) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", **options)
    return buf.getvalue()


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    exif[0x010F] = "camera maker"
    return exif.tobytes()


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes((0xFF, marker)) + struct.pack(">H", len(payload) + 2) + payload


def _insert(data: bytes, *segments: bytes) -> bytes:
    """Segments placed right after the start-of-image marker."""
    return data[:2] + b"".join(segments) + data[2:]


@pytest.fixture(scope="module")
def picture() -> Image.Image:
    return Image.linear_gradient("L").resize((160, 120)).convert("RGB")


@pytest.fixture(scope="module")
def plain(picture) -> bytes:
    return _jpeg(picture, quality=90)


def _tiff_orientation(order: str, kind: int, count: int, value: int, twice: bool = False) -> bytes:
    """An EXIF block by hand: one directory whose orientation entry is stored as asked."""
    entries = [(0x0112, kind, count, value)] * (2 if twice else 1)
    head = (b"II*\x00" if order == "<" else b"MM\x00*") + struct.pack(order + "I", 8)
    body = struct.pack(order + "H", len(entries))
    for tag, k, n, v in entries:
        body += (struct.pack(order + "HHI", tag, k, n)
                 + (struct.pack(order + "HH", v, 0) if k == 3 else struct.pack(order + "I", v)))
    return b"Exif\x00\x00" + head + body + struct.pack(order + "I", 0)


def test_what_encoders_write_stays_on_the_gpu_with_pillows_header(picture):
    cases = {
        "baseline": _jpeg(picture, quality=90),
        "progressive": _jpeg(picture, quality=90, progressive=True),
        "optimized": _jpeg(picture, quality=75, optimize=True),
        "grey": _jpeg(picture.convert("L"), quality=90),
        "subsampling 4:4:4": _jpeg(picture, quality=95, subsampling=0),
        "restart intervals": _jpeg(picture, quality=90, restart_marker_blocks=4),
        "icc profile": _jpeg(picture, icc_profile=b"\x00" * 3000),
        "comment": _jpeg(picture, comment=b"made here"),
        "dpi": _jpeg(picture, dpi=(300, 300)),
        **{f"exif orientation {n}": _jpeg(picture, exif=_exif(n)) for n in range(1, 9)},
        "exif without orientation": _jpeg(picture, exif=Image.Exif().tobytes()),
        "big-endian exif": _insert(_jpeg(picture), _segment(0xE1, _tiff_orientation(">", 3, 1, 6))),
        "exif and xmp": _jpeg(picture, exif=_exif(3), xmp=b'<x tiff:Orientation="6"/>'),
    }
    for name, data in cases.items():
        got = gpu_jpeg(data, POLICY)
        assert got is not None, name
        assert got == pillow_header(data), name
    assert gpu_jpeg(cases["exif orientation 6"], POLICY).orientation == 6
    assert gpu_jpeg(cases["big-endian exif"], POLICY).orientation == 6
    assert gpu_jpeg(cases["progressive"], POLICY).kind == "progressive"
    assert gpu_jpeg(cases["grey"], POLICY).kind == "grey"


def test_the_sample_photos_and_imagenet_photos_read_as_pillow_reads_them():
    files = sorted(SAMPLES.glob("*.jpg")) + sorted(SHARED_IMAGENET.glob("*.jpg"))
    assert files
    for path in files:
        data = path.read_bytes()
        got, want = gpu_jpeg(data, POLICY), pillow_header(data)
        assert got == want, path.name  # these all stay on the GPU where Pillow reads them


def test_what_pillow_refuses_or_reads_otherwise_goes_to_the_cpu(picture, plain):
    adobe = b"Adobe" + struct.pack(">HHHB", 100, 0, 0, 0)
    cases = {
        "cmyk": _jpeg(Image.new("CMYK", (64, 48), (10, 200, 30, 0))),
        "adobe rgb": _insert(plain, _segment(0xEE, adobe)),
        "adobe tag cut short": _insert(plain, _segment(0xEE, b"Adobe")),
        "jfif cut short": plain[:2] + _segment(0xE0, b"JFIF\x00") + plain[2:],
        "icc chunk cut short": _insert(plain, _segment(0xE2, b"ICC_PROFILE\x00\x01")),
        "photoshop name cut": _insert(plain, _segment(0xED, b"Photoshop 3.0\x00" + b"8BIM\x04\x04")),
        "bad quantisation table": _insert(plain, _segment(0xDB, b"\x00" * 40)),
        "junk between segments": _insert(plain, b"junk"),
        "a second frame header": _insert(plain, _segment(0xC0, b"\x08\x00\x10\x00\x10\x01\x01\x11\x00")),
        "lossless frame": _insert(plain, _segment(0xC3, b"\x08\x00\x10\x00\x10\x01\x01\x11\x00")),
        "12-bit frame": _insert(plain[:2], _segment(0xC0, b"\x0c\x00\x10\x00\x10\x01\x01\x11\x00")) + plain[2:],
        "two exif blocks": _jpeg(picture, exif=_exif(6))[:2] + _segment(0xE1, _tiff_orientation("<", 3, 1, 3))
        + _jpeg(picture, exif=_exif(6))[2:],
        "orientation as a LONG": _insert(plain, _segment(0xE1, _tiff_orientation("<", 4, 1, 6))),
        "orientation twice": _insert(plain, _segment(0xE1, _tiff_orientation("<", 3, 1, 6, twice=True))),
        "exif not tiff": _insert(plain, _segment(0xE1, b"Exif\x00\x00nonsense")),
        "exif directory out of range": _insert(plain, _segment(0xE1, b"Exif\x00\x00II*\x00\xff\xff\x00\x00")),
        "xmp orientation only": _jpeg(picture, xmp=b'<x tiff:Orientation="6"/>'),
        "segment past the end": plain[:2] + b"\xff\xe1\xff\xf0" + b"\x00" * 10 + b"\xff\xd9",
        "restart marker before the scan": _insert(plain, b"\xff\xd0"),
        "no frame header": b"\xff\xd8" + _segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
        + b"\xff\xda\x00\x02\xff\xd9",
    }
    for name, data in cases.items():
        assert gpu_jpeg(data, POLICY) is None, name


def test_limits_and_formats_of_the_policy(plain):
    assert gpu_jpeg(plain, POLICY) is not None
    assert gpu_jpeg(plain, DecodePolicy(formats=("PNG",))) is None
    assert gpu_jpeg(plain, DecodePolicy(max_pixels=160 * 120 - 1)) is None
    assert gpu_jpeg(plain, DecodePolicy(max_bytes=len(plain) - 1)) is None
    assert gpu_jpeg(plain[:-2], POLICY) is None  # no end-of-image marker: the CPU decoder says it is truncated


def test_damaged_headers_never_read_otherwise_than_pillow(picture):
    """Random damage to the header bytes of real JPEGs (flipped bytes, cut segments): the
    walk may send an image to the CPU that Pillow would read, never the other way round."""
    rng = random.Random(1234)
    sources = [_jpeg(picture, quality=90, exif=_exif(6), icc_profile=b"\x01" * 200, comment=b"c"),
               _jpeg(picture.convert("L"), progressive=True, dpi=(72, 72))]
    sources += [p.read_bytes() for p in sorted(SAMPLES.glob("*.jpg"))[:2]]
    kept = 0
    for n in range(4000):
        data = bytearray(sources[n % len(sources)])
        scan = data.find(b"\xff\xda")
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(2, scan + 4)
            if rng.random() < 0.7:
                data[at] = rng.choice((0x00, 0xFF, 0x01, 0xE1, 0xC2, 0x08, rng.randrange(256)))
            else:
                del data[at:at + rng.randint(1, 8)]
        data = bytes(data)
        assert agrees(data), f"case {n}: walk {gpu_jpeg(data, POLICY)}, Pillow {pillow_header(data)}"
        kept += gpu_jpeg(data, POLICY) is not None
    assert kept > 100  # damage to image data that a header does not describe leaves most on the GPU
