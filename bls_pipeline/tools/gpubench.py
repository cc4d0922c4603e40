"""The GPU path, checked and measured: `python -m bls_pipeline.tools.gpubench STEP --out DIR`.

    env         what this machine has: GPU, driver, Python, numpy (< 2 for the python backend
                stub), torch/torchvision and CUDA, tritonclient, the stub's libraries
    stub-check  a throwaway server with one python model, on a CPU instance (and a GPU one
                when there is a GPU): FP32 and string tensors through the stub, a CUDA tensor
                out through DLPack; fails with the reason when the stub does not work here
    decode      (a) in process: decode + preprocess of a batch of ImageNet-size JPEGs,
                images/s, the GPU path (runtime/decode/torch_device.py) against the CPU path on all
                cores, how far apart their tensors are, and the GPU path's parts alone
    classifier  resnet50_torch in process: images/s per batch size, eager against CUDA graphs
    serve       (b) end to end over gRPC at each concurrency: classify_bls decoding on the GPU
                (resnet50_torch), resnet50_torch fed preprocessed tensors (the ceiling) and
                classify_bls decoding on the CPU; images/s, p50/p99, each stub's GPU memory
    note        a shell step's outcome (exports, tests) into the same results

Each step merges its results into DIR/results.json and rewrites DIR/summary.md, so what
ran is on disk even when a later step fails or time runs out. `--device cpu` runs the same
steps without a GPU (scripts/gpu/run.sh --cpu-check): the torch path on the CPU, the flow
models on CPU instances. Load points reuse bls-bench's run_point, make_image_set and table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..serve.paths import checkout, default_models, default_samples
from .gpubench_checks import cmd_env, cmd_stub_check
from .gpubench_decode import cmd_classifier, cmd_decode
from .gpubench_results import CEILING, fail, record
from .gpubench_serve import cmd_serve

__all__ = ["main"]


# ---- note: a shell step's outcome ---------------------------------------------------------------
def cmd_note(args) -> int:
    """run.sh's own steps (exports, the tests): ok or not, and the last lines of their output."""
    data: dict = {"ok": args.status == "ok"}
    if args.detail:
        data["error" if args.status != "ok" else "detail"] = args.detail
    if args.log and args.log.exists():
        tail = args.log.read_text(errors="replace").strip().splitlines()[-3:]
        data["summary"] = tail[-1] if tail else ""
    record(args.out, args.section, data)
    return 0


# ---- command line ----------------------------------------------------------------------------------
def _ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: write positive whole numbers, comma-separated")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bls_pipeline.tools.gpubench", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("step", choices=("env", "stub-check", "decode", "classifier", "serve", "note"))
    p.add_argument("--out", type=Path, default=(checkout() or Path(".")) / "gpu_results",
                   help="results.json and summary.md go here")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: the same steps without a GPU (a dry run)")
    p.add_argument("--images", type=Path, default=default_samples(), help="folder of JPEG photos")
    p.add_argument("--model-repository", type=Path, default=default_models(), help="with the exported artifacts")
    p.add_argument("--batch", type=_ints, default=[64, 256], help="decode: batch sizes")
    p.add_argument("--seconds", type=float, default=4.0, help="decode: seconds per measurement")
    p.add_argument("--min-runs", type=int, default=3, help="decode: at least this many batches per measurement")
    p.add_argument("--classifier-batch", type=_ints, default=[1, 8, 32, 64], help="classifier: batch sizes")
    p.add_argument("--concurrency", type=_ints, default=[1, 2, 4, 8, 16, 32, 64, 128, 256], help="serve: the sweep")
    p.add_argument("--duration", type=float, default=4.0, help="serve: seconds measured per point")
    p.add_argument("--warmup", type=float, default=1.5, help="serve: seconds per point before measuring")
    p.add_argument("--client-procs", type=int, default=4, help="serve: client processes per point")
    p.add_argument("--gpu-flow-instances", type=int, default=2, help="serve: classify_bls stubs on the GPU")
    p.add_argument("--classifier-instances", type=int, default=1, help=f"serve: {CEILING} instances on the GPU")
    p.add_argument("--cuda-pool-mb", type=int, default=1024, help="serve: Triton's CUDA memory pool on GPU 0")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="serve: stop the sweep before this many seconds (0: no limit)")
    p.add_argument("--section", help="note: which results section (exports, tests)")
    p.add_argument("--status", choices=("ok", "failed"), default="ok", help="note: the step's outcome")
    p.add_argument("--detail", help="note: what failed, or what was done")
    p.add_argument("--log", type=Path, help="note: the step's output; its last line goes into the results")
    args = p.parse_args(argv)
    if args.step == "note" and not args.section:
        p.error("note needs --section")
    args.out.mkdir(parents=True, exist_ok=True)
    steps = {"env": cmd_env, "stub-check": cmd_stub_check, "decode": cmd_decode, "classifier": cmd_classifier,
             "serve": cmd_serve, "note": cmd_note}
    try:
        return steps[args.step](args)
    except Exception as exc:  # noqa: BLE001 - the step's failure goes into the results, then the exit code
        import traceback

        traceback.print_exc()
        return fail(args.out, args.step.replace("-", "_"), f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
