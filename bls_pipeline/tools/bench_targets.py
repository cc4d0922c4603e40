"""What bls-bench measures and the repository it serves them from: its targets (the shipped
flows, their variants and baselines, a classifier engine alone or behind a flow), the model
each target's requests go to and how one is built, and the copy of the model repository
bls-bench serves (bench_repository; --max-queue-size and --set change it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from google.protobuf import text_format

from ..base.modelconfig import config_variant, parse_config
from ..contract import CLASSIFIER_INPUT, CLASSIFIER_OUTPUT, IMAGE, LABELS, REGION_COUNT, ROUTE

__all__ = ["CASCADES", "CLASSIFIER", "DEFAULT_TARGET", "HANDWRITTEN", "HANDWRITTEN_CALLS", "IN_PROCESS",
           "OPEN_LOOP_TARGETS",
           "OVERLOAD_TARGETS", "PEER", "REGION_TARGETS", "RUNNING_SERVED", "SHADOW_TARGET", "SHADOW_TWIN", "TARGETS",
           "bench_repository", "build_request", "engine_of", "fed_tensors", "parse_setting", "repository_for",
           "served_description", "served_model", "serve_with"]


CLASSIFIER = "resnet50_onnx"
TARGETS = ("classifier", "classify_bls", "ensemble_resnet50")
# Cascade variants (efficientnet_lite0 first, unsure images to resnet50) at two thresholds.
CASCADES = {"cascade@0.5": "0.5", "cascade@0.9": "0.9"}
# A classifier engine as a target: "classifier@MODEL" is MODEL fed preprocessed tensors,
# "classify_bls@MODEL" classify_bls with MODEL as its only classifier (e.g. resnet50_int8),
# "classify_peer@MODEL" the same work in one python model that runs MODEL's engine itself, no
# child call (bench_flows/classify_peer/): classify_bls's one-model peer on the same engine;
# "classify_bls_in_process@MODEL" classify_bls@MODEL running MODEL in its own process
# (run_in_process: no BLS hop).
ENGINE_TARGETS = ("classifier", "classify_bls", "classify_peer", "classify_bls_in_process")
PEER = "classify_peer"
IN_PROCESS = "classify_bls_in_process"
# Region flows: read_text, and the same work with one child request per region, served from
# bench_flows/: read_text_per_region, a flow that loops over the lines; read_text_handwritten,
# a python model on pb_utils alone that loops over its requests, then their lines, the way
# hand-written BLS examples call a second-stage model. They read samples/sign.png and
# TEXT_LINES-line pages rendered here, and report regions per second beside images.
REGION_TARGETS = ("read_text", "read_text_per_region", "read_text_handwritten")
BENCH_FLOWS = Path(__file__).resolve().parent / "bench_flows"
PER_REGION_FLOW = BENCH_FLOWS / "read_text_per_region.py"
HANDWRITTEN = "read_text_handwritten"
HANDWRITTEN_CALLS = ("text_detector", "text_orientation", "text_recognizer")  # not a flow: loaded with it by name
# classify_bls (as the bench serves it) with a 100% shadow of its classifier on a twin of it
# (resnet50_onnx's files under another name): what mirroring every call costs.
SHADOW_TARGET, SHADOW_TWIN = "classify_bls_shadow", f"{CLASSIFIER}_twin"
# classify_bls as the main job serves it, beside the bench's plain classify_bls: the
# repository's config (the cascade on efficientnet in process, resnet50 for the unsure),
# except that a resnet50 exported with random weights is not among its classifiers, as
# bls-demo does not serve one (the unsure images are then answered degraded).
DEFAULT_TARGET = "classify_bls_default"
# The overload mode's targets: classify_bls as shipped, without resnet50 (as the main job
# serves it) and with it (the cascade the README draws, its unsure images escalated), the
# seed ensemble, the one-model peer on classify_bls's default engine.
OVERLOAD_TARGETS = (DEFAULT_TARGET, "cascade@0.5", "ensemble_resnet50", "classify_peer@efficientnet_lite0_onnx")


def engine_of(target: str) -> tuple[str, str] | None:
    """("classifier" or "classify_bls", MODEL) for an engine target, else None."""
    kind, _, model = target.partition("@")
    return (kind, model) if model and kind in ENGINE_TARGETS else None


def served_model(target: str, classifier: str = CLASSIFIER) -> str:
    """The model that `target`'s requests go to in bench_repository()'s copy (the "classifier"
    target: `classifier`)."""
    if target == "classifier":
        return classifier
    engine = engine_of(target)
    if engine is not None:
        return engine[1] if engine[0] == "classifier" else f"{engine[0]}__{engine[1]}"
    if target in CASCADES:
        return "classify_bls_cascade_" + CASCADES[target].replace(".", "")
    return target


def build_request(tc, target: str, payload, classifier: str = CLASSIFIER) -> tuple[str, list, list]:
    """Model name, inputs and outputs for one request, built once and reused. The
    "classifier" target is `classifier` fed preprocessed tensors."""
    if fed_tensors(target):
        inp = tc.InferInput(CLASSIFIER_INPUT.name, list(payload.shape), "FP32")
        inp.set_data_from_numpy(payload)
        return served_model(target, classifier), [inp], [tc.InferRequestedOutput(CLASSIFIER_OUTPUT.name)]
    inp = tc.InferInput(IMAGE.name, [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[payload]], dtype=object))
    outputs = [tc.InferRequestedOutput(LABELS.name)]
    if target in CASCADES:
        outputs.append(tc.InferRequestedOutput(ROUTE.name))
    if target in REGION_TARGETS:
        outputs = [tc.InferRequestedOutput(REGION_COUNT.name)]
    return served_model(target), [inp], outputs


def fed_tensors(target: str) -> bool:
    return target == "classifier" or (engine_of(target) or ("",))[0] == "classifier"


def bench_repository(src: Path, dst: Path, keep_branches: bool, engines: tuple[str, ...] = (),
                     shadow_share: float = 1.0, peers: tuple[str, ...] = (), in_process: tuple[str, ...] = ()) -> None:
    """A copy of models/ for the bench (artifacts linked, not copied); by default the
    flip branch is off so classify_bls does the same work as the branch-less ensemble.
    Each of `engines` gets a classify_bls__ENGINE: classify_bls with that classifier alone;
    each of `peers` a classify_peer__ENGINE: the one-model peer running that classifier's engine;
    each of `in_process` a classify_bls_in_process__ENGINE: classify_bls__ENGINE running it in process."""
    artifacts = ("*.onnx", "*.onnx.data", "*.plan", "*.xml", "*.bin")
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(*artifacts, "__pycache__"))
    for artifact in [a for pattern in artifacts for a in src.glob(f"*/1/{pattern}")]:
        (dst / artifact.relative_to(src)).symlink_to(artifact.resolve())
    bls = src / "classify_bls"
    for threshold in CASCADES.values():
        name = "classify_bls_cascade_" + threshold.replace(".", "")
        if (dst / name).exists():  # the source had one of that name: the bench's own replaces it
            shutil.rmtree(dst / name)
        (dst / name).mkdir()
        (dst / name / "1").symlink_to((dst / "classify_bls" / "1").resolve())
        (dst / name / "config.pbtxt").write_text(config_variant(bls, name,
                                                                {"cascade_threshold": threshold, "tta_threshold": "0"}))
    for kind, engine in [("classify_bls", e) for e in engines] + [(IN_PROCESS, e) for e in in_process]:
        name = f"{kind}__{engine}"
        (dst / name).mkdir()
        (dst / name / "1").symlink_to((dst / "classify_bls" / "1").resolve())
        (dst / name / "config.pbtxt").write_text(config_variant(bls, name, {
            "classifiers": engine, "cascade_classifiers": "none",
            "run_in_process": engine if kind == IN_PROCESS else "none",
            **({} if keep_branches else {"tta_threshold": "0"})}))
    for engine in peers:
        name = f"{PEER}__{engine}"
        (dst / name / "1").mkdir(parents=True)
        shutil.copy(BENCH_FLOWS / PEER / "model.py", dst / name / "1" / "model.py")
        (dst / name / "config.pbtxt").write_text(config_variant(BENCH_FLOWS / PEER, name, {"engine": engine}))
    if (src / "read_text").is_dir():  # the per-region baseline: read_text's config, its own flow
        name = "read_text_per_region"
        if (dst / name).exists():
            shutil.rmtree(dst / name)
        (dst / name / "1").mkdir(parents=True)
        # read_text's flow with the per-region read_lines after it (it replaces read_text's)
        (dst / name / "1" / "flow.py").write_text((src / "read_text" / "1" / "flow.py").read_text() + "\n"
                                                  + PER_REGION_FLOW.read_text())
        shutil.copy(src / "read_text" / "1" / "model.py", dst / name / "1" / "model.py")
        (dst / name / "config.pbtxt").write_text(config_variant(src / "read_text", name, {}))
        # the hand-written baseline: a plain python model, its own config (read_text's values)
        if (dst / HANDWRITTEN).exists():
            shutil.rmtree(dst / HANDWRITTEN)
        (dst / HANDWRITTEN / "1").mkdir(parents=True)
        shutil.copy(BENCH_FLOWS / HANDWRITTEN / "model.py", dst / HANDWRITTEN / "1" / "model.py")
        shutil.copy(BENCH_FLOWS / HANDWRITTEN / "config.pbtxt", dst / HANDWRITTEN / "config.pbtxt")
    if (dst / DEFAULT_TARGET).exists():
        shutil.rmtree(dst / DEFAULT_TARGET)
    (dst / DEFAULT_TARGET).mkdir()
    (dst / DEFAULT_TARGET / "1").symlink_to((dst / "classify_bls" / "1").resolve())
    (dst / DEFAULT_TARGET / "config.pbtxt").write_text(config_variant(bls, DEFAULT_TARGET, _as_served(src, bls)))
    # resnet50 alone on FP32 onnxruntime, the ensemble's classifier (not the first engine built),
    # and without keep_branches no flip pass: the same work as the ensemble.
    plain = {"cascade_classifiers": "none", "classifiers": CLASSIFIER,
             **({} if keep_branches else {"tta_threshold": "0"})}
    (dst / "classify_bls" / "config.pbtxt").write_text(config_variant(bls, "classify_bls", plain))
    for name in (SHADOW_TWIN, SHADOW_TARGET):
        if (dst / name).exists():
            shutil.rmtree(dst / name)
        (dst / name).mkdir()
    (dst / SHADOW_TWIN / "1").symlink_to((dst / CLASSIFIER / "1").resolve())
    shutil.copy(dst / CLASSIFIER / "labels.txt", dst / SHADOW_TWIN / "labels.txt")
    (dst / SHADOW_TWIN / "config.pbtxt").write_text(config_variant(src / CLASSIFIER, SHADOW_TWIN, {}))
    (dst / SHADOW_TARGET / "1").symlink_to((dst / "classify_bls" / "1").resolve())
    (dst / SHADOW_TARGET / "config.pbtxt").write_text(
        config_variant(bls, SHADOW_TARGET,
                       {**plain, "shadow": f"{CLASSIFIER}={SHADOW_TWIN}", "shadow_share": f"{shadow_share:g}"}))


def _as_served(repo: Path, flow: Path) -> dict[str, str]:
    """classify_bls's `classifiers` as the main job serves them: without the resnet50 models
    when resnet50_onnx was exported with random weights (a test export, which bls-demo does
    not serve); a model no CPU server loads stands in when none is left."""
    from ..engines.artifact_io import exported_weights

    if exported_weights(repo / CLASSIFIER / "1" / "model.onnx") != "random":
        return {}
    from ..runtime.load.loader import flow_settings

    kept = [m for m in flow_settings(flow)[1].classifiers if not m.startswith("resnet50_")]
    return {"classifiers": ",".join(kept) or "resnet50_trt"}


def parse_setting(text: str) -> tuple[str, str, str]:
    """--set MODEL.PARAMETER=VALUE: (MODEL, PARAMETER, VALUE); MODEL may be a target (cascade@0.5)."""
    left, eq, value = text.partition("=")
    model, dot, key = left.rpartition(".")
    if not (eq and dot and model and key):
        raise ValueError(f"--set: {text!r} is not MODEL.PARAMETER=VALUE (e.g. classify_bls.latency_target_ms=0)")
    return model, key, value


def _classify_bls_family(dst: Path) -> list[str]:
    """classify_bls and every model of the copy that runs its code (its 1/ is classify_bls's)."""
    own = (dst / "classify_bls" / "1").resolve()
    return sorted(d.name for d in dst.iterdir()
                  if d.name == "classify_bls" or ((d / "1").is_symlink() and (d / "1").resolve() == own))


def _edit_config(model_dir: Path, max_queue_size: int | None = None, params: dict[str, str] | None = None) -> None:
    config = parse_config(model_dir)
    if max_queue_size is not None:
        if not config.HasField("dynamic_batching"):
            raise ValueError(f"--max-queue-size: {config.name} has no dynamic batcher, so no queue to bound")
        config.dynamic_batching.default_queue_policy.max_queue_size = max_queue_size
    for key, value in (params or {}).items():
        config.parameters[key].string_value = value
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))


