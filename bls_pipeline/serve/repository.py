"""Read a Triton model repository: which model calls which, what can load here, in what
order to drain.

A model calls others when it is an ensemble (its steps) or a flow model (the models its
flow.py declares, with its config.pbtxt's settings applied). Loading a model loads what
it calls; draining unloads callers before the models they call. A folder whose config.pbtxt
cannot be read is broken: kept apart with the reason (the file named), the others read as
usual.
"""

from __future__ import annotations

import logging
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..runtime.load.loader import declared_calls, declared_models, is_flow_model
from ..base.modelconfig import ConfigFileError, ModelConfig, parse_config, string_parameters

__all__ = ["LoadPlan", "Repository", "artifact_problem", "config_problems", "drain_stages", "export_hint",
           "plan_loading", "standby_models"]

log = logging.getLogger(__name__)

# Parameter a python model sets to name the file its version folder must hold
# (e.g. model.onnx for resnet50_onnx); without it the model is not loaded.
ARTIFACT_PARAMETER = "artifact"
# Parameter that marks a model as a baseline for bls-bench (the static ensemble and its
# steps): bls-serve leaves it out unless asked for it by name.
BASELINE_PARAMETER = "bench_baseline"


@dataclass(frozen=True)
class Repository:
    root: Path
    configs: dict[str, ModelConfig]
    callees: dict[str, tuple[str, ...]]  # model -> the models it calls
    # model -> why its config.pbtxt cannot be read ("<file>:3:20: <reason>"): not in configs
    broken: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, root: Path) -> "Repository":
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"no model repository at {root}")
        configs, broken = {}, {}
        for d in sorted(root.iterdir()):
            if (d / "config.pbtxt").is_file():
                try:
                    configs[d.name] = parse_config(d)
                except ConfigFileError as exc:
                    broken[d.name] = str(exc)
        return cls(root, configs, {name: _callees(root / name, cfg) for name, cfg in configs.items()}, broken)

    def baselines(self, asked: tuple[str, ...] | None = None) -> dict[str, str]:
        """The models marked as benchmark baselines (bench_baseline "1") that `asked` (model
        names, and what they call) does not need: bls-serve leaves them out, with the reason."""
        needed = set(self.closure(asked)) if asked else set()
        return {n: "a baseline for bls-bench: --with-baselines (or --models) loads it"
                for n, cfg in self.configs.items()
                if string_parameters(cfg).get(BASELINE_PARAMETER) == "1" and n not in needed}

    @property
    def names(self) -> tuple[str, ...]:
        """Every model folder with a config.pbtxt, broken ones too, in repository order."""
        return tuple(sorted({*self.configs, *self.broken}))

    def closure(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """`names` and everything they call, directly or not (in repository order; a broken
        folder is there, what it would call is not known)."""
        seen: set[str] = set()
        todo = list(names)
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(c for c in self.callees.get(name, ()) if c in self.configs or c in self.broken)
        return tuple(n for n in self.names if n in seen)


def config_problems(root: Path, models: tuple[str, ...]) -> dict[str, str]:
    """{model: why its config.pbtxt cannot be read} for those of `models` whose folder in
    `root` has one that does not read now (read again at each call: a fixed file drops out)."""
    problems = {}
    for name in models:
        try:
            parse_config(Path(root) / name)
        except ConfigFileError as exc:
            problems[name] = str(exc)
    return problems


def _callees(model_dir: Path, config: ModelConfig) -> tuple[str, ...]:
    if config.platform == "ensemble":
        return tuple(step.model_name for step in config.ensemble_scheduling.step)
    if is_flow_model(model_dir):
        try:
            return declared_models(model_dir)
        except Exception as exc:  # noqa: BLE001 - tritonserver will report it at load, with the same cause
            log.warning("cannot read the models %s's flow declares (%s: %s): loading it alone", model_dir.name,
                        type(exc).__name__, exc)
    return ()


# The CPU engines engine_build writes from a model's ONNX export: suffix -> command ({} the family).
CPU_ENGINES = {"_int8": "int8 --model {} --method onnxruntime",
               "_openvino": "int8 --model {} (NNCF's INT8; or `openvino --model {}`, FP32)"}


def export_hint(model: str, weights: str | None = None) -> str:
    """The command that builds `model`'s artifact, for this Python (copy it as it is);
    `weights` picks them (e.g. "random" for a benchmark), else the export's default."""
    family = model.rsplit("_", 1)[0] if model.endswith(("_onnx", "_trt", *CPU_ENGINES)) else model
    python = shlex.quote(sys.executable)
    if model.endswith("_trt"):
        return f"{python} -m engine_build trt --model {family} --fp16 (needs TensorRT and a GPU)"
    for suffix, command in CPU_ENGINES.items():
        if model.endswith(suffix):
            onnx = export_hint(f"{family}_onnx", weights)
            return f"{python} -m engine_build {command.format(family, family)}, after the ONNX export: {onnx}"
    try:
        from engine_build.export_onnx import EXPORTS
        from engine_build.ocr import OCR_MODELS
    except ImportError:  # an installed package without engine_build
        return f"{python} -m engine_build export --help"
    if model in {m.folder for m in OCR_MODELS}:  # downloaded weights, one command for the three
        return f"{python} -m engine_build ocr"
    target = EXPORTS.get(family)
    if target is None:
        return f"export it to {model}/1 (engine_build knows only {', '.join(EXPORTS)})"
    if weights:
        choice = f" --weights {weights}"
    else:
        choice = "" if target.default_weights else " --weights imagenet   (or a .pth file; 'random' for tests)"
    return f"{python} -m engine_build export --model {family}{choice}"


def _missing_part(model_dir: Path, config: ModelConfig, backends: set[str]) -> str | None:
    """Why this model cannot load with these backends, or None if it can (ensembles aside)."""
    version = model_dir / "1"
    if config.platform == "ensemble":
        return None
    if config.platform == "tensorrt_plan" or config.backend == "tensorrt":
        if "tensorrt" not in backends:
            return "this tritonserver has no TensorRT backend"
        plan = version / (config.default_model_filename or "model.plan")
        if not plan.exists():
            return f"{model_dir.name}/1/{plan.name} is missing: build it with {export_hint(model_dir.name)}"
        return None
    # A backend this server lacks is the first reason: no GPU would not make it load either.
    backend = config.backend or config.platform
    if backend not in backends:
        return f"this tritonserver has no {backend} backend"
    # A KIND_GPU instance on a machine with no GPU (or with every GPU hidden): Triton would
    # fail the load. The same test as the launcher's pinned-memory choice, plus CUDA_VISIBLE_DEVICES.
    import os

    if any(group.kind == group.KIND_GPU for group in config.instance_group):
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1")
        if hidden or not (Path("/dev/nvidiactl").exists() or any(Path("/dev").glob("nvidia[0-9]*"))):
            why = "CUDA_VISIBLE_DEVICES hides every GPU" if hidden else "this machine has no GPU"
            return f"its instance_group is KIND_GPU and {why}"
    artifact = string_parameters(config).get(ARTIFACT_PARAMETER)
    if artifact and not (version / artifact).exists():
        if model_dir.name.endswith("_torch"):  # its state dict comes from engine_build's torch command
            family = model_dir.name[: -len("_torch")]
            hint = (f"{shlex.quote(sys.executable)} -m engine_build torch --model {family} --weights imagenet   "
                    "(or a .pth file; 'random' for tests)")
        else:
            hint = export_hint(model_dir.name)
        return f"{model_dir.name}/1/{artifact} is missing: export it with {hint}"
    if artifact and model_dir.name.endswith(tuple(CPU_ENGINES)):  # an engine built here, checked before Triton loads it
        problem = artifact_problem(version / artifact)
        if problem:
            return (f"{model_dir.name}/1/{artifact} is unusable ({problem}): rebuild it with "
                    f"{export_hint(model_dir.name)}")
    return None


def artifact_problem(path: Path) -> str | None:
    """Why an ONNX file or an OpenVINO IR cannot be a whole model, from its structure alone
    (cheap: no runtime is loaded), or None. Catches empty, truncated and foreign files, an
    IR without its weights, not every corruption: the server's load is the final check."""
    path = Path(path)
    if path.suffix == ".onnx":
        return _onnx_problem(path)
    if path.suffix == ".xml":
        return _ir_problem(path)
    return None


def _varint(f) -> int | None:
    shift = value = 0
    while True:
        byte = f.read(1)
        if not byte:
            return None
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
        if shift > 63:
            return None


def _onnx_problem(path: Path) -> str | None:
    """Walk the top-level fields of the ModelProto: every length must end inside the file,
    the last exactly at its end, and the graph (field 7) must be there."""
    size = path.stat().st_size
    if size == 0:
        return "the file is empty"
    fields = set()
    with open(path, "rb") as f:
        while f.tell() < size:
            tag = _varint(f)
            if tag is None or tag >> 3 == 0:
                return "not an ONNX model: bad protobuf field"
            wire = tag & 7
            if wire == 0:
                if _varint(f) is None:
                    return "truncated"
            elif wire == 2:
                length = _varint(f)
                if length is None or f.tell() + length > size:
                    return "truncated: a field runs past the end of the file"
                f.seek(length, 1)
            elif wire in (1, 5):
                f.seek(8 if wire == 1 else 4, 1)
            else:
                return "not an ONNX model: bad protobuf wire type"
            fields.add(tag >> 3)
        if f.tell() != size:
            return "truncated"
    return None if 7 in fields else "not an ONNX model: no graph"


def _ir_problem(path: Path) -> str | None:
    """The IR's XML parses as a <net>, and every weight it points at lies inside its .bin."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        return f"not an OpenVINO IR: {exc}"
    if root.tag != "net":
        return f"not an OpenVINO IR: the root element is <{root.tag}>, not <net>"
    weights = path.with_suffix(".bin")
    if not weights.exists():
        return f"{weights.name} (its weights) is missing"
    end = max((int(d.get("offset", 0)) + int(d.get("size", 0)) for d in root.iter("data")
               if d.get("offset") is not None),
              default=0)
    if end > weights.stat().st_size:
        return f"{weights.name} is shorter ({weights.stat().st_size} bytes) than the IR needs ({end})"
    return None


@dataclass(frozen=True)
class LoadPlan:
    load: tuple[str, ...]
    skipped: dict[str, str] = field(default_factory=dict)
    standby: dict[str, str] = field(default_factory=dict)  # standby_models(): model -> why it is on standby
    # Wanted models whose config.pbtxt cannot be read (Repository.broken): not loaded, a failed load to report
    broken: dict[str, str] = field(default_factory=dict)


def plan_loading(repo: Path | Repository, backends: set[str], only: tuple[str, ...] | None = None,
                 exclude: dict[str, str] | None = None) -> LoadPlan:
    """What to load: `only` (default: every model) with what they call, less what cannot
    load here (each with the reason) and `exclude` ({model: reason})."""
    repo = repo if isinstance(repo, Repository) else Repository.read(repo)
    if only is not None:
        unknown = sorted(set(only) - set(repo.names))
        if unknown:
            raise ValueError(f"no such model in {repo.root}: {', '.join(unknown)} (models there: "
                             f"{', '.join(repo.names)})")
    asked = repo.names if only is None else only
    closure = repo.closure(asked)
    skipped = dict(exclude or {})
    # A broken folder: a failed load to report (unless excluded), never one to plan.
    broken = {n: repo.broken[n] for n in closure if n in repo.broken and n not in skipped}
    wanted = tuple(n for n in closure if n not in repo.broken)
    for name in wanted:
        why = _missing_part(repo.root / name, repo.configs[name], backends)
        if why and name not in skipped:
            skipped[name] = why
    # An ensemble loads only if every step it calls can.
    for name in wanted:
        if repo.configs[name].platform == "ensemble" and name not in skipped:
            missing = [s for s in repo.callees[name] if s not in repo.configs or s in skipped]
            if missing:
                skipped[name] = f"its steps cannot load: {', '.join(missing)}"
    # A model that only ensembles call, none of which loads, has nothing to serve (unless asked for by name).
    for name in wanted:
        callers = [c for c in wanted if name in repo.callees[c]]
        helper_only = callers and all(repo.configs[c].platform == "ensemble" for c in callers)
        if (helper_only and name not in skipped and (only is None or name not in only)
                and all(c in skipped for c in callers)):
            skipped[name] = (f"only {', '.join(callers)} use{'s' if len(callers) == 1 else ''} it, and "
                             f"{'it' if len(callers) == 1 else 'they'} cannot load")
    load = tuple(n for n in wanted if n not in skipped)
    return LoadPlan(load=load, skipped={n: skipped[n] for n in closure if n in skipped},
                    standby=standby_models(repo, load), broken=broken)


def drain_stages(repo: Path | Repository, loaded: tuple[str, ...]) -> list[tuple[str, ...]]:
    """`loaded` in unload order: each stage holds the models no model of a later stage calls
    (callers first, so their in-flight requests finish while what they call still serves)."""
    repo = repo if isinstance(repo, Repository) else Repository.read(repo)
    left = list(loaded)
    stages = []
    while left:
        called = {c for m in left for c in repo.callees.get(m, ()) if c != m}
        stage = tuple(m for m in left if m not in called) or tuple(left)  # a cycle: the rest together
        stages.append(stage)
        left = [m for m in left if m not in stage]
    return stages


def standby_models(repo: Path | Repository, loaded: tuple[str, ...]) -> dict[str, str]:
    """{model: why it is on standby} for the loaded models no request reaches while the
    loaded candidates before them are READY: a later candidate behind a loaded one ("a
    fallback behind M": a flow calls it only once M is gone), or a model every loaded caller
    runs in its own process ("run in process by F": its callers open its engine themselves).
    A model first among the loaded candidates of a list that a flow sends to Triton, an
    ensemble's step, or one no loaded model calls (a client asked for it by name) answers,
    so it is not on standby."""
    repo = repo if isinstance(repo, Repository) else Repository.read(repo)
    why: dict[str, str] = {}
    answering: set[str] = set()
    for caller in loaded:
        if repo.configs[caller].platform == "ensemble":
            answering.update(repo.callees[caller])
        elif repo.callees[caller]:  # a flow (its callees read without error)
            config = repo.configs[caller]  # a KIND_GPU flow sends every call through Triton
            gpu = any(group.kind == group.KIND_GPU for group in config.instance_group)
            preferences, in_process = declared_calls(repo.root / caller)
            in_process = () if gpu else in_process
            for models in preferences:
                present = [m for m in models if m in loaded]
                if present and present[0] in in_process:
                    why.setdefault(present[0], f"run in process by {caller}")
                else:
                    answering.update(present[:1])
                for m in present[1:]:
                    why.setdefault(m, f"a fallback behind {present[0]}")
    return {m: reason for m, reason in why.items() if m not in answering}
