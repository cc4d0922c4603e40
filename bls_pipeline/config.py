"""classify_bls settings, parsed once from config.pbtxt `parameters` into frozen dataclasses.

Every key is a string parameter (Triton's `parameters` map holds strings). Unknown keys
and bad values raise `ConfigError` saying what to write instead.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from .decode import DEFAULT_FORMATS, DecodePolicy
from .preprocess import IMAGENET_MEAN, IMAGENET_STD, PreprocessSpec

__all__ = ["ClassifierInfo", "ConfigError", "PipelineConfig", "load_classifier_info", "parse_pipeline_config"]


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class PipelineConfig:
    # Main classifier, ordered preference: the first READY one answers.
    classifiers: tuple[str, ...] = ("resnet50_trt", "resnet50_onnx")
    # Cascade: the first READY of these (cheap) classifies everything first; images whose
    # top-1 probability is under cascade_threshold go to the main classifier. Empty: off.
    cascade_classifiers: tuple[str, ...] = ("efficientnet_lite0_trt", "efficientnet_lite0_onnx")
    cascade_threshold: float = 0.5
    default_topk: int = 5
    # Main path (no cascade model ready, or cascade off): images whose top-1 probability
    # is below this get a horizontal-flip second pass, averaged in. 0 disables it.
    tta_threshold: float = 0.25
    # How often (s) to look again whether a preferred classifier came back.
    route_recheck_s: float = 5.0
    # Decode/preprocess threads per model instance; 0 = cores / instances (measured best
    # on 2 cores: more threads only fight onnxruntime for the CPU).
    decode_threads: int = 0
    max_request_bytes: int = 64 * 1024 * 1024
    decode: DecodePolicy = DecodePolicy()


_DECODE_KEYS = {"max_pixels", "max_image_bytes", "allowed_formats", "draft_min_side"}


def _keys() -> list[str]:
    own = [f.name for f in dataclasses.fields(PipelineConfig) if f.name != "decode"]
    return sorted(own + sorted(_DECODE_KEYS))


def _as_int(key: str, raw: str, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"parameter {key}={raw!r}: write a whole number, e.g. {key}: \"{max(minimum, 1)}\"") from None
    if value < minimum:
        raise ConfigError(f"parameter {key}={value}: must be >= {minimum}")
    return value


def _as_float(key: str, raw: str, lo: float, hi: float) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"parameter {key}={raw!r}: write a number between {lo} and {hi}") from None
    if not lo <= value <= hi:
        raise ConfigError(f"parameter {key}={value}: must be between {lo} and {hi}")
    return value


def _as_names(key: str, raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    if not names:
        raise ConfigError(f"parameter {key} is empty: write a comma-separated list, e.g. {key}: \"resnet50_trt,resnet50_onnx\"")
    return names


def optional_names(raw: str) -> tuple[str, ...]:
    """Comma-separated model names; empty or "none" means none (the feature is off)."""
    return () if raw.strip().lower() in ("", "none") else tuple(n.strip() for n in raw.split(",") if n.strip())


def parse_pipeline_config(params: dict[str, str]) -> PipelineConfig:
    unknown = sorted(set(params) - set(_keys()))
    if unknown:
        raise ConfigError(f"unknown classify_bls parameter(s) {', '.join(unknown)}; known: {', '.join(_keys())}")
    d = PipelineConfig()
    policy = d.decode
    formats = policy.formats
    if "allowed_formats" in params:
        formats = tuple(f.upper() for f in _as_names("allowed_formats", params["allowed_formats"]))
        bad = sorted(set(formats) - set(DEFAULT_FORMATS))
        if bad:
            raise ConfigError(f"parameter allowed_formats: {', '.join(bad)} not supported; choose from {', '.join(DEFAULT_FORMATS)}")
    policy = DecodePolicy(
        max_pixels=_as_int("max_pixels", params["max_pixels"], 1) if "max_pixels" in params else policy.max_pixels,
        max_bytes=_as_int("max_image_bytes", params["max_image_bytes"], 1) if "max_image_bytes" in params else policy.max_bytes,
        formats=formats,
        draft_min_side=_as_int("draft_min_side", params["draft_min_side"], 0) if "draft_min_side" in params else policy.draft_min_side,
    )
    p = params.get
    return PipelineConfig(
        classifiers=_as_names("classifiers", p("classifiers")) if "classifiers" in params else d.classifiers,
        cascade_classifiers=optional_names(p("cascade_classifiers")) if "cascade_classifiers" in params else d.cascade_classifiers,
        cascade_threshold=_as_float("cascade_threshold", p("cascade_threshold"), 0.0, 1.0) if "cascade_threshold" in params else d.cascade_threshold,
        default_topk=_as_int("default_topk", p("default_topk"), 1) if "default_topk" in params else d.default_topk,
        tta_threshold=_as_float("tta_threshold", p("tta_threshold"), 0.0, 1.0) if "tta_threshold" in params else d.tta_threshold,
        route_recheck_s=_as_float("route_recheck_s", p("route_recheck_s"), 0.0, 3600.0) if "route_recheck_s" in params else d.route_recheck_s,
        decode_threads=_as_int("decode_threads", p("decode_threads"), 0) if "decode_threads" in params else d.decode_threads,
        max_request_bytes=_as_int("max_request_bytes", p("max_request_bytes"), 1) if "max_request_bytes" in params else d.max_request_bytes,
        decode=policy,
    )


@dataclass(frozen=True)
class ClassifierInfo:
    """What classify_bls needs to know about one classifier, from that model's own config."""

    name: str
    max_batch_size: int
    preprocess: PreprocessSpec


