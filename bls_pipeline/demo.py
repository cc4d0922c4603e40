"""`bls-demo`: the README's main job, end to end on this machine.

Exports the ONNX classifier if missing, starts the embedded tritonserver on free ports,
classifies the sample images over HTTP and gRPC, prints the labels, stops the server.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .client import ClassifyClient, classify_files, find_images, format_table
from .server import ServerOptions, TritonServer, free_port

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent


def ensure_classifier(repo: Path, say=print) -> str:
    """Export resnet50 to ONNX if it is missing; returns which weights the model carries."""
    from engine_build.export_onnx import WeightsUnavailable, build_torch_model, export_onnx

    onnx_path = repo / "resnet50_onnx" / "1" / "model.onnx"
    stamp = onnx_path.with_suffix(".onnx.json")
    if onnx_path.exists():
        weights = json.loads(stamp.read_text())["weights"] if stamp.exists() else "unknown"
        say(f"using existing {onnx_path.relative_to(repo.parent)} (weights: {weights})")
        return weights
    try:
        model, weights = build_torch_model("imagenet"), "imagenet"
    except WeightsUnavailable as exc:
        say(f"WARNING: {exc}.\n"
            "WARNING: falling back to RANDOM weights: the labels below are meaningless.\n"
            "WARNING: for real labels, download resnet50 ImageNet weights elsewhere and run\n"
            "           python -m engine_build export --weights /path/to/resnet50.pth")
        model, weights = build_torch_model("random"), "random"
    export_onnx(model, onnx_path)
    stamp.write_text(json.dumps({"weights": weights}))
    return weights


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bls-demo", description=__doc__.splitlines()[0])
    p.add_argument("images", nargs="*", default=[str(REPO / "samples")], help="files or folders (default: samples/)")
    p.add_argument("--model-repository", type=Path, default=REPO / "models")
    p.add_argument("--topk", type=int, default=3)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    weights = ensure_classifier(args.model_repository)
    files = find_images(args.images)
    opts = ServerOptions(args.model_repository, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                         log_file=Path(args.model_repository).parent / "tritonserver.log")
    print(f"starting tritonserver (log: {opts.log_file}) ...", flush=True)
    with TritonServer(opts) as server:
        print(f"loaded: {', '.join(server.loaded)}; not loaded: "
              + (", ".join(f"{m} ({why})" for m, why in server.skipped.items()) or "none"))
        failed = False
        for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
            client = ClassifyClient(url, protocol, concurrency=4)
            try:
                results = classify_files(client, files, args.topk, concurrency=4)
            finally:
                client.close()
            print(f"\n== classify_bls over {protocol.upper()} ({url}), top-{args.topk} ==")
            print(format_table(results))
            failed |= any(r.error for r in results)
    if weights == "random":
        print("\nNOTE: resnet50 carries RANDOM weights here (no pretrained download): labels are meaningless.")
    print("server stopped.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
