"""Accuracy of a classifier and each of its CPU engines on labelled photos, as served.

    python -m engine_build accuracy --model efficientnet_lite0 --images DIR [--engine PATH ...]

DIR/labels.csv names each photo (`file`) and its class (`class_id`, the row of the model's
labels.txt); other columns are ignored. Every photo is decoded and preprocessed the way the
served model's config.pbtxt says (the flow runtime's own decode_to_batch), then run through
FP32 (models/<model>_onnx) and every engine of the model that is built (models/<model>_int8,
models/<model>_openvino, and any other ONNX or IR given with --engine), each with the
settings its served config gives (threads, precision, arena). Batch by batch, every engine
runs the same batch in turn, so their times are taken side by side.

Per engine: top-1 and top-5 accuracy against the labels, top-1 agreement with FP32, and
engine top-1 / FP32 top-1. `GATE` is the rule an engine must pass to be a default
(MLPerf's: at least 99% of FP32's top-1 and 98% top-1 agreement).
"""

from __future__ import annotations

import csv
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from tqdm import tqdm

from bls_pipeline.contract import CLASSIFIER_INPUT, CLASSIFIER_OUTPUT
from bls_pipeline.engines.artifact_io import stamp_path
from bls_pipeline.runtime.load.children import load_child
from bls_pipeline.base.modelconfig import parse_config, string_parameters
from bls_pipeline.stages.batching import decode_to_batch
from bls_pipeline.stages.decode import DecodePolicy

__all__ = ["GATE", "Engine", "EngineAccuracy", "Gate", "LabelsError", "engines_of", "exact_runner", "measure",
           "read_labels", "served_runner", "table"]

LABELS_FILE = "labels.csv"


@dataclass(frozen=True)
class Gate:
    """An engine may be a default only with top-1 >= min_ratio x FP32's and top-1 agreement
    with FP32 >= min_agreement, on labelled photos (MLPerf's closed-division rule for
    quantized image classifiers: 99% of FP32's accuracy; the agreement keeps it honest where
    errors swap places)."""

    min_ratio: float = 0.99
    min_agreement: float = 0.98

    def passes(self, result: "EngineAccuracy") -> bool:
        return result.ratio >= self.min_ratio and result.agreement >= self.min_agreement

    def why_not(self, result: "EngineAccuracy") -> str | None:
        """None when `result` passes, else which bound it misses, in words."""
        misses = []
        if result.ratio < self.min_ratio:
            misses.append(f"top-1 {result.top1:.1%} is {result.ratio:.3f} of FP32's (needs {self.min_ratio})")
        if result.agreement < self.min_agreement:
            misses.append(f"top-1 agreement with FP32 {result.agreement:.1%} (needs {self.min_agreement:.0%})")
        return "; ".join(misses) or None


GATE = Gate()


class LabelsError(ValueError):
    """The labelled folder cannot be read: no labels.csv, columns missing, photos missing."""


@dataclass(frozen=True)
class Engine:
    name: str  # "fp32", "int8", "openvino" or the path given
    path: Path
    settings_from: str  # the served model whose config.pbtxt gives its settings
    built_as: str = ""  # what its build stamp says (method, precision, calibration)
    exact: bool = False  # an INT8 ONNX's own QDQ arithmetic, computed exactly (not its integer kernels)


@dataclass(frozen=True)
class EngineAccuracy:
    engine: str
    built_as: str
    images: int
    top1: float
    top5: float
    agreement: float  # share of photos with FP32's top-1 class
    ratio: float  # top1 / FP32's top1
    ms_per_image: float  # inference only, side by side with the others (same batches, in turn)
    passes: bool


def read_labels(folder: Path) -> list[tuple[Path, int]]:
    """(photo, class id) for every row of folder/labels.csv (columns `file` and `class_id`)."""
    folder = Path(folder)
    path = folder / LABELS_FILE
    if not path.is_file():
        raise LabelsError(f"{path} is missing: a labelled folder has a labels.csv with columns file,class_id "
                          "(class_id: the row of the model's labels.txt, from 0)")
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"file", "class_id"} - set(reader.fieldnames or ())
        if missing:
            raise LabelsError(f"{path} has columns {reader.fieldnames}; it needs {', '.join(sorted(missing))} "
                              "(file: the photo's name in the folder, class_id: its class, from 0)")
        rows = []
        for n, row in enumerate(reader, start=2):
            try:
                rows.append((folder / row["file"], int(row["class_id"])))
            except (TypeError, ValueError):
                raise LabelsError(f"{path} line {n}: class_id {row['class_id']!r} is not a whole number") from None
    absent = [p.name for p, _ in rows if not p.is_file()]
    if absent:
        raise LabelsError(f"{path} names {len(absent)} photos that are not in {folder}: {', '.join(absent[:5])}"
                          + (" ..." if len(absent) > 5 else ""))
    if not rows:
        raise LabelsError(f"{path} lists no photo")
    return rows


def _stamp(path: Path) -> str:
    stamp = stamp_path(path)
    if not stamp.is_file():
        return ""
    facts = json.loads(stamp.read_text())
    return ", ".join(f"{k} {v}" for k, v in facts.items() if k != "weights")