_PREPROCESS_KEYS = {"preprocess_resize", "preprocess_crop", "preprocess_mean", "preprocess_std"}


def _triple(key: str, raw: str) -> tuple[float, float, float]:
    try:
        values = tuple(float(v) for v in raw.split(","))
    except ValueError:
        values = ()
    if len(values) != 3:
        raise ConfigError(f"parameter {key}={raw!r}: write three comma-separated numbers (R,G,B in [0,1] units), e.g. \"0.485,0.456,0.406\"")
    return values  # type: ignore[return-value]


def classifier_info(name: str, max_batch_size: int, params: dict[str, str]) -> ClassifierInfo:
    if max_batch_size < 1:
        raise ConfigError(f"classifier {name} needs max_batch_size >= 1 in its config.pbtxt, got {max_batch_size}")
    p = {k: v for k, v in params.items() if k in _PREPROCESS_KEYS}
    try:
        spec = PreprocessSpec(
            resize=_as_int("preprocess_resize", p["preprocess_resize"], 1) if "preprocess_resize" in p else 256,
            crop=_as_int("preprocess_crop", p["preprocess_crop"], 1) if "preprocess_crop" in p else 224,
            mean=_triple("preprocess_mean", p["preprocess_mean"]) if "preprocess_mean" in p else IMAGENET_MEAN,
            std=_triple("preprocess_std", p["preprocess_std"]) if "preprocess_std" in p else IMAGENET_STD,
        )
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"classifier {name}: {exc}; fix its preprocess_resize / preprocess_crop / preprocess_std parameters") from None
    return ClassifierInfo(name=name, max_batch_size=max_batch_size, preprocess=spec)


def load_classifier_info(repo: Path, name: str) -> ClassifierInfo:
    """Read a sibling classifier's config.pbtxt (max batch and preprocessing spec)."""
    from .repository import parse_config, string_parameters

    model_dir = Path(repo) / name
    if not (model_dir / "config.pbtxt").exists():
        raise ConfigError(f"classifier {name} has no {model_dir / 'config.pbtxt'}; fix the classifiers parameter or add the model")
    cfg = parse_config(model_dir)
    return classifier_info(name, cfg.max_batch_size, string_parameters(cfg))
