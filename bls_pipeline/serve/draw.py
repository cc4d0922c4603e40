"""`bls-classify --draw`: an image with its answer drawn on it, for people who would rather
look than read. Drawn from the image's JSON document (runtime/answer/answer_json.py): each
region's box with its caption, and in the top left corner the image's top label (or, when
it has none, its route)."""

from __future__ import annotations

import io
from typing import Any, Mapping

from PIL import Image, ImageDraw, ImageFont, ImageOps

__all__ = ["draw_answer", "image_caption", "region_caption"]

_COLOURS = [(230, 25, 75), (60, 180, 75), (0, 130, 200), (245, 130, 48), (145, 30, 180), (70, 240, 240), (240, 50, 230)]


def draw_answer(data: bytes, document: Mapping[str, Any]) -> Image.Image:
    """The encoded image `data`, turned upright by its EXIF orientation as the server decodes it
    (so the boxes, in pixels of that image, land where they were found), with its answer drawn."""
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    canvas = ImageDraw.Draw(image)
    short = min(image.size)
    font = _font(max(12, round(short / 30)))
    width = max(2, round(short / 250))
    for j, region in enumerate(document.get("regions") or []):
        box = region.get("box")
        if not box:
            continue
        colour = _COLOURS[j % len(_COLOURS)]
        x0, y0, x1, y1 = box
        canvas.rectangle((x0, y0, max(x0, x1), max(y0, y1)), outline=colour, width=width)
        _label(canvas, region_caption(region), (x0, y0), colour, font, above=True)
    _label(canvas, image_caption(document), (0, 0), (0, 0, 0), font, above=False)
    return image


def image_caption(document: Mapping[str, Any]) -> str:
    """The image's top label and its score, else its route."""
    return _top(document) or document.get("route") or ""


def region_caption(region: Mapping[str, Any]) -> str:
    """What a region says: its text outputs (read_text's REGION_TEXT) when it has some, else
    its top label and score, else its route (why it was not looked at)."""
    texts = [v for v in (region.get("outputs") or {}).values() if isinstance(v, str) and v.strip()]
    return " ".join(texts) or _top(region) or region.get("route") or ""


def _top(answer: Mapping[str, Any]) -> str:
    labels, scores = answer.get("labels") or [], answer.get("scores") or []
    if not labels:
        return ""
    score = scores[0] if scores else None
    return labels[0] if score is None else f"{labels[0]} {score:.2f}"


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)  # Pillow's own scalable font (needs FreeType)
    except (TypeError, OSError, ImportError):
        return ImageFont.load_default()


def _label(canvas: ImageDraw.ImageDraw, text: str, at: tuple[float, float], colour, font, above: bool) -> None:
    """`text` in white on a `colour` band: above the point when there is room (a box's
    caption), else below it, inside the box."""
    if not text:
        return
    x, y = at
    left, top, right, bottom = canvas.textbbox((0, 0), text, font=font)
    pad = max(2, (bottom - top) // 6)
    height = bottom - top + 2 * pad
    y = y - height if above and y - height >= 0 else y
    canvas.rectangle((x, y, x + right - left + 2 * pad, y + height), fill=colour)
    canvas.text((x + pad - left, y + pad - top), text, fill=(255, 255, 255), font=font)
