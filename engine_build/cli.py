"""`python -m engine_build export|torch|trt|int8|openvino|agreement|accuracy [--model NAME]`, `ocr`: one command per
artifact or measurement."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path

from .export_onnx import EXPORTS, MODELS

SAMPLES = MODELS.parent / "samples"

DEFAULT_MODEL = "resnet50"


def _build(args):
    """The torch model with the weights asked for, or None after saying why not."""
    from .export_onnx import WeightsUnavailable, build_torch_model

    try:
        return build_torch_model(args.weights, args.model)
    except (WeightsUnavailable, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _export(args) -> int:
    from .export_onnx import export_onnx

    model = _build(args)
    if model is None:
        return 2
    diff = export_onnx(model, args.output, args.weights)
    print(f"wrote {args.output} ({args.model}, weights: {args.weights}; onnxruntime vs torch max abs diff {diff:.2e})")
    return 0


def _torch(args) -> int:
    from .export_torch import export_state_dict

    model = _build(args)
    if model is None:
        return 2
    checked = export_state_dict(model, args.output, args.weights, args.model, onnx_path=args.onnx)
    onnx = (f"; onnxruntime on {args.onnx} vs it max abs diff {checked['onnx']:.2e}" if checked["onnx"] is not None
            else f"; not compared with {args.onnx} (absent, or other weights)")
    print(f"wrote {args.output} ({args.model}, weights: {args.weights}; loaded back vs torch max abs diff "
          f"{checked['torch']:.2e}{onnx})")
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
    print(f"wrote {args.output} ({'FP16' if args.fp16 else 'FP32'}, batch "
          f"{args.min_batch}/{args.opt_batch}/{args.max_batch}); set max_batch_size: {args.max_batch} in "
          f"{args.config}. The plan runs only on this GPU model.")
    return 0


def _source_weights(onnx: Path) -> str:
    from bls_pipeline.engines.artifact_io import exported_weights

    return exported_weights(onnx) or "unknown"


def _stamp(path: Path, **facts) -> None:
    import json

    from bls_pipeline.engines.artifact_io import stamp_path

    stamp_path(path).write_text(json.dumps(facts))


def _int8(args) -> int:
    from bls_pipeline.runtime.load.children import load_child

    from .build_cpu import CalibrationError, calibration_tensors, quantize

    spec = load_child(MODELS, EXPORTS[args.model].onnx_model).preprocess  # what the served model is fed
    try:
        tensors = calibration_tensors(args.calibration, spec, limit=args.limit)
        quantize(args.onnx, args.output, tensors, method=args.method)
    except (CalibrationError, FileNotFoundError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _stamp(args.output, weights=_source_weights(args.onnx), precision="int8", method=args.method,
           calibration=str(args.calibration), images=len(tensors))
    print(f"wrote {args.output} (INT8 by {args.method}, calibrated on {len(tensors)} images from {args.calibration}; "
          f"weights: {_source_weights(args.onnx)})")
    return 0


def _openvino(args) -> int:
    from .build_cpu import convert_openvino

    try:
        convert_openvino(args.onnx, args.output)
    except (FileNotFoundError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _stamp(args.output, weights=_source_weights(args.onnx), precision="fp32")
    print(f"wrote {args.output} and its .bin (OpenVINO IR, FP32 weights; weights: {_source_weights(args.onnx)})")
    return 0


def _agreement(args) -> int:
    from bls_pipeline.runtime.load.children import load_child

    from .agreement import agreement, image_variants, runner
    from bls_pipeline.engines.artifact_io import exported_weights

    target = EXPORTS[args.model]
    engine = target.int8_path if args.engine == "int8" else target.openvino_path
    for path in (target.onnx_path, engine):
        if not path.exists():
            print(f"error: {path} is missing: build it first (python -m engine_build --help)", file=sys.stderr)
            return 2
    weights = exported_weights(target.onnx_path)
    tensors = image_variants(args.images, load_child(MODELS, target.onnx_model).preprocess)
    result = agreement(runner(target.onnx_path), runner(engine), tensors)
    print(f"{engine.relative_to(MODELS)} against {target.onnx_model} (FP32, weights: {weights}) on {result.images} "
          f"images (variants of {args.images}/*.jpg): top-1 agreement {result.top1_agreement:.2%}, top-5 overlap "
          f"{result.top5_overlap:.2%}")
    if weights == "random":
        print("note: random weights cannot judge accuracy (their scores are nearly flat): use real weights")
    return 0


def _accuracy(args) -> int:
    from .accuracy import GATE, LabelsError, measure, table
    from bls_pipeline.engines.artifact_io import exported_weights

    try:
        results = measure(args.model_repository, args.model, args.images, extra=args.engine, batch=args.batch,
                          exact=args.exact)
    except (LabelsError, FileNotFoundError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    weights = exported_weights(args.model_repository / EXPORTS[args.model].onnx_model / "1" / "model.onnx")
    print(f"\n{args.model} (weights: {weights}) on {results[0].images} labelled photos of {args.images}, preprocessed "
          f"as {EXPORTS[args.model].onnx_model} is served, batches of {args.batch}. An engine may be a default with "
          f"top-1 >= {GATE.min_ratio} x FP32's and top-1 agreement >= {GATE.min_agreement:.0%}.\n")
    print(table(results))
    if len(results) == 1:
        print("no engine built beside FP32: python -m engine_build int8 --help, python -m engine_build openvino --help")
    if weights == "random":
        print("note: random weights cannot judge accuracy: use real weights")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "weights": weights, "images": str(args.images),
                                         "results": [asdict(r) for r in results]}, indent=2))
    return 0


def _ocr(args) -> int:
    from .ocr import OcrWeightsUnavailable, build_ocr_models

    try:
        written = build_ocr_models(args.repository)
    except OcrWeightsUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(str(p) for p in written.values())} (PP-OCR weights from the rapidocr-onnxruntime wheel, "
          "Apache-2.0)")
    return 0


def _model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=sorted(EXPORTS), default=DEFAULT_MODEL,
                        help=f"classifier (default: {DEFAULT_MODEL})")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(prog="python -m engine_build")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("export", help="torch classifier -> ONNX (dynamic batch, input/output)")
    _model_argument(e)
    e.add_argument("--weights", help="; ".join(f"{name}: {t.weights_help}" for name, t in EXPORTS.items())
                   + f". Required for {', '.join(n for n, t in EXPORTS.items() if t.default_weights is None)}")
    e.add_argument("--output", type=Path, help="default: models/<model>_onnx/1/model.onnx")
    e.set_defaults(run=_export)

    served_by_torch = sorted(n for n, t in EXPORTS.items() if t.torch_model)
    w = sub.add_parser("torch",
                       help="torch classifier -> state dict for models/<model>_torch (torch on the GPU, no TensorRT)")
    w.add_argument("--model", choices=served_by_torch, default=DEFAULT_MODEL,
                   help=f"classifier (default: {DEFAULT_MODEL})")
    w.add_argument("--weights", help="as for export (the same value gives the same weights as the ONNX)")
    w.add_argument("--output", type=Path, help="default: models/<model>_torch/1/model.pt")
    w.add_argument("--onnx", type=Path,
                   help="compared with when it carries the same weights (default: models/<model>_onnx/1/model.onnx)")
    w.set_defaults(run=_torch)

    t = sub.add_parser("trt", help="ONNX -> TensorRT plan (needs TensorRT and a GPU)")
    _model_argument(t)
    t.add_argument("--onnx", type=Path, help="default: models/<model>_onnx/1/model.onnx")
    t.add_argument("--output", type=Path, help="default: models/<model>_trt/1/model.plan")
    t.add_argument("--config", type=Path,
                   help="config.pbtxt whose max_batch_size is set (default: models/<model>_trt/config.pbtxt)")
    t.add_argument("--fp16", action="store_true")
    t.add_argument("--min-batch", type=int, default=1)
    t.add_argument("--opt-batch", type=int, default=8)
    t.add_argument("--max-batch", type=int, default=32)
    t.add_argument("--workspace-gib", type=float, default=4.0)
    t.set_defaults(run=_trt)

    from .build_cpu import DEFAULT_METHOD, METHODS

    q = sub.add_parser("int8", help="ONNX -> INT8 for the CPU by post-training quantization, calibrated on images")
    _model_argument(q)
    q.add_argument("--method", choices=METHODS, default=DEFAULT_METHOD,
                   help=f"nncf: OpenVINO INT8 IR for models/<model>_openvino; onnxruntime: static QDQ ONNX for "
                        f"models/<model>_int8 (default: {DEFAULT_METHOD}, the faster here: docs/performance.md)")
    q.add_argument("--calibration", type=Path, default=SAMPLES,
                   help="folder of images like the ones served (default: samples/)")
    q.add_argument("--limit", type=int, help="calibrate on at most this many images of the folder (each also mirrored)")
    q.add_argument("--onnx", type=Path, help="the FP32 ONNX (default: models/<model>_onnx/1/model.onnx)")
    q.add_argument("--output", type=Path,
                   help="default: models/<model>_openvino/1/model.xml (onnxruntime: models/<model>_int8/1/model.onnx)")
    q.set_defaults(run=_int8)

    v = sub.add_parser("openvino",
                       help="ONNX -> OpenVINO IR (FP32 weights) for models/<model>_openvino (needs openvino)")
    _model_argument(v)
    v.add_argument("--onnx", type=Path, help="default: models/<model>_onnx/1/model.onnx")
    v.add_argument("--output", type=Path, help="default: models/<model>_openvino/1/model.xml")
    v.set_defaults(run=_openvino)

    a = sub.add_parser("agreement",
                       help="top-1 agreement and top-5 overlap of a CPU engine with its FP32 ONNX, on photos")
    _model_argument(a)
    a.add_argument("--engine", choices=("int8", "openvino"), default="int8",
                   help="models/<model>_int8 or models/<model>_openvino")
    a.add_argument("--images", type=Path, default=SAMPLES,
                   help="folder of .jpg photos, each cropped, mirrored and rescaled")
    a.set_defaults(run=_agreement)
    c = sub.add_parser("accuracy",
                       help="top-1/top-5 of FP32 and every built engine on labelled photos, agreement, the gate")
    _model_argument(c)
    c.add_argument("--images", type=Path, required=True,
                   help="folder of photos with a labels.csv (columns file,class_id)")
    c.add_argument("--engine", type=Path, action="append", default=[],
                   help="also this ONNX (run as <model>_int8) or IR (.xml, as <model>_openvino); repeatable")
    c.add_argument("--batch", type=int, default=1, help="photos per inference (default: 1, one request at a time)")
    c.add_argument("--exact", action="store_true",
                   help="also score each INT8 ONNX's exact QDQ arithmetic (graph optimisations off): what CPUs whose "
                        "INT8 kernels do not saturate compute (slow)")
    c.add_argument("--json", type=Path, help="also write the results here")
    c.add_argument("--model-repository", type=Path, default=MODELS,
                   help=f"where the model folders are (default: {MODELS})")
    c.set_defaults(run=_accuracy)
    o = sub.add_parser("ocr",
                       help="PP-OCR text detector, orientation classifier and recogniser -> models/text_*/1/model.onnx")
    o.add_argument("--repository", type=Path, default=MODELS,
                   help=f"model repository to write into (default: {MODELS})")
    o.set_defaults(run=_ocr)

    args = p.parse_args(argv)
    if args.command == "ocr":
        return args.run(args)
    target = EXPORTS[args.model]
    if args.command in ("export", "torch"):
        if args.weights is None:
            if target.default_weights is None:
                (e if args.command == "export" else w).error(f"--weights is required for {args.model}: "
                                                             f"{target.weights_help}")
            args.weights = target.default_weights
        if args.command == "export":
            args.output = args.output or target.onnx_path
        else:
            args.output, args.onnx = args.output or target.torch_path, args.onnx or target.onnx_path
    elif args.command == "trt":
        args.onnx = args.onnx or target.onnx_path
        args.output = args.output or target.plan_path
        args.config = args.config or target.trt_config
    elif args.command in ("int8", "openvino"):
        args.onnx = args.onnx or target.onnx_path
        openvino = args.command == "openvino" or args.method == "nncf"
        args.output = args.output or (target.openvino_path if openvino else target.int8_path)
    return args.run(args)
