"""Which CPU engine the main job builds and serves by default, and why.

The rule (accuracy.GATE, MLPerf's): an engine may be a default only if, on labelled photos,
its top-1 is at least 99% of FP32's and its top-1 agreement with FP32 at least 98%. No
labelled photos ship with the project, so the main job cannot judge that where it runs.
It relies on two things instead:

1. `RECIPE`, judged once on labelled photos (`VALIDATED`, the numbers of `python -m
   engine_build accuracy --exact`): onnxruntime's static INT8 calibrated on samples/. The
   judgement is of the INT8 model's own arithmetic (its QuantizeLinear/DequantizeLinear
   steps computed exactly), which is what a CPU serves when its INT8 kernels sum their
   products exactly (VNNI, AMX).
2. A check, on this CPU, that its INT8 kernels compute that arithmetic: on the calibration
   images, the mean squared distance of the served engine's logits from the exact
   arithmetic's must stay under `MAX_KERNEL_ERROR` times the quantization's own distance
   from FP32. On AVX2 without VNNI, onnxruntime sums pairs of u8 x s8 products into a
   saturating int16, and the engine drifts (efficientnet_lite0: 4.5x; 81% top-1 on the
   labelled photos against FP32's 88%: docs/performance.md).

Where both hold, the main job keeps the engine (models/<model>_int8) and classify_bls uses
it (its candidate lists put *_int8 before *_onnx); else FP32 stays, the engine file is
removed, and the reason is recorded beside it so the main job says why once per run
without building it again (delete the record to try again). Top-1 agreement with FP32 on
the distorted sample variants (agreement.py) is printed as an extra figure, not judged.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from bls_pipeline.engines.artifact_io import exported_weights, stamp_path

from .export_onnx import EXPORTS

__all__ = ["MAX_KERNEL_ERROR", "RECIPE", "VALIDATED", "KernelCheck", "Validated", "choose_engine", "cpu_identity",
           "kernel_check"]

RECIPE = ("onnxruntime static INT8 (QDQ, per-channel s8 weights, u8 activations, MinMax) calibrated on samples/ and "
          "mirrors")
METHOD = "onnxruntime"  # build_cpu.METHODS: the recipe's method
MAX_KERNEL_ERROR = 0.25


@dataclass(frozen=True)
class Validated:
    """The recipe on labelled photos: `python -m engine_build accuracy --exact`'s numbers."""

    photos: str
    fp32_top1: float
    top1: float  # the INT8 model's exact arithmetic
    agreement: float
    measured: str  # when, versions, command

    @property
    def ratio(self) -> float:
        return self.top1 / self.fp32_top1


VALIDATED: dict[str, Validated] = {
    "efficientnet_lite0": Validated(
        "500 labelled ImageNet photos (one per even class; ../shared/imagenet)", fp32_top1=0.876, top1=0.874,
        agreement=0.980,
        measured="2026-11-25, onnxruntime 1.32.0: python -m engine_build accuracy --model efficientnet_lite0 --images "
                 "../shared/imagenet --exact (docs/performance.md)"),
}


@dataclass(frozen=True)
class KernelCheck:
    kernel_mse: float  # served INT8 engine vs its exact arithmetic, mean squared logit difference
    quantization_mse: float  # the exact arithmetic vs FP32
    images: int

    @property
    def ratio(self) -> float:
        return self.kernel_mse / max(self.quantization_mse, 1e-12)

    @property
    def passes(self) -> bool:
        return self.ratio <= MAX_KERNEL_ERROR


def kernel_check(fp32: Callable, served: Callable, exact: Callable, tensors: np.ndarray, batch: int = 6) -> KernelCheck:
    """How far the served engine is from its own exact arithmetic, against how far that is from FP32."""
    kernel, quantization = [], []
    for start in range(0, len(tensors), batch):
        x = tensors[start:start + batch]
        reference, want = np.asarray(fp32(x)), np.asarray(exact(x))
        kernel.append(np.mean((np.asarray(served(x)) - want) ** 2))
        quantization.append(np.mean((want - reference) ** 2))
    return KernelCheck(float(np.mean(kernel)), float(np.mean(quantization)), len(tensors))


