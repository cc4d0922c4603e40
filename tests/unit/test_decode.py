"""decode(): every mode a client may send ends up as an upright RGB image, or as an ImageError."""

from __future__ import annotations

import io
import math
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile

from bls_pipeline.stages.decode import DecodePolicy, ImageError, decode

RED, GREEN, BLUE, WHITE, BLACK = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255), (0, 0, 0)


def _pixels(img: Image.Image) -> np.ndarray:
    assert img.mode == "RGB"
    return np.asarray(img).astype(int)


def _close(actual, expected, tol: int) -> bool:
    return bool(np.all(np.abs(np.asarray(actual, dtype=int) - np.asarray(expected, dtype=int)) <= tol))


# ---- one test per mode ---------------------------------------------------------------

def test_rgb_jpeg(encode):
    img = decode(encode(Image.new("RGB", (30, 20), (200, 40, 90)), "JPEG", quality=95))
    assert img.size == (30, 20)
    assert _close(_pixels(img)[10, 15], (200, 40, 90), tol=3)


def test_greyscale_png(encode):
    img = decode(encode(Image.new("L", (5, 4), 77), "PNG"))
    assert img.size == (5, 4)
    assert (_pixels(img) == 77).all()


def test_la_png_composites_alpha_onto_white(encode):
    la = Image.new("LA", (2, 1))
    la.putdata([(50, 0), (50, 255)])  # fully transparent, opaque
    row = _pixels(decode(encode(la, "PNG")))[0]
    assert row[0].tolist() == list(WHITE)
    assert row[1].tolist() == [50, 50, 50]


def test_palette_png_with_transparency(encode):
    pal = Image.new("P", (2, 1))
    pal.putpalette(list(RED) + list(BLUE) + [0] * (256 * 3 - 6))
    pal.putdata([0, 1])
    row = _pixels(decode(encode(pal, "PNG", transparency=0)))[0]  # tRNS: index 0 transparent
    assert row[0].tolist() == list(WHITE)
    assert row[1].tolist() == list(BLUE)


@pytest.mark.parametrize(
    ("mode", "values", "key", "opaque"),
    [("RGB", [(1, 2, 3), (200, 40, 90)], (1, 2, 3), (200, 40, 90)),
     ("L", [7, 77], 7, (77, 77, 77)),
     ("I;16", [7 * 257, 77 * 257], 7 * 257, (77, 77, 77)),  # scaled to 8 bits, key matched on the 16-bit value
     ("1", [0, 255], 0, WHITE)],
    ids=["rgb", "grey", "grey-16bit", "one-bit"],
)
def test_png_colour_key_composites_onto_background(encode, mode, values, key, opaque):
    """A tRNS colour key makes pixels of exactly that value transparent, as a palette PNG's tRNS does."""
    if mode == "I;16":
        img = Image.fromarray(np.array([values], dtype=np.uint16))
    else:
        img = Image.new(mode, (2, 1))
        img.putdata(values)
    data = encode(img, "PNG", transparency=key)
    assert Image.open(io.BytesIO(data)).info["transparency"] == key  # the decode path under test
    row = _pixels(decode(data, DecodePolicy(background=(0, 128, 0))))[0]
    assert row[0].tolist() == [0, 128, 0]
    assert row[1].tolist() == list(opaque)


def test_rgba_png_composites_alpha_onto_white(encode):
    rgba = Image.new("RGBA", (3, 1))
    rgba.putdata([(255, 0, 0, 0), (0, 0, 255, 255), (255, 0, 0, 128)])
    row = _pixels(decode(encode(rgba, "PNG")))[0]
    assert row[0].tolist() == list(WHITE)
    assert row[1].tolist() == list(BLUE)
    assert _close(row[2], (255, 127, 127), tol=1)  # half red over white


def test_background_colour_comes_from_policy(encode):
    rgba = Image.new("RGBA", (1, 1), (10, 20, 30, 0))
    img = decode(encode(rgba, "PNG"), DecodePolicy(background=(0, 128, 0)))
    assert _pixels(img)[0, 0].tolist() == [0, 128, 0]


def test_cmyk_jpeg(encode):
    cmyk = Image.new("CMYK", (16, 16), (0, 255, 255, 0))  # no cyan, full magenta + yellow: red
    img = decode(encode(cmyk, "JPEG", quality=95))
    assert _close(_pixels(img)[8, 8], RED, tol=4)


@pytest.mark.parametrize(
    ("fmt", "dtype", "opened_mode"),
    [("PNG", np.uint16, "I;16"), ("TIFF", np.uint16, "I;16"), ("TIFF", np.int32, "I")],
)
def test_16_bit_greyscale_is_scaled_not_clipped(encode, fmt, dtype, opened_mode):
    values = np.array([[0, 257 * 100, 32768, 65535]], dtype=dtype)
    data = encode(Image.fromarray(values), fmt)
    assert Image.open(io.BytesIO(data)).mode == opened_mode  # the decode path under test
    grey = _pixels(decode(data))[0]
    assert grey[:, 0].tolist() == [0, 100, 128, 255]  # convert("L") would clip 32768 to 255
    assert (grey == grey[:, :1]).all()  # R == G == B


