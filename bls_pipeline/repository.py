"""Read a Triton model repository: parsed configs and which models can load here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from .config import optional_names

__all__ = ["LoadPlan", "called_models", "config_variant", "parse_config", "plan_loading", "string_parameters"]

# classify_bls parameters that name the models it calls (bls_pipeline.config).
CALLEE_PARAMETERS = ("classifiers", "cascade_classifiers")

# Parameter a python model sets to name the file its version folder must hold
# (e.g. model.onnx for resnet50_onnx); without it the model is not loaded.
ARTIFACT_PARAMETER = "artifact"


def parse_config(model_dir: Path) -> model_config_pb2.ModelConfig:
    path = Path(model_dir) / "config.pbtxt"
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def config_variant(model_dir: Path, name: str, params: dict[str, str]) -> str:
    """model_dir's config.pbtxt renamed to `name`, with these string parameters set or added
    (how the tests and bls-bench make variants of classify_bls: same code, other settings)."""
    config = parse_config(model_dir)
    config.name = name
    for key, value in params.items():
        config.parameters[key].string_value = value
    return text_format.MessageToString(config)


def string_parameters(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def _family(model_name: str) -> str:
    """engine_build's --model for a served model name (resnet50_onnx -> resnet50)."""
    return model_name.rsplit("_", 1)[0] if model_name.endswith(("_onnx", "_trt")) else model_name


def _version_dir(model_dir: Path) -> Path:
    return model_dir / "1"


def _missing_part(model_dir: Path, config: model_config_pb2.ModelConfig, backends: set[str]) -> str | None:
    """Why this model cannot load with these backends, or None if it can (ensembles aside)."""
    if config.platform == "ensemble":
        return None
    if config.platform == "tensorrt_plan" or config.backend == "tensorrt":
        if "tensorrt" not in backends:
            return "this tritonserver has no TensorRT backend"
        plan = _version_dir(model_dir) / (config.default_model_filename or "model.plan")
        if not plan.exists():
            return f"{plan.relative_to(model_dir.parent)} is missing: build it with `python -m engine_build trt --model {_family(model_dir.name)}`"
        return None
    backend = config.backend or config.platform
    if backend not in backends:
        return f"this tritonserver has no {backend} backend"
    artifact = string_parameters(config).get(ARTIFACT_PARAMETER)
    if artifact and not (_version_dir(model_dir) / artifact).exists():
        return f"{model_dir.name}/1/{artifact} is missing: export it with `python -m engine_build export --model {_family(model_dir.name)}`"
    return None


@dataclass(frozen=True)
class LoadPlan:
    load: tuple[str, ...]
    skipped: dict[str, str]


def plan_loading(repo: Path, backends: set[str], only: tuple[str, ...] | None = None) -> LoadPlan:
    configs = {d.name: parse_config(d) for d in sorted(Path(repo).iterdir()) if (d / "config.pbtxt").exists()}
    if only is not None:
        unknown = sorted(set(only) - set(configs))
        if unknown:
            raise ValueError(f"no such model in {repo}: {', '.join(unknown)}")
    skipped: dict[str, str] = {}
    for name, cfg in configs.items():
        if only is not None and name not in only:
            continue
        why = _missing_part(Path(repo) / name, cfg, backends)
        if why:
            skipped[name] = why
    # An ensemble loads only if every step it calls can.
    for name, cfg in configs.items():
        if cfg.platform == "ensemble" and name not in skipped and (only is None or name in only):
            steps = [s.model_name for s in cfg.ensemble_scheduling.step]
            missing = [s for s in steps if s not in configs or s in skipped]
            if missing:
                skipped[name] = f"its steps cannot load: {', '.join(missing)}"
    wanted = [n for n in configs if only is None or n in only]
    return LoadPlan(load=tuple(n for n in wanted if n not in skipped), skipped=skipped)


def called_models(configs: dict[str, model_config_pb2.ModelConfig]) -> set[str]:
    """Models that another model calls: ensemble steps and classify_bls's classifiers."""
    called: set[str] = set()
    for cfg in configs.values():
        called.update(step.model_name for step in cfg.ensemble_scheduling.step)
        params = string_parameters(cfg)
        for key in CALLEE_PARAMETERS:
            called.update(optional_names(params.get(key, "")))
    return called
