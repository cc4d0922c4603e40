"""The error a wrong model setting raises, wherever it is read (a flow's settings, a child's
config, an engine's parameters)."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A config.pbtxt setting is missing or wrong; the message says what to write instead."""