def test_one_bit_png(encode):
    bilevel = Image.new("1", (2, 1))
    bilevel.putdata([0, 1])
    row = _pixels(decode(encode(bilevel, "PNG")))[0]
    assert row.tolist() == [list(BLACK), list(WHITE)]


def test_animated_gif_uses_first_frame(encode):
    frames = [Image.new("RGB", (8, 8), RED), Image.new("RGB", (8, 8), GREEN), Image.new("RGB", (8, 8), BLUE)]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    img = decode(data)
    assert _pixels(img)[4, 4].tolist() == list(RED)


def test_multipage_tiff_uses_first_page(encode):
    pages = [Image.new("RGB", (8, 6), BLUE), Image.new("RGB", (8, 6), RED)]
    img = decode(encode(pages[0], "TIFF", save_all=True, append_images=pages[1:]))
    assert img.size == (8, 6)
    assert _pixels(img)[3, 3].tolist() == list(BLUE)


@pytest.mark.parametrize("lossless", [False, True])
def test_webp(encode, lossless):
    img = decode(encode(Image.new("RGB", (16, 16), (30, 160, 220)), "WEBP", lossless=lossless, quality=95))
    assert img.size == (16, 16)
    assert _close(_pixels(img)[8, 8], (30, 160, 220), tol=0 if lossless else 4)


def test_bmp(encode):
    img = decode(encode(Image.new("RGB", (7, 3), (12, 34, 56)), "BMP"))
    assert img.size == (7, 3)
    assert (_pixels(img) == (12, 34, 56)).all()


# ---- orientation and draft -----------------------------------------------------------

@pytest.mark.parametrize(
    ("orientation", "top", "bottom"),
    [(6, RED, BLUE),   # rotate 90 CW: the left (red) half ends on top
     (8, BLUE, RED)],  # rotate 90 CCW: the left half ends at the bottom
)
def test_exif_orientation_is_applied(encode, halves_image, orientation, top, bottom):
    img = halves_image(40, 20, left=RED, right=BLUE)
    exif = img.getexif()
    exif[0x0112] = orientation
    decoded = decode(encode(img, "JPEG", exif=exif, quality=95))
    assert decoded.size == (20, 40)
    pixels = _pixels(decoded)
    assert _close(pixels[5, 10], top, tol=8)
    assert _close(pixels[34, 10], bottom, tol=8)


def test_without_exif_orientation_nothing_rotates(encode, halves_image):
    decoded = decode(encode(halves_image(40, 20, left=RED, right=BLUE), "JPEG", quality=95))
    assert decoded.size == (40, 20)
    assert _close(_pixels(decoded)[10, 5], RED, tol=8)


@pytest.fixture(scope="module")
def big_jpeg(encode):
    return encode(Image.new("RGB", (4000, 3000), (90, 140, 200)), "JPEG")


