"""A hook that lets a tool time the runtime's stages from outside (bls-trace), free when unused.

The runtime wraps its stages in `with stage("decode_preprocess"):` and so on; a tool
calls `listen(fn)` and `fn(name, "start" | "end")` runs at each edge. With no listener,
`stage()` returns one shared no-op context.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

__all__ = ["listen", "stage"]

Listener = Callable[[str, str], None]

_listener: Listener | None = None
_NOTHING = nullcontext()


class _Stage:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __enter__(self) -> None:
        if _listener is not None:
            _listener(self.name, "start")

    def __exit__(self, *exc) -> None:
        if _listener is not None:
            _listener(self.name, "end")


def stage(name: str):
    """A context that reports `name`'s start and end to the listener, if there is one."""
    return _NOTHING if _listener is None else _Stage(name)


def listen(listener: Listener | None) -> None:
    """Report every stage to `listener` from now on (None: stop)."""
    global _listener
    _listener = listener