def serve_with(dst: Path, max_queue_size: int | None = None, settings: list[tuple[str, str, str]] = ()) -> None:
    """--max-queue-size and --set on bench_repository()'s copy. The bound goes to classify_bls's
    dynamic batcher (default_queue_policy), every variant of it and every one-model peer (they
    batch as classify_bls does); MODEL.PARAMETER=VALUE to that model, or with MODEL classify_bls,
    to it and every variant of it. A MODEL not in the copy is a ValueError."""
    family = _classify_bls_family(dst)
    if max_queue_size is not None:
        for name in family + sorted(d.name for d in dst.iterdir() if d.name.startswith(f"{PEER}__")):
            _edit_config(dst / name, max_queue_size=max_queue_size)
    for model, key, value in settings:
        name = served_model(model)
        if not (dst / name / "config.pbtxt").is_file():
            raise ValueError(f"--set {model}.{key}={value}: the repository bls-bench serves has no model {name}")
        for each in family if name == "classify_bls" else [name]:
            _edit_config(dst / each, params={key: value})


def queue_bound(model_dir: Path) -> str:
    """The queue bound a model's config gives Triton's dynamic batcher, in words."""
    config = parse_config(model_dir)
    if not config.HasField("dynamic_batching"):
        return "no dynamic batcher"
    size = config.dynamic_batching.default_queue_policy.max_queue_size
    return f"max_queue_size {size}" if size else "max_queue_size 0 (unbounded)"


