"""ImageNet-1k class names shipped with the package (index order of torchvision's weights)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

__all__ = ["imagenet_labels"]


@lru_cache(maxsize=1)
def imagenet_labels() -> tuple[str, ...]:
    text = (Path(__file__).parent / "data" / "imagenet_labels.txt").read_text(encoding="utf-8")
    labels = tuple(line for line in text.splitlines() if line)
    if len(labels) != 1000:
        raise RuntimeError(f"imagenet_labels.txt has {len(labels)} labels, expected 1000")
    return labels
