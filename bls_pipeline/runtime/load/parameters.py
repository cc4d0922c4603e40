"""What a client may choose per request: the flow's declared request parameters.

A flow declares them in its flow.py as it declares its settings, one annotated class
attribute each, with a default:

    class ClassifyParameters(Parameters):
        skip_cascade: bool = False  # this request's images go straight to the main classifier

A client sends them as KServe v2 request `parameters` (curl: `"parameters": {"skip_cascade":
true}`; tritonclient: `infer(..., parameters={"skip_cascade": True})`). The flow reads them
per row, beside its images: `batch.params.skip_cascade` is a numpy array, one value per row
(a region's is its image's). A value of the wrong type or out of range, or a name the flow
does not declare, fails that request alone (400 / INVALID_ARGUMENT, naming it). Triton's own
request parameters (its `timeout`, `priority`, sequence ids) and the watchdog's probe pass
by untouched.

Types: bool, int, float, str and Probability (a float within 0..1). A number is a JSON
number (an int, float or Probability parameter sent as the string "0.9" fails with 400, saying
to send 0.9); a bool is true or false (the strings "true" and "false" are taken too). Every
client sends typed values: tritonclient and curl's JSON as written, perf_analyzer's
--request-parameter as int, bool or string (so perf_analyzer cannot send a float parameter).
The declarations and their checks are fields.py's, which Settings reads with too.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ...contract import PROBE_PARAMETER
from .fields import Declared, Field, ParameterError, Probability

__all__ = ["Parameters", "RowParameters", "TRITON_PARAMETERS"]

# Request parameters Triton reads itself (its frontends take most of them out before a model
# sees the request) and the watchdog's probe: never a flow's.
TRITON_PARAMETERS = frozenset({"timeout", "priority", "sequence_id", "sequence_start", "sequence_end",
                               "binary_data_output", "headers", PROBE_PARAMETER})
_NUMPY = {bool: np.bool_, int: np.int64, float: np.float64, Probability: np.float64, str: object}


class Parameters(Declared):
    """Base class of a flow's request parameters: one annotated class attribute each.

        class MyParameters(Parameters):
            skip_cascade: bool = False
            threshold: Probability = 0.5

    Types: bool, int, float, str, Probability. Each needs a default: what a request that
    does not send it gets.
    """

    WHAT = "request parameter"
    TYPES = (bool, int, float, str, Probability)
    TYPE_NAMES = "bool, int, float, str, Probability"

    @classmethod
    def _field(cls, name: str, kind: type, optional: bool, raw: Any) -> Field:
        """The parameter, its default checked as a request's value would be."""
        if name in TRITON_PARAMETERS:
            raise TypeError(f"request parameter {cls.__name__}.{name}: {name!r} is Triton's own; choose another name")
        return Field(name, kind, default=Field(name, kind).from_request(raw))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in cls._fields)

    @classmethod
    def read(cls, sent: Mapping[str, Any], flow: str) -> dict[str, Any]:
        """This request's value of each declared parameter (its default where it sent none);
        ParameterError naming the first unknown name or bad value."""
        known = {f.name: f for f in cls._fields}
        unknown = sorted(k for k in sent if k not in known and k not in TRITON_PARAMETERS)
        if unknown:
            accepts = ", ".join(f.describe() for f in cls._fields) or "none of its own"
            raise ParameterError(f"unknown request parameter {unknown[0]!r}: {flow} accepts {accepts} (and Triton's "
                                 "own, e.g. timeout)")
        return {f.name: f.from_request(sent[f.name]) if f.name in sent else f.default for f in cls._fields}


class RowParameters:
    """The flow's request parameters per row: `batch.params.NAME` is a numpy array, one value
    per row, each its request's."""

    def __init__(self, declared: type[Parameters], values: Sequence[Mapping[str, Any] | None], owners: np.ndarray):
        self._declared, self._values, self._owners = declared, values, owners
        self._cache: dict[str, np.ndarray] = {}

    def __repr__(self) -> str:
        return f"RowParameters({', '.join(self._declared.names()) or 'none declared'}; {len(self._owners)} rows)"

    def __getattr__(self, name: str) -> np.ndarray:
        if name.startswith("_"):
            raise AttributeError(name)
        field = next((f for f in self._declared._fields if f.name == name), None)
        if field is None:
            from ..errors import FlowError

            raise FlowError(f"batch.params.{name}: the flow declares no request parameter {name!r} (declared: "
                            f"{', '.join(self._declared.names()) or 'none'}); declare it in a Parameters class in "
                            "flow.py")
        if name not in self._cache:
            per_request = [v[name] if v is not None else field.default for v in self._values]
            self._cache[name] = np.array([per_request[r] for r in self._owners], dtype=_NUMPY[field.type]).reshape(-1)
        return self._cache[name]
