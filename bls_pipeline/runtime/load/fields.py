"""Declared fields, the core under a flow's Settings and its request Parameters.

Both are one annotated class attribute per field, with a default; Declared reads them off a
subclass once (inherited ones first, redeclared ones replaced), and a Field knows its type
and how each source spells a value of it: a config.pbtxt parameter is a string
(Field.from_config: ConfigError naming the key and what to write), a request parameter a
typed JSON value (Field.from_request: ParameterError naming it and what to send). The
as_* functions read the config's strings for the runtime's own keys and a child's
preprocessing too.
"""

from __future__ import annotations

import math
import sys
import typing
from dataclasses import dataclass
from typing import Any

from ...base.errors import ConfigError

__all__ = ["Candidates", "Declared", "Field", "ParameterError", "Probability", "as_bool", "as_choice", "as_float",
           "as_int", "as_names"]


class ParameterError(ValueError):
    """A request's parameter is unknown or its value is wrong; the message names it."""


class Candidates(tuple):
    """An ordered list of models for one role: the first READY one answers.

    Written in config.pbtxt as comma-separated names ("resnet50_trt,resnet50_onnx"). A
    setting typed `Optional[Candidates]` may be "none" (or empty): the role is off and
    the setting is None.
    """

    def __new__(cls, names=()):
        return super().__new__(cls, names)

    def __repr__(self) -> str:
        return f"Candidates({','.join(self)!r})"


class Probability(float):
    """A float setting between 0 and 1 (a threshold on a top-1 probability)."""


# ---- a config.pbtxt value: a string ---------------------------------------------------------
def as_int(key: str, raw: str, minimum: int | None = None) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"parameter {key}={raw!r}: write a whole number, e.g. {key}: "
                          f"\"{max(minimum or 1, 1)}\"") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"parameter {key}={value}: must be >= {minimum}")
    return value


def as_float(key: str, raw: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    bounds = f"between {lo} and {hi}" if math.isfinite(lo) or math.isfinite(hi) else "(a finite number)"
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"parameter {key}={raw!r}: write a number {bounds}") from None
    if not (lo <= value <= hi and math.isfinite(value)):
        raise ConfigError(f"parameter {key}={value}: must be {bounds}")
    return value


def as_bool(key: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ConfigError(f"parameter {key}={raw!r}: write true or false")
    return value in ("true", "1", "yes")


def as_choice(choices: tuple[str, ...]):
    def parse(key: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ConfigError(f"parameter {key}={raw!r}: write one of {', '.join(choices)}")
        return value

    return parse


def as_names(key: str, raw: str, example: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    if not names:
        raise ConfigError(f"parameter {key} is empty: write a comma-separated list, e.g. {key}: \"{example}\"")
    return names


# ---- a request's value: typed JSON ---------------------------------------------------------
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


# ---- one field ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Field:
    name: str
    type: type
    optional: bool = False  # Optional[...]: "none" turns it off (value None)
    default: Any = None

    def from_config(self, raw: str) -> Any:
        """The value a config.pbtxt parameter's string gives; ConfigError naming the key."""
        key = self.name
        if self.optional and raw.strip().lower() in ("", "none"):
            return None
        if self.type is Candidates:
            example = ",".join(self.default) if self.default else "model_a,model_b"
            return Candidates(as_names(key, raw, example))
        if self.type is Probability:
            return Probability(as_float(key, raw, 0.0, 1.0))
        if self.type is bool:
            return as_bool(key, raw)
        if self.type is int:
            return as_int(key, raw)
        if self.type is float:
            return as_float(key, raw)
        return raw

    def from_request(self, value: Any) -> Any:
        """The value a request parameter sent as JSON gives; ParameterError naming it."""
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
            raise ParameterError(f"request parameter {name}={value!r}: send a whole "
                                 f"number{_not_a_string(value, whole=True)}")
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
        return (f"{self.name} ({'probability 0..1' if self.type is Probability else self.type.__name__}, default "
                f"{self.default!r})")


def optional_of(hint) -> Any:
    """X for Optional[X] / X | None, else None."""
    if typing.get_origin(hint) in (typing.Union, getattr(sys.modules.get("types"), "UnionType", ())):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0]
    return None


# ---- the declarations of a class ------------------------------------------------------------
class Declared:
    """Base of a class whose fields are its annotated class attributes, each with a default.

    A front end says what it calls a field (WHAT), which types it takes (TYPES, named in
    TYPE_NAMES), whether Optional[X] unwraps (OPTIONAL), and makes each Field (_field)."""

    WHAT: typing.ClassVar[str] = "field"
    TYPES: typing.ClassVar[tuple[type, ...]] = ()
    TYPE_NAMES: typing.ClassVar[str] = ""
    OPTIONAL: typing.ClassVar[bool] = False
    _fields: typing.ClassVar[tuple[Field, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        hints = typing.get_type_hints(cls)
        own = []
        for name in cls.__dict__.get("__annotations__", {}):
            hint = hints[name]
            if typing.get_origin(hint) is typing.ClassVar or hint is typing.ClassVar:
                continue
            inner = optional_of(hint) if cls.OPTIONAL else None
            kind = inner if inner is not None else hint
            if kind not in cls.TYPES:
                raise TypeError(f"{cls.WHAT} {cls.__name__}.{name}: type {hint!r} is not supported; use one of "
                                f"{cls.TYPE_NAMES}")
            if name not in cls.__dict__:
                raise TypeError(f"{cls.WHAT} {cls.__name__}.{name} needs a default value")
            own.append(cls._field(name, kind, inner is not None, cls.__dict__[name]))
        names = {f.name for f in own}
        cls._fields = tuple(f for f in cls._fields if f.name not in names) + tuple(own)

    @classmethod
    def _field(cls, name: str, kind: type, optional: bool, default: Any) -> Field:
        return Field(name, kind, optional, default)