def served_description(dst: Path, targets: list[str], max_queue_size: int | None,
                       settings: list[tuple[str, str, str]]) -> str:
    """Which queue bound (and --set parameters) each target's model was served with."""
    bounds = [f"{t} with {queue_bound(dst / served_model(t))}" for t in targets
              if (dst / served_model(t) / "config.pbtxt").is_file()]
    text = "bls-bench's own server: " + ", ".join(bounds)
    text += " (--max-queue-size)" if max_queue_size is not None else " (as the repository configures it)"
    if settings:
        text += "; " + ", ".join(f"{m}.{k}={v}" for m, k, v in settings) + " (--set)"
    return text


RUNNING_SERVED = "a running server, with its own config (its queue bounds are not read here)"
OPEN_LOOP_TARGETS = (DEFAULT_TARGET,)


def repository_for(targets: list[str], src: Path, dst: Path, keep_branches: bool = False,
                   shadow_share: float = 1.0) -> None:
    """bench_repository(src, dst) with the variants `targets` need, as bls-bench makes it."""
    engines = tuple(sorted({e[1] for t in targets if (e := engine_of(t))}))
    peers = tuple(sorted({e[1] for t in targets if (e := engine_of(t)) and e[0] == PEER}))
    in_process = tuple(sorted({e[1] for t in targets if (e := engine_of(t)) and e[0] == IN_PROCESS}))
    bench_repository(src, dst, keep_branches, engines, shadow_share, peers, in_process)
