"""What a flow model reads once, at load, from its config.pbtxt `parameters`.

Two kinds of keys, checked together:
- the runtime's own (`RuntimeSettings`): TOPK default, decoding limits, threads, how often
  to look again for a preferred model. The same keys for every flow model.
- the flow's own: a `Settings` subclass in its flow.py declares them as annotated class
  attributes with defaults (name, type, default), e.g. `tta_threshold: Probability = 0.25`.

Every value is a string in config.pbtxt. An unknown key or a bad value raises ConfigError
naming the model, the key and what to write instead. One key more is accepted and ignored:
RELOAD_KEY, which the launcher's reload sets (serve/server.py `reload_model`). A flow's keys are
declared fields (fields.py), the core its request Parameters share.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from ...base.errors import ConfigError
from ...base.modelconfig import BACKEND_KEYS, RELOAD_KEY
from ...stages.decode import DEFAULT_FORMATS, DecodePolicy
from ..call.trials import Trial
from .fields import Candidates, Declared, Field, Probability, as_bool, as_choice, as_float, as_int, as_names

__all__ = ["RuntimeSettings", "Settings", "parse_settings"]


# ---- the runtime's own keys ----------------------------------------------------------------
@dataclass(frozen=True)
class RuntimeSettings:
    default_topk: int = 5  # labels per image when the request has no TOPK
    route_recheck_s: float = 5.0  # how often (s) to look again whether a preferred model came back
    # How long (s) a child call whose model could not take it (stub died, being unloaded) is
    # tried again, on the next READY candidate or on that model once it is back, before the
    # requests fail; requests that find no candidate READY wait as long after such a loss.
    # 0: no retry.
    child_retry_s: float = 10.0
    # Decode/preprocess threads per model instance; 0 = cores / instances (measured best
    # on 2 cores: more threads only fight the classifiers for the CPU).
    decode_threads: int = 0
    max_request_bytes: int = 64 * 1024 * 1024  # images in one request, summed
    # Regions one image may have (batch.regions); an image with more fails its own request,
    # so a detector gone wild cannot grow a request's memory without bound.
    max_regions_per_image: int = 256
    # A candidate tried beside a stable child (trials.py): "stable=candidate" with its share,
    # the parameters shadow + shadow_share (default 1) and canary + canary_share (default 0).
    shadow: Trial | None = None
    canary: Trial | None = None
    shadow_max_in_flight: int = 2  # mirrored calls in flight per instance; past it, not mirrored
    # One structured log line per execute() (its requests' ids, images, stage and child
    # timings, whose trace the child calls joined): for joining Triton's traces and logs.
    log_executions: bool = False
    # Children this flow runs in its own process (CPU engine models beside it; in_process.py):
    # no BLS hop to them, Triton's own statistics and traces of them see none of these calls.
    run_in_process: tuple[str, ...] = ()
    # What an optional stage (a call's `optional` rows: the flow has an answer for them) does
    # when it would end after a row's aim (admission.py): "degrade" skips it for that row, whose
    # answer stands, marked degraded; "refuse" runs it, and refuses rows whose own deadline it
    # cannot meet (503), as for any stage.
    overload: str = "degrade"
    # A request that sends no deadline aims to be answered within this many ms of its arrival:
    # an optional stage that would end later is skipped for it (never a refusal). 0: no aim.
    latency_target_ms: float = 0.0
    decode: DecodePolicy = DecodePolicy()


_DECODE_KEYS = ("max_pixels", "max_image_bytes", "allowed_formats", "draft_min_side")
_SHARE_KEYS = ("shadow_share", "canary_share")
RUNTIME_KEYS = tuple(sorted([f.name for f in dataclasses.fields(RuntimeSettings) if f.name != "decode"]
                            + list(_DECODE_KEYS) + list(_SHARE_KEYS)))
# Keys an earlier release read, and what to write instead.
REMOVED_KEYS = {
    "queue_delay_target_ms": "a flow no longer refuses requests on its queue's wait (Triton's max_queue_size bounds "
                             "the queue); for a latency aim that degrades optional stages instead, write "
                             "latency_target_ms (docs/reliability.md, \"Overload and deadlines\")",
}


OVERLOAD_CHOICES = ("degrade", "refuse")


def _model_names(key: str, raw: str) -> tuple[str, ...]:
    """Model names, comma-separated; "none" or empty: none."""
    return () if raw.strip().lower() in ("", "none") else tuple(n.strip() for n in raw.split(",") if n.strip())


def _runtime_settings(params: dict[str, str]) -> RuntimeSettings:
    d = RuntimeSettings()
    formats = d.decode.formats
    if "allowed_formats" in params:
        formats = tuple(f.upper() for f in as_names("allowed_formats", params["allowed_formats"], "JPEG,PNG"))
        bad = sorted(set(formats) - set(DEFAULT_FORMATS))
        if bad:
            raise ConfigError(f"parameter allowed_formats: {', '.join(bad)} not supported; choose from "
                              f"{', '.join(DEFAULT_FORMATS)}")

    def get(key: str, parse, default):
        return parse(key, params[key]) if key in params else default

    def trial(key: str, default_share: float) -> Trial | None:
        share = get(f"{key}_share", lambda k, v: as_float(k, v, 0.0, 1.0), default_share)
        if f"{key}_share" in params and not params.get(key, "").strip():
            raise ConfigError(f"parameter {key}_share is set but {key} is not: write {key}: \"stable=candidate\"")
        return parse_trial(key, params.get(key, ""), share)

    return RuntimeSettings(
        default_topk=get("default_topk", lambda k, v: as_int(k, v, 1), d.default_topk),
        route_recheck_s=get("route_recheck_s", lambda k, v: as_float(k, v, 0.0, 3600.0), d.route_recheck_s),
        child_retry_s=get("child_retry_s", lambda k, v: as_float(k, v, 0.0, 60.0), d.child_retry_s),
        decode_threads=get("decode_threads", lambda k, v: as_int(k, v, 0), d.decode_threads),
        max_request_bytes=get("max_request_bytes", lambda k, v: as_int(k, v, 1), d.max_request_bytes),
        max_regions_per_image=get("max_regions_per_image", lambda k, v: as_int(k, v, 1), d.max_regions_per_image),
        shadow=trial("shadow", 1.0),
        canary=trial("canary", 0.0),
        shadow_max_in_flight=get("shadow_max_in_flight", lambda k, v: as_int(k, v, 1), d.shadow_max_in_flight),
        log_executions=get("log_executions", as_bool, d.log_executions),
        run_in_process=get("run_in_process", _model_names, d.run_in_process),
        overload=get("overload", as_choice(OVERLOAD_CHOICES), d.overload),
        latency_target_ms=get("latency_target_ms", lambda k, v: as_float(k, v, 0.0, 600_000.0), d.latency_target_ms),
        decode=DecodePolicy(
            max_pixels=get("max_pixels", lambda k, v: as_int(k, v, 1), d.decode.max_pixels),
            max_bytes=get("max_image_bytes", lambda k, v: as_int(k, v, 1), d.decode.max_bytes),
            formats=formats,
            draft_min_side=get("draft_min_side", lambda k, v: as_int(k, v, 0), d.decode.draft_min_side),
        ),
    )


_PAIR = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*=\s*([A-Za-z0-9_.-]+)(?:@(\d+))?\s*$")


def parse_trial(key: str, raw: str, share: float) -> Trial | None:
    """`stable=candidate` (candidate: model or model@version) from a parameter; "" or "none": off."""
    if raw.strip().lower() in ("", "none"):
        return None
    match = _PAIR.match(raw)
    if not match:
        raise ConfigError(f"parameter {key}={raw!r}: write stable=candidate, e.g. {key}: "
                          "\"resnet50_onnx=resnet50_onnx@2\" (a candidate is a model, or model@version)")
    stable, model, version = match.group(1), match.group(2), match.group(3) or ""
    if model == stable and not version:
        raise ConfigError(f"parameter {key}={raw!r}: the candidate is the stable model itself; name its version "
                          f"(e.g. {stable}={stable}@2) or another model")
    return Trial(stable, model, version, share)


# ---- the flow's keys -----------------------------------------------------------------------
class Settings(Declared):
    """Base class of a flow's settings: one annotated class attribute per config.pbtxt key.

        class Settings(flow.Settings):
            classifiers: Candidates = "resnet50_trt,resnet50_onnx"  # first READY answers
            cascade_classifiers: Optional[Candidates] = None          # "none": off
            tta_threshold: Probability = 0.25

    Types: int, float, bool, str, Probability (0..1), Candidates (model names) and
    Optional[Candidates]. A default may be written as it would be in config.pbtxt (a
    string) or as the value itself. Subclasses become frozen dataclasses. The models a
    flow may call are exactly those its Candidates settings name.
    """

    WHAT = "setting"
    TYPES = (int, float, bool, str, Probability, Candidates)
    TYPE_NAMES = "int, float, bool, str, Probability, Candidates, Optional[Candidates]"
    OPTIONAL = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        dataclass(frozen=True)(cls)

    @classmethod
    def _field(cls, name: str, kind: type, optional: bool, raw: Any) -> Field:
        """The setting with its default parsed as config.pbtxt would give it; the class
        attribute becomes that value."""
        field = Field(name, kind, optional, None)
        default = field.from_config(raw) if isinstance(raw, str) and kind is not str else raw
        if default is not None and kind in (Candidates, Probability):
            default = field.from_config(",".join(default) if kind is Candidates else str(default))
        setattr(cls, name, default)
        return dataclasses.replace(field, default=default)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in cls._fields)

    @classmethod
    def parse(cls, params: dict[str, str]) -> "Settings":
        """The settings from config.pbtxt strings (keys of other kinds are ignored here)."""
        return cls(**{f.name: f.from_config(params[f.name]) for f in cls._fields if f.name in params})

    def role_of(self, candidates: tuple[str, ...]) -> str | None:
        """The name of the Candidates setting holding exactly these models (the role a failure
        names in the metrics), or None."""
        return next((f.name for f in self._fields if f.type is Candidates
                     and getattr(self, f.name) == tuple(candidates)), None)

    def candidate_lists(self) -> tuple[Candidates, ...]:
        """The Candidates settings that are on, in declaration order: each a preference order."""
        return tuple(v for f in self._fields if f.type is Candidates and (v := getattr(self, f.name)))

    def models(self) -> tuple[str, ...]:
        """Every model name the Candidates settings hold, in declaration order, once each."""
        return tuple(dict.fromkeys(m for models in self.candidate_lists() for m in models))


class _NoSettings(Settings):
    pass


def parse_settings(params: dict[str, str], flow_settings: type[Settings] | None,
                   model: str) -> tuple[RuntimeSettings, Settings]:
    """Both kinds of settings from one model's parameters; unknown keys raise, listing the known ones."""
    flow_settings = flow_settings or _NoSettings
    known = sorted(set(RUNTIME_KEYS) | set(flow_settings.keys()))
    params = {k: v for k, v in params.items() if k not in BACKEND_KEYS and k != RELOAD_KEY}
    unknown = sorted(set(params) - set(known))
    for key in unknown:
        if key in REMOVED_KEYS:
            raise ConfigError(f"model {model}: parameter {key} is gone: {REMOVED_KEYS[key]}")
    if unknown:
        raise ConfigError(f"unknown parameter(s) {', '.join(unknown)} for model {model}; known: {', '.join(known)}")
    try:
        return _runtime_settings(params), flow_settings.parse(params)
    except ConfigError as exc:
        raise ConfigError(f"model {model}: {exc}") from None