def cpu_identity() -> str:
    """The CPU model and whether it has exact INT8 dot products (VNNI, AMX), from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "unknown CPU")
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), ()))
    exact = sorted(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})
    return f"{name} ({', '.join(exact) if exact else 'no VNNI/AMX'})"


def _record(engine: Path) -> Path:
    return engine.with_name(engine.stem + ".unavailable.json")


def choose_engine(repo: Path, model: str, samples: Path, say=print) -> str:
    """The model (Triton name) that serves `model`'s role on the CPU after the main job: the
    recipe's INT8 engine where it may be a default here, else FP32. Builds and checks the
    engine when neither it nor a record of its rejection exists; an engine someone built on
    purpose (any *_openvino, or an *_int8 this did not build) is left as it is and named."""
    from bls_pipeline.runtime.load.children import load_child

    from .accuracy import exact_runner, served_runner
    from .agreement import agreement, image_variants
    from .build_cpu import calibration_tensors, quantize

    repo = Path(repo)
    target = EXPORTS[model]
    fp32_path = repo / target.onnx_model / "1" / "model.onnx"
    engine = repo / target.int8_model / "1" / "model.onnx"
    stamp, record = stamp_path(engine), _record(engine)
    theirs = [p for p in (repo / target.openvino_model / "1" / "model.xml", engine) if p.is_file()
              and not (p == engine and stamp.is_file() and json.loads(stamp.read_text()).get("default"))]
    if theirs:
        say(f"{model}: {theirs[0].relative_to(repo)} is there (built on purpose, not by the main job): it serves ahead "
            "of FP32, unjudged; `python -m engine_build accuracy` judges it on your labelled photos")
        return theirs[0].parent.parent.name
    if engine.is_file():
        facts = json.loads(stamp.read_text())
        say(f"{model}: serving INT8 ({target.int8_model}, {RECIPE}; checked on {facts['default']['cpu']})")
        return target.int8_model
    cpu = cpu_identity()
    if record.is_file():
        facts = json.loads(record.read_text())
        if facts.get("cpu") == cpu:
            say(f"NOTE: {model} stays FP32 ({target.onnx_model}): {facts['reason']} (checked {facts['when']}; delete "
                f"{record} to check again)")
            return target.onnx_model
    say(f"{model}: building its INT8 engine ({RECIPE}) and checking it on this CPU ...")
    spec = load_child(repo, target.onnx_model).preprocess
    tensors = calibration_tensors(samples, spec)
    quantize(fp32_path, engine, tensors, method=METHOD)
    fp32, served = served_runner(repo, target.onnx_model, fp32_path), served_runner(repo, target.int8_model, engine)
    check = kernel_check(fp32, served, exact_runner(engine), tensors)
    variants = agreement(fp32, served, image_variants(samples, spec))
    validated = VALIDATED.get(model)
    judged = (f"the recipe judged on {validated.photos} (its arithmetic: top-1 {validated.top1:.1%} against FP32's "
              f"{validated.fp32_top1:.1%}, {validated.ratio:.3f}; agreement {validated.agreement:.1%})" if validated
              else
              f"the recipe judged on efficientnet_lite0's labelled photos only ({model} is not judged on labels here"
              + ("; its weights are RANDOM" if exported_weights(fp32_path) == "random" else "") + ")")
    extra = (f"top-1 agreement with FP32 on {variants.images} distorted sample variants: {variants.top1_agreement:.1%} "
             "(not judged)")
    if check.passes:
        facts = json.loads(stamp.read_text()) if stamp.is_file() else {}
        facts["default"] = {"cpu": cpu, "kernel_error": round(check.ratio, 4),
                            "variant_agreement": round(variants.top1_agreement, 4),
                            "when": time.strftime("%Y-%m-%d %H:%M")}
        stamp.write_text(json.dumps(facts))
        say(f"{model}: serving INT8 ({target.int8_model}): {judged}; this CPU's INT8 kernels compute it (their "
            f"distance from it is {check.ratio:.2f} of the quantization's own, at most {MAX_KERNEL_ERROR}); {extra}")
        return target.int8_model
    reason = ("this CPU's INT8 kernels do not compute the arithmetic that was judged on labelled photos: their logits "
              f"are {check.ratio:.1f}x as far from it as the quantization's own error (at most {MAX_KERNEL_ERROR}x), "
              f"as where AVX2 without VNNI saturates int16 sums ({cpu}); {extra}")
    engine.unlink()
    stamp.unlink(missing_ok=True)
    record.write_text(json.dumps({"reason": reason, "cpu": cpu, "kernel_error": round(check.ratio, 4),
                                  "when": time.strftime("%Y-%m-%d %H:%M")}))
    say(f"NOTE: {model} stays FP32 ({target.onnx_model}): {reason}")
    return target.onnx_model