def engines_of(repo: Path, model: str, extra: Sequence[Path] = (), exact: bool = False) -> list[Engine]:
    """FP32 first, then every engine of `model` (a key of export_onnx.EXPORTS) that is built
    in `repo`, then `extra` files (an .onnx runs with <model>_int8's settings, an .xml with
    <model>_openvino's). With `exact`, each INT8 ONNX also as its exact QDQ arithmetic
    (exact_runner): what a CPU whose integer kernels do not saturate computes."""
    from .export_onnx import EXPORTS

    target = EXPORTS[model]
    found = [Engine("fp32", repo / target.onnx_model / "1" / "model.onnx", target.onnx_model)]
    for name, served in (("int8", target.int8_model), ("openvino", target.openvino_model)):
        path = repo / served / "1" / string_parameters(parse_config(repo / served))["artifact"]
        if path.is_file():
            found.append(Engine(name, path, served, _stamp(path)))
    for path in map(Path, extra):
        if not path.is_file():
            raise FileNotFoundError(f"--engine {path}: no such file")
        served = target.openvino_model if path.suffix == ".xml" else target.int8_model
        found.append(Engine(str(path), path, served, _stamp(path)))
    if exact:
        found += [Engine(f"{e.name} (exact QDQ arithmetic)", e.path, e.settings_from, e.built_as, exact=True)
                  for e in found[1:] if e.path.suffix == ".onnx"]
    return found


def exact_runner(path: Path) -> Callable[[np.ndarray], np.ndarray]:
    """`run(batch) -> logits` for an INT8 (QDQ) ONNX with onnxruntime's graph optimisations
    off: every QuantizeLinear/DequantizeLinear pair runs as written, in float, so the result
    is the quantized model's own arithmetic without the integer kernels' shortcuts (on a CPU
    without VNNI, AVX2 sums pairs of u8 x s8 products into a saturating int16). Slow: a check,
    never served."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(os.path.realpath(path), sess_options=opts, providers=["CPUExecutionProvider"])
    return lambda x: session.run([CLASSIFIER_OUTPUT.name], {CLASSIFIER_INPUT.name: x})[0]


def served_runner(repo: Path, served: str, path: Path) -> Callable[[np.ndarray], np.ndarray]:
    """`run(batch) -> logits` for `path`, with the settings the served model `served` gives
    it (its config.pbtxt's parameters, read as its adapter reads them)."""
    from bls_pipeline.engines.onnx import open_engine

    params = string_parameters(parse_config(Path(repo) / served))
    model = open_engine(path, [CLASSIFIER_INPUT.name], [CLASSIFIER_OUTPUT.name], params)
    return lambda x: model.run({CLASSIFIER_INPUT.name: x})[CLASSIFIER_OUTPUT.name]


def measure(repo: Path, model: str, folder: Path, extra: Sequence[Path] = (), batch: int = 1, exact: bool = False,
            gate: Gate = GATE) -> list[EngineAccuracy]:
    """Every engine of `model` (engines_of) on the labelled photos of `folder`, FP32 first."""
    from .export_onnx import EXPORTS

    repo = Path(repo)
    labelled = read_labels(folder)
    spec = load_child(repo, EXPORTS[model].onnx_model).preprocess
    engines = engines_of(repo, model, extra, exact)
    if not engines[0].path.is_file():
        raise FileNotFoundError(f"{engines[0].path} is missing: run `python -m engine_build export --model {model}` "
                                "first")
    runners = [exact_runner(e.path) if e.exact else served_runner(repo, e.settings_from, e.path) for e in engines]
    classes = np.array([c for _, c in labelled])
    top5 = np.empty((len(engines), len(labelled), 5), np.int64)
    seconds = np.zeros(len(engines))
    policy = DecodePolicy()  # the flows' default (their decode_* settings are not changed in the shipped configs)
    for start in tqdm(range(0, len(labelled), batch), desc=f"accuracy of {len(engines)} {model} engines", unit="batch"):
        rows = labelled[start:start + batch]
        decoded = decode_to_batch([[p.read_bytes()] for p, _ in rows], policy, spec, None)
        if decoded.errors:
            bad = ", ".join(f"{rows[r][0].name}: {e}" for r, e in decoded.errors.items())
            raise LabelsError(f"cannot decode {bad}")
        for i, run in enumerate(runners):
            t0 = time.perf_counter()
            logits = np.asarray(run(decoded.batch))
            seconds[i] += time.perf_counter() - t0
            top5[i, start:start + len(rows)] = np.argsort(-logits, axis=1, kind="stable")[:, :5]
    fp32_top1 = float(np.mean(top5[0, :, 0] == classes))
    results = []
    for i, engine in enumerate(engines):
        top1 = float(np.mean(top5[i, :, 0] == classes))
        result = EngineAccuracy(engine.name, engine.built_as, len(labelled), top1,
                                float(np.mean((top5[i] == classes[:, None]).any(axis=1))),
                                float(np.mean(top5[i, :, 0] == top5[0, :, 0])), top1 / fp32_top1 if fp32_top1 else 0.0,
                                seconds[i] / len(labelled) * 1e3, False)
        results.append(EngineAccuracy(**{**asdict(result), "passes": gate.passes(result)}))
    return results


def table(results: Sequence[EngineAccuracy], gate: Gate = GATE) -> str:
    """The results as a Markdown table, FP32 first, with the gate's verdict per engine."""
    fp32 = results[0]
    lines = ["| engine | built as | top-1 | top-5 | top-1 agreement with FP32 | top-1 / FP32's | ms/image | default? |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in results:
        verdict = "(reference)" if r is fp32 else ("passes" if r.passes else f"no: {gate.why_not(r)}")
        lines.append(f"| {r.engine} | {r.built_as or '-'} | {r.top1:.1%} | {r.top5:.1%} | {r.agreement:.1%} | "
                     f"{r.ratio:.3f} | {r.ms_per_image:.2f} | {verdict} |")
    return "\n".join(lines) + "\n"
