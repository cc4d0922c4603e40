"""The runtime's exceptions: what a flow raises, and what a failed child call raises."""

from __future__ import annotations

__all__ = ["ChildCallError", "FlowError", "NoModelReady"]


class FlowError(RuntimeError):
    """The flow used the API wrongly (a model it did not declare, bad rows); the message says how."""


class NoModelReady(Exception):
    """Raise it from a flow when a role it cannot do without has no READY model: the runtime
    fails the pending requests with the models tried, in order."""


class ChildCallError(RuntimeError):
    """A child inference failed as a whole (model unloaded, server error, broken contract).

    unavailable: the model could not take the call at all (its stub died, it or that version
    is being unloaded): the runtime tries the call again, on the next READY candidate or on
    the same model once it is back, for up to child_retry_s, before it fails the requests.
    """

    def __init__(self, message: str, unavailable: bool = False):
        super().__init__(message)
        self.unavailable = unavailable
