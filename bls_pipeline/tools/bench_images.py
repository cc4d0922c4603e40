"""The images bls-bench sends: the photos centre-cropped to 4:3 and resized (the set
docs/performance.md's tables were measured with) or as given, heavy 12-megapixel JPEGs, the
text pages the region targets read, and the preprocessed tensors the classifier targets get.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ..stages.decode import decode
from ..stages.preprocess import PreprocessSpec, preprocess_into

__all__ = ["HEAVY_SIZE", "IMAGE_SIZE", "ORIGINAL", "TEXT_LINES", "ImageSet", "announce", "image_set", "make_image_set",
           "parse_image_size", "region_pages", "synthetic_12mp", "tensor_set", "text_image_set"]


TEXT_LINES = (2, 3, 4, 5, 6, 8)


def make_image_set(sources: list[Path], size=(500, 375), quality=90) -> list[bytes]:
    """ImageNet-size JPEGs: each source centre-cropped to 4:3, resized, plus its mirror."""
    out = []
    for src in sources:
        img = _fitted(Image.open(src).convert("RGB"), size)
        for variant in (img, img.transpose(Image.FLIP_LEFT_RIGHT)):
            out.append(_jpeg(variant, quality))
    return out


def _fitted(img: Image.Image, size: tuple[int, int]) -> Image.Image:
    """img centre-cropped to 4:3, then resized to `size`."""
    w, h = img.size
    cw, ch = _crop_4_3(w, h)
    return img.crop(((w - cw) // 2, (h - ch) // 2, (w - cw) // 2 + cw, (h - ch) // 2 + ch)).resize(size, Image.BICUBIC)


def _crop_4_3(w: int, h: int) -> tuple[int, int]:
    return (w, w * 3 // 4) if w * 3 <= h * 4 else (h * 4 // 3, h)


def _jpeg(img: Image.Image, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


IMAGE_SIZE = (500, 375)  # --image-size's default: the ImageNet-size set docs/performance.md's tables were measured with
ORIGINAL = "original"  # --image-size original: the files as given
HEAVY_SIZE = (4000, 3000)  # --heavy-images: 12-megapixel JPEGs


@dataclass(frozen=True)
class ImageSet:
    """What bls-bench sends: the payloads, a line per file saying what was sent (changed, or
    as given), and one line for the tables."""

    payloads: list[bytes]
    notes: list[str]
    summary: str
    changed: bool  # the files were not sent as given
    sources: list[Path]  # the files Pillow reads, in order


def parse_image_size(text: str) -> tuple[int, int] | None:
    """--image-size: "WxH" (each photo centre-cropped to 4:3 and resized to it, with its mirror)
    or "original" (the files as given): the size, or None for original."""
    if text.strip().lower() == ORIGINAL:
        return None
    w, sep, h = text.lower().partition("x")
    if not sep or not w.strip().isdigit() or not h.strip().isdigit() or int(w) < 1 or int(h) < 1:
        raise ValueError(f"--image-size: {text!r} is neither WxH (e.g. 500x375) nor {ORIGINAL}")
    return int(w), int(h)


def _kb(data: bytes | int) -> str:
    n = data if isinstance(data, int) else len(data)
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 1024:.0f} KB"


def image_set(files: list[Path], size: tuple[int, int] | None = IMAGE_SIZE, heavy: int = 0) -> ImageSet:
    """The images bls-bench sends: `files` as given (size None), or each centre-cropped to 4:3,
    resized to `size` and sent with its mirror (make_image_set); then `heavy` 12-megapixel
    JPEGs, each a readable file scaled up to HEAVY_SIZE. A file Pillow cannot read is sent as
    given only; otherwise it is named in a ValueError."""
    if not files:
        raise ValueError("no images to send: the --images folder has no *.jpg or *.jpeg file")
    payloads, notes, readable = [], [], []
    for path in files:
        data = path.read_bytes()
        try:
            with Image.open(io.BytesIO(data)) as probe:
                w, h, kind = *probe.size, probe.format
        except Exception as exc:  # noqa: BLE001 - any unreadable file is named
            if size is not None:
                raise ValueError(f"{path}: Pillow cannot read it ({exc}), so it cannot be resized; "
                                 f"--image-size {ORIGINAL} sends the files as given") from exc
            payloads.append(data)
            notes.append(f"{path.name}: {_kb(data)}, not an image Pillow reads: sent as given")
            continue
        readable.append(path)
        if size is None:
            payloads.append(data)
            notes.append(f"{path.name}: {w}x{h} {kind}, {_kb(data)}: sent as given")
            continue
        pair = make_image_set([path], size)
        payloads += pair
        cw, ch = _crop_4_3(w, h)
        crop = f"centre-cropped to {cw}x{ch} (4:3), " if (cw, ch) != (w, h) else ""
        notes.append(f"{path.name}: {w}x{h} {kind}, {_kb(data)} -> {crop}resized to {size[0]}x{size[1]}, "
                     f"re-encoded as JPEG quality 90 ({_kb(pair[0])}), sent with its mirror")
    if heavy and not readable:
        raise ValueError("--heavy-images: none of the files is an image Pillow reads, to scale up")
    for k in range(heavy):
        src = readable[k % len(readable)]
        data = synthetic_12mp(src)
        payloads.append(data)
        notes.append(f"heavy {k + 1}: {HEAVY_SIZE[0]}x{HEAVY_SIZE[1]} JPEG ({HEAVY_SIZE[0] * HEAVY_SIZE[1] / 1e6:.0f} "
                     f"megapixels), {_kb(data)}: {src.name} scaled up (--heavy-images)")
    folder = files[0].parent
    these = f"the {len(files)} files of {folder}" if len(files) > 1 else f"{files[0]}"
    if size is None:
        summary = f"{these} as given (--image-size {ORIGINAL})"
    else:
        summary = (f"{len(payloads) - heavy} JPEGs of {size[0]}x{size[1]}: {these} centre-cropped "
                   f"to 4:3 and resized, each with its mirror (--image-size {size[0]}x{size[1]}: not the files as "
                   "given)")
    if heavy:
        summary += (f", and {heavy} heavy {HEAVY_SIZE[0]}x{HEAVY_SIZE[1]} JPEG{'s' if heavy > 1 else ''} "
                    "(--heavy-images)")
    return ImageSet(payloads, notes, summary, size is not None, readable)


def announce(images: ImageSet, size: tuple[int, int] | None) -> str:
    """What bls-bench prints before it sends anything: what it does to the files, per file."""
    if images.changed:
        head = (f"bls-bench sends CHANGED images, not the files as given (--image-size {size[0]}x{size[1]}, the "
                f"default, as docs/performance.md's tables were measured); --image-size {ORIGINAL} sends the files as "
                "they are:")
    else:
        head = "bls-bench sends the files as given:"
    return "\n".join([head, *(f"  {note}" for note in images.notes)])


def text_image_set(lines: tuple[int, ...] = TEXT_LINES, size=(500, 375)) -> list[bytes]:
    """Pages of dark words on light paper, one per entry of `lines` with that many lines, the
    last line of every other page upside down (read_text turns it round). Deterministic PNGs."""
    from PIL import ImageDraw, ImageFont

    words = ("TRITON", "BATCHED", "REGIONS", "PIPELINE", "SERVING", "FLOW", "DETECT", "READ", "ORIENT", "CROP")
    pages = []
    for n, count in enumerate(lines):
        height = size[1] // (count + 1)
        font = ImageFont.load_default(size=max(14, min(32, int(height * 0.6))))
        page = Image.new("RGB", size, (236, 232, 220))
        for i in range(count):
            text = f"{words[(n + i) % len(words)]} {100 + 7 * n + i}"
            line = Image.new("RGB", (size[0] - 40, height - 4), (236, 232, 220))
            ImageDraw.Draw(line).text((4, 2), text, fill=(20, 20, 30), font=font)
            if n % 2 and i == count - 1:
                line = line.rotate(180)
            page.paste(line, (20, 10 + i * height))
        buf = io.BytesIO()
        page.save(buf, "PNG")
        pages.append(buf.getvalue())
    return pages


def region_pages(samples: Path | None) -> list[bytes]:
    """What the region targets read: samples/sign.png (3 lines, one upside down) when there
    is one, then text_image_set()'s pages."""
    sign = samples / "sign.png" if samples is not None else None
    return ([sign.read_bytes()] if sign is not None and sign.is_file() else []) + text_image_set()


def tensor_set(images: list[bytes]) -> list[np.ndarray]:
    spec = PreprocessSpec()
    tensors = []
    for data in images:
        t = np.empty((1, *spec.input_shape), np.float32)
        preprocess_into(decode(data), spec, t[0])
        tensors.append(t)
    return tensors


def synthetic_12mp(src: Path) -> bytes:
    buf = io.BytesIO()
    Image.open(src).convert("RGB").resize(HEAVY_SIZE, Image.BICUBIC).save(buf, "JPEG", quality=90)
    return buf.getvalue()
