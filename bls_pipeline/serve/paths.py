"""Where bls-serve and the tools find a model repository and photos: given on the command line, else the
source checkout's models/ and samples/ when the package runs from one."""

from __future__ import annotations

from pathlib import Path

__all__ = ["checkout", "default_models", "default_samples", "shared_mug"]


def checkout() -> Path | None:
    """The source checkout this package runs from, or None for an installed package."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "models").is_dir() else None


def default_models() -> Path | None:
    """./models if there is one, else the checkout's models/, else None."""
    here = Path("models")
    if (here / "classify_bls").is_dir():
        return here
    root = checkout()
    return root / "models" if root else None


def default_samples() -> Path | None:
    root = checkout()
    return root / "samples" if root and (root / "samples").is_dir() else None


def shared_mug() -> Path | None:
    """../shared/images/mug.jpg beside the checkout (the 12-megapixel photo), if present."""
    root = checkout()
    path = root.parent / "shared" / "images" / "mug.jpg" if root else None
    return path if path and path.is_file() else None