@pytest.mark.parametrize("min_side", [300, 512, 1000])
def test_draft_decodes_large_jpeg_at_reduced_scale(big_jpeg, min_side):
    img = decode(big_jpeg, DecodePolicy(draft_min_side=min_side))
    assert min_side <= min(img.size) < 2 * min_side
    assert img.size[0] * 3 == img.size[1] * 4  # aspect ratio kept
    assert _close(_pixels(img)[img.height // 2, img.width // 2], (90, 140, 200), tol=4)


def test_draft_disabled_decodes_full_size(big_jpeg):
    assert decode(big_jpeg, DecodePolicy(draft_min_side=0)).size == (4000, 3000)


# ---- errors --------------------------------------------------------------------------

def _png_with_size(encode, width: int, height: int) -> bytes:
    """A small valid PNG whose IHDR claims width x height (CRC fixed, so only the size lies)."""
    data = bytearray(encode(Image.new("RGB", (4, 4), RED), "PNG"))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def _assert_client_safe(err: ImageError) -> None:
    message = str(err)
    assert message
    assert "/" not in message
    assert "Traceback" not in message


def _decode_error(data: bytes, policy: DecodePolicy = DecodePolicy()) -> ImageError:
    with pytest.raises(ImageError) as info:
        decode(data, policy)
    _assert_client_safe(info.value)
    return info.value


def test_empty_payload():
    err = _decode_error(b"")
    assert err.reason == "empty"
    assert "empty" in str(err)


@pytest.mark.parametrize(
    "data",
    [np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
     b"<!DOCTYPE html><html><body>404 not found</body></html>"],
    ids=["random-bytes", "html"],
)
def test_not_an_image(data):
    err = _decode_error(data)
    assert err.reason == "unsupported_format"
    assert "PNG" in str(err)  # tells the client what it may send


def test_truncated_jpeg(encode, noise_image):
    data = encode(noise_image(300, 200), "JPEG")
    err = _decode_error(data[: len(data) // 2])
    assert err.reason == "corrupt"
    assert "truncated" in str(err)


def test_png_with_corrupted_crc(encode):
    data = bytearray(encode(Image.new("RGB", (8, 8), RED), "PNG"))
    data[29] ^= 0xFF  # first byte of the IHDR chunk's CRC; the PNG signature is intact
    err = _decode_error(bytes(data))
    assert err.reason == "corrupt"
    assert str(err) == "cannot read PNG header: broken PNG file (bad header checksum in IHDR)"


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("data", "expected"),
    [(PNG_SIGNATURE, "cannot read PNG header: the header is truncated"),
     # Pillow quotes the bad chunk name; the client's bytes (a '/' here) are not echoed back.
     (PNG_SIGNATURE + struct.pack(">I", 13) + b"IH/R" + bytes(17),
      "cannot read PNG header: broken PNG file (chunk <bytes>)"),
     (b"\xff\xd8\xff" + bytes(64), "cannot read JPEG header: no image found after the signature"),
     (b"GIF89a" + bytes(5), "cannot read GIF header: the header is truncated")],
    ids=["png-signature-only", "png-bad-chunk-name", "jpeg-no-frame", "gif-short"],
)
def test_damaged_header_names_the_format_and_the_problem(data, expected):
    err = _decode_error(data)
    assert err.reason == "corrupt"
    assert str(err) == expected


def test_png_with_corrupted_image_data(encode, noise_image):
    data = bytearray(encode(noise_image(16, 16), "PNG"))
    idat = data.index(b"IDAT")
    length = struct.unpack(">I", data[idat - 4:idat])[0]
    data[idat + 4 + length // 2] ^= 0xFF
    assert _decode_error(bytes(data)).reason == "corrupt"


def _jpeg_with_size(encode, width: int, height: int) -> bytes:
    """A small JPEG whose SOF0 header claims width x height (its scan is still 8x8's)."""
    data = bytearray(encode(Image.new("RGB", (8, 8), RED), "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@pytest.fixture
def no_pixel_decoding(monkeypatch) -> list:
    """Fails any pixel decoding (ImageFile.load); the list records the attempts."""
    attempts = []

    def load(self):
        attempts.append(self.format)
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    return attempts


def test_decompression_bomb_over_pillows_own_limit_is_refused(encode):
    err = _decode_error(_png_with_size(encode, 50_000, 50_000))
    assert err.reason == "too_many_pixels"
    assert str(err) == f"image declares more than {DecodePolicy().max_pixels} pixels"


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_header_over_max_pixels_is_refused_before_any_pixel_is_decoded(encode, no_pixel_decoding, fmt):
    """Over our max_pixels, under Pillow's own limit (so Pillow neither warns nor refuses):
    only our header check can answer, and it does before decoding."""
    limit = DecodePolicy().max_pixels
    side = math.isqrt(limit) + 1
    assert limit < side * side < Image.MAX_IMAGE_PIXELS
    data = (_png_with_size if fmt == "PNG" else _jpeg_with_size)(encode, side, side)
    assert Image.open(io.BytesIO(data)).size == (side, side)  # the header is all that lies
    err = _decode_error(data)
    assert err.reason == "too_many_pixels"
    assert str(err) == f"image is {side}x{side} = {side * side} pixels, over the {limit}-pixel limit"
    assert no_pixel_decoding == []


def test_a_header_within_max_pixels_is_decoded(encode, no_pixel_decoding):
    """The stand-in above does catch decoding: the same image under the limit reaches it."""
    err = _decode_error(_png_with_size(encode, 100, 100))
    assert err.reason == "corrupt" and no_pixel_decoding == ["PNG"]


def test_policy_pixel_limit(encode):
    err = _decode_error(encode(Image.new("RGB", (20, 20)), "PNG"), DecodePolicy(max_pixels=399))
    assert err.reason == "too_many_pixels"
    assert "20x20" in str(err)


def test_format_not_in_allow_list(encode):
    err = _decode_error(encode(Image.new("RGB", (8, 8)), "JPEG"), DecodePolicy(formats=("PNG",)))
    assert err.reason == "unsupported_format"
    assert "PNG" in str(err)


def test_payload_over_max_bytes(encode):
    data = encode(Image.new("RGB", (8, 8)), "PNG")
    err = _decode_error(data, DecodePolicy(max_bytes=len(data) - 1))
    assert err.reason == "too_large"
    assert str(len(data)) in str(err)
    assert decode(data, DecodePolicy(max_bytes=len(data))).size == (8, 8)  # the limit is inclusive
