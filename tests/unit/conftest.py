"""Image builders shared by the unit tests, handed out as fixtures.

Fixtures rather than `from conftest import ...`: a conftest outside a package is not a
reliably importable module once tests/integration grows one of its own.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image


def _encode(img: Image.Image, fmt: str, **save_kwargs) -> bytes:
    """`img` encoded as `fmt` (a Pillow format name), as a client would send it."""
    buf = io.BytesIO()
    img.save(buf, fmt, **save_kwargs)
    return buf.getvalue()


def _noise_image(width: int, height: int, seed: int = 0) -> Image.Image:
    """Uniform RGB noise: every resampling or crop-offset mistake shows up in it."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


def _smooth_image(width: int, height: int) -> Image.Image:
    """Low-frequency RGB gradients, closer to a photo than noise is."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = x / max(width - 1, 1), y / max(height - 1, 1)
    rgb = np.stack([u, v, 0.5 + 0.5 * np.sin(6.0 * u + 4.0 * v)], axis=-1)
    return Image.fromarray((rgb * 255.0 + 0.5).astype(np.uint8), "RGB")


def _halves_image(width: int, height: int, left: tuple[int, int, int], right: tuple[int, int, int]) -> Image.Image:
    """Left half one colour, right half another: shows rotations and flips."""
    pixels = np.empty((height, width, 3), dtype=np.uint8)
    pixels[:, : width // 2] = left
    pixels[:, width // 2:] = right
    return Image.fromarray(pixels, "RGB")


@pytest.fixture(scope="session")
def encode():
    return _encode


@pytest.fixture(scope="session")
def noise_image():
    return _noise_image


@pytest.fixture(scope="session")
def smooth_image():
    return _smooth_image


@pytest.fixture(scope="session")
def halves_image():
    return _halves_image
