"""Images sent as base64 text (KServe v2 JSON, curl): decoded, strictly told apart from binary."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from bls_pipeline.stages.decode import DecodePolicy, ImageError, decode, from_base64


def _photo(fmt: str, mode: str = "RGB", size=(40, 30)) -> bytes:
    rng = np.random.default_rng(3)
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB").convert(mode)
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


BINARY = {fmt: _photo(fmt) for fmt in ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF")}


@pytest.mark.parametrize("fmt", sorted(BINARY))
def test_binary_images_never_look_like_base64(fmt):
    assert from_base64(BINARY[fmt]) is None


@pytest.mark.parametrize("fmt", sorted(BINARY))
def test_base64_plain_and_data_uri_decode_to_the_same_pixels(fmt):
    raw = BINARY[fmt]
    text = base64.b64encode(raw)
    wrapped = b"\n".join(text[i:i + 76] for i in range(0, len(text), 76))  # MIME-style line breaks
    uri = f"data:image/{fmt.lower()};base64,".encode() + text
    expected = np.asarray(decode(raw))
    for payload in (text, wrapped, uri):
        assert from_base64(payload) == raw
        np.testing.assert_array_equal(np.asarray(decode(payload)), expected)


@pytest.mark.parametrize(("payload", "reason", "message"), [
    (base64.b64encode(b"<html>not an image</html>"), "unsupported_format",
     "not a decodable image (allowed formats: JPEG, PNG, WEBP, BMP, GIF, TIFF) (in the base64 text sent)"),
    (base64.b64encode(BINARY["PNG"][:60]), "corrupt",
     "cannot decode PNG image: image file is truncated (in the base64 text sent)"),
    (b"data:image/png;base64,@@@@", "corrupt", "the data URI's payload is not valid base64"),
])
def test_base64_that_is_not_an_image_says_so(payload, reason, message):
    with pytest.raises(ImageError) as info:
        decode(payload)
    assert (info.value.reason, str(info.value)) == (reason, message)


def test_text_that_is_not_base64_is_an_undecodable_image():
    with pytest.raises(ImageError, match="not a decodable image") as info:
        decode(b"hello world, not base64!")
    assert "base64" not in str(info.value)


def test_the_limits_hold_for_base64_too():
    text = base64.b64encode(BINARY["PNG"])
    with pytest.raises(ImageError, match="over the 100-byte limit"):
        decode(text, DecodePolicy(max_bytes=100))
    with pytest.raises(ImageError, match="pixels, over the 100-pixel limit"):
        decode(text, DecodePolicy(max_pixels=100))
