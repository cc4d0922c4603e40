"""`python -m engine_build export|trt`: one command per artifact."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ONNX = REPO / "models" / "resnet50_onnx" / "1" / "model.onnx"
DEFAULT_PLAN = REPO / "models" / "resnet50_trt" / "1" / "model.plan"
DEFAULT_TRT_CONFIG = REPO / "models" / "resnet50_trt" / "config.pbtxt"


def _export(args) -> int:
    from .export_onnx import WeightsUnavailable, build_torch_model, export_onnx

    try:
        model = build_torch_model(args.weights)
    except WeightsUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    diff = export_onnx(model, args.output)
    print(f"wrote {args.output} (weights: {args.weights}; onnxruntime vs torch max abs diff {diff:.2e})")
    return 0


def _trt(args) -> int:
    from .build_trt import TensorRTUnavailable, build_plan, set_max_batch_size

    try:
        build_plan(args.onnx, args.output, fp16=args.fp16, min_batch=args.min_batch, opt_batch=args.opt_batch,
                   max_batch=args.max_batch, workspace_gib=args.workspace_gib)
    except (TensorRTUnavailable, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    set_max_batch_size(args.config, args.max_batch)
    print(f"wrote {args.output} ({'FP16' if args.fp16 else 'FP32'}, batch {args.min_batch}/{args.opt_batch}/{args.max_batch}); "
          f"set max_batch_size: {args.max_batch} in {args.config}. The plan runs only on this GPU model.")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(prog="python -m engine_build")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("export", help="torchvision resnet50 -> ONNX (dynamic batch, input/output)")
    e.add_argument("--weights", required=True, help="'imagenet' (torchvision download), 'random' (seeded, for tests) or a .pth state dict")
    e.add_argument("--output", type=Path, default=DEFAULT_ONNX)
    e.set_defaults(run=_export)

    t = sub.add_parser("trt", help="ONNX -> TensorRT plan (needs TensorRT and a GPU)")
    t.add_argument("--onnx", type=Path, default=DEFAULT_ONNX)
    t.add_argument("--output", type=Path, default=DEFAULT_PLAN)
    t.add_argument("--config", type=Path, default=DEFAULT_TRT_CONFIG, help="config.pbtxt whose max_batch_size is set")
    t.add_argument("--fp16", action="store_true")
    t.add_argument("--min-batch", type=int, default=1)
    t.add_argument("--opt-batch", type=int, default=8)
    t.add_argument("--max-batch", type=int, default=32)
    t.add_argument("--workspace-gib", type=float, default=4.0)
    t.set_defaults(run=_trt)

    args = p.parse_args(argv)
    return args.run(args)
