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
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ...contract import PROBE_PARAMETER
from .settings import Probability

__all__ = ["ParameterError", "Parameters", "RowParameters", "TRITON_PARAMETERS"]

# Request parameters Triton reads itself (its frontends take most of them out before a model
# sees the request) and the watchdog's probe: never a flow's.
TRITON_PARAMETERS = frozenset({"timeout", "priority", "sequence_id", "sequence_start", "sequence_end", "binary_data_output",
                               "headers", PROBE_PARAMETER})
_TYPES = (bool, int, float, str, Probability)
_NUMPY = {bool: np.bool_, int: np.int64, float: np.float64, Probability: np.float64, str: object}


class ParameterError(ValueError):
    """A request's parameter is unknown or its value is wrong; the message names it."""


@dataclass(frozen=True)
class _Param:
    name: str
    type: type
    default: Any

    def parse(self, value: Any) -> Any:
        kind, name = self.type, self.name
        if kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "false"):
                return value.strip().lower() == "true"
            raise ParameterError(f"request parameter {name}={value!r}: send true or false")
        if kind is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise ParameterError(f"request parameter {name}={value!r}: send a whole number{_not_a_string(value, whole=True)}")
        if kind in (float, Probability):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                wanted = "a number between 0 and 1" if kind is Probability else "a finite number"
                raise ParameterError(f"request parameter {name}={value!r}: send {wanted}{_not_a_string(value)}")
            number = float(value)
            if not math.isfinite(number):
                raise ParameterError(f"request parameter {name}={value!r}: send a finite number")
            if kind is Probability and not 0.0 <= number <= 1.0:
                raise ParameterError(f"request parameter {name}={value!r}: send a number between 0 and 1")
            return number
        if not isinstance(value, str):
            raise ParameterError(f"request parameter {name}={value!r}: send a string")
        return value

    def describe(self) -> str:
        return f"{self.name} ({'probability 0..1' if self.type is Probability else self.type.__name__}, default {self.default!r})"


class Parameters:
    """Base class of a flow's request parameters: one annotated class attribute each.

        class MyParameters(Parameters):
            skip_cascade: bool = False
            threshold: Probability = 0.5

    Types: bool, int, float, str, Probability. Each needs a default: what a request that
    does not send it gets.
    """

    _fields: typing.ClassVar[tuple[_Param, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        hints = typing.get_type_hints(cls)
        fields = []
        for name in cls.__dict__.get("__annotations__", {}):
            hint = hints[name]
            if typing.get_origin(hint) is typing.ClassVar or hint is typing.ClassVar:
                continue
            if hint not in _TYPES:
                raise TypeError(f"request parameter {cls.__name__}.{name}: type {hint!r} is not supported; use one of "
                                "bool, int, float, str, Probability")
            if name not in cls.__dict__:
                raise TypeError(f"request parameter {cls.__name__}.{name} needs a default value")
            if name in TRITON_PARAMETERS:
                raise TypeError(f"request parameter {cls.__name__}.{name}: {name!r} is Triton's own; choose another name")
            param = _Param(name, hint, None)
            fields.append(_Param(name, hint, param.parse(cls.__dict__[name])))
        cls._fields = tuple(f for f in getattr(cls, "_fields", ()) if f.name not in {f.name for f in fields}) + tuple(fields)

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
            raise ParameterError(f"unknown request parameter {unknown[0]!r}: {flow} accepts {accepts} (and Triton's own, "
                                 "e.g. timeout)")
        return {f.name: f.parse(sent[f.name]) if f.name in sent else f.default for f in cls._fields}


def _not_a_string(value: Any, whole: bool = False) -> str:
    """What to write instead of a number sent as a string ("0.9": 0.9), or nothing."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return ""
        if math.isfinite(number) and (number.is_integer() or not whole):
            return f", as a JSON number: {value.strip()}, not the string {value!r}"
    return ""


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
                            f"{', '.join(self._declared.names()) or 'none'}); declare it in a Parameters class in flow.py")
        if name not in self._cache:
            per_request = [v[name] if v is not None else field.default for v in self._values]
            self._cache[name] = np.array([per_request[r] for r in self._owners], dtype=_NUMPY[field.type]).reshape(-1)
        return self._cache[name]
