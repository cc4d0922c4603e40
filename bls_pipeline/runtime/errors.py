"""The runtime's exceptions: what a flow raises, and what a failed child call raises."""

from __future__ import annotations

__all__ = ["ChildCallError", "FlowError", "NoModelReady"]


class FlowError(RuntimeError):
    """The flow used the API wrongly (a model it did not declare, bad rows); the message says how."""


class NoModelReady(Exception):
    """Raise it from a flow when a role it cannot do without has no READY model: the runtime
    fails the pending requests with the models tried, in order (UNAVAILABLE: try again)."""


class ChildCallError(RuntimeError):
    """A child inference failed as a whole (model unloaded, server error, broken contract).

    unavailable: the model could not take the call at all (its stub died, it or that version
        is being unloaded): the runtime tries the call again, on the next READY candidate or
        on the same model once it is back, for up to child_retry_s, before it fails the
        requests, then as UNAVAILABLE.
    busy: the model refused the call for overload (its queue full, or the call waited out
        its queue timeout): not tried again; the requests fail as UNAVAILABLE.
    Any other failure (the child's own error, outputs that break its config's contract) is
    a broken part: the requests fail as INTERNAL, which no client should retry.
    model: the model that failed, when one did; role: what the flow called it for (its
        Candidates setting), set where the call's failure is final.
    """

    def __init__(self, message: str, unavailable: bool = False, *, busy: bool = False, model: str | None = None,
                 role: str | None = None):
        super().__init__(message)
        self.unavailable = unavailable
        self.busy = busy
        self.model = model
        self.role = role

    @property
    def temporary(self) -> bool:
        """Whether a client may get an answer by sending the request again later."""
        return self.unavailable or self.busy
