"""`bls-trace`: where one classify_bls request's time goes, stage by stage, at concurrency 1.

bls-bench gives classify_bls's p50 at concurrency 1; this splits it. It starts
tritonserver on a copy of models/ (as bls-bench: resnet50 only, no flip pass) in which
classify_bls and resnet50_onnx run their own model.py, wrapped so that execute() stamps
the time on entry and exit and the runtime's stage hook (runtime/hooks.py: decode +
preprocess, the flow, the child call and its DLPack glue, onnxruntime, top-k) stamps
every stage's edges. The clock is CLOCK_MONOTONIC, one clock for every
process on the machine, so the gaps between one process's stamp and the next process's
are the hops through tritonserver. Requests go one at a time, alternating classify_bls
and the classifier alone fed the preprocessed tensor (bls-bench's `classifier`), so both
paths see the same machine; each segment is the median over requests of the time between
two consecutive stamps.
"""

from __future__ import annotations

import argparse
import bisect
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..serve.repository import export_hint
from ..serve.paths import default_models, default_samples

__all__ = ["PATHS", "install", "main", "report", "segments", "trace", "traced", "traced_repository"]

PATHS = {"direct": "classifier", "classify_bls": "classify_bls"}  # path -> bls-bench target
TRACED_MODELS = ("classify_bls", "resnet50_onnx")
SEND, RECEIPT = "client send", "client receipt"

_WRAPPER = '''"""bls-trace: {original} with stage stamps (bls_pipeline/stagetrace.py)."""
import importlib.util

from bls_pipeline.tools import stagetrace

stagetrace.install({trace_dir!r}, {model!r})
_spec = importlib.util.spec_from_file_location("traced_model", {original!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
TritonPythonModel = stagetrace.traced(_module.TritonPythonModel)
'''

_out: Any = None
_model = ""


# ---- inside the stub processes ------------------------------------------------------
def _stamp(name: str) -> None:
    _out.write(f"{time.perf_counter_ns()} {_model} {name}\n")


def install(trace_dir: str, model: str) -> None:
    """Stamp every runtime stage in this process (its stage hook)."""
    global _out, _model
    from ..runtime import hooks

    # noqa: SIM115 - lives as long as the stub
    _out = open(Path(trace_dir) / f"{os.getpid()}.txt", "a", buffering=1 << 16)
    _model = model
    hooks.listen(lambda name, edge: _stamp(f"{name} {edge}"))


def traced(model_class: type) -> type:
    """model.py's TritonPythonModel with execute() stamped; stamps written after each call."""
    class Traced(model_class):  # type: ignore[misc, valid-type]
        def execute(self, requests):
            _stamp("execute start")
            try:
                return super().execute(requests)
            finally:
                _stamp("execute end")
                _out.flush()
    return Traced


# ---- the client side ----------------------------------------------------------------
def traced_repository(src: Path, dst: Path) -> tuple[Path, Path]:
    """bls-bench's copy of `src` under dst/models, classify_bls and resnet50_onnx wrapped;
    returns (repository, directory the stubs write their stamps to)."""
    from .bench_targets import bench_repository

    repo, stamps = dst / "models", dst / "stamps"
    stamps.mkdir(parents=True)
    bench_repository(src, repo, keep_branches=False)
    for model in TRACED_MODELS:
        original = (src / model / "1" / "model.py").resolve()
        target = repo / model / "1" / "model.py"
        target.unlink()
        target.write_text(_WRAPPER.format(original=str(original), trace_dir=str(stamps), model=model))
    return repo, stamps


def trace(url: str, stamps: Path, requests: int, warmup: int, protocol: str = "grpc",
          images_dir: Path | None = None) -> dict[str, list[dict[str, int]]]:
    """Send `warmup` + `requests` requests per path, alternating; per path, one
    {stamp: ns} dict per measured request, the client's send and receipt included."""
    from ..serve.client import tritonclient_module
    from .bench_targets import build_request
    from .bench_images import make_image_set, tensor_set

    tc = tritonclient_module(protocol)
    images = make_image_set(sorted(Path(images_dir or default_samples()).glob("*.jpg")))
    payloads = {"direct": tensor_set(images), "classify_bls": images}
    client = tc.InferenceServerClient(url)
    calls = {path: [build_request(tc, target, p) for p in payloads[path]] for path, target in PATHS.items()}
    windows: list[tuple[str, int, int]] = []
    try:
        for i in tqdm(range(warmup + requests), desc="bls-trace", unit="pair"):
            for path in PATHS:
                model, inputs, outputs = calls[path][i % len(calls[path])]
                t0 = time.perf_counter_ns()
                client.infer(model, inputs, outputs=outputs)
                if i >= warmup:
                    windows.append((path, t0, time.perf_counter_ns()))
    finally:
        client.close()
    return _match(windows, _read_stamps(stamps))


def _read_stamps(stamps: Path) -> list[tuple[int, str]]:
    events = []
    for f in stamps.glob("*.txt"):
        for line in f.read_text().splitlines():
            ns, name = line.split(" ", 1)
            events.append((int(ns), name))
    return sorted(events)


def _match(windows: list[tuple[str, int, int]], events: list[tuple[int, str]]) -> dict[str, list[dict[str, int]]]:
    """Each request's stamps are those between its send and its receipt (one at a time)."""
    times = [t for t, _ in events]
    out: dict[str, list[dict[str, int]]] = {path: [] for path in PATHS}
    for path, t0, t1 in windows:
        request = {SEND: t0}
        for t, name in events[bisect.bisect_left(times, t0):bisect.bisect_right(times, t1)]:
            request.setdefault(name, t)
        request[RECEIPT] = t1
        out[path].append(request)
    return out


def segments(requests: list[dict[str, int]]) -> list[tuple[str, str, float]]:
    """(from, to, median ms) between consecutive stamps, in the order they happen."""
    names = sorted({n for r in requests for n in r},
                   key=lambda n: statistics.median(r[n] - r[SEND] for r in requests if n in r))
    return [(a, b, statistics.median((r[b] - r[a]) / 1e6 for r in requests if a in r and b in r))
            for a, b in zip(names, names[1:])]


def report(traces: dict[str, list[dict[str, int]]]) -> str:
    lines = []
    totals = {}
    for path, requests in traces.items():
        totals[path] = statistics.median((r[RECEIPT] - r[SEND]) / 1e6 for r in requests)
        lines += [f"{path} ({PATHS[path]}), {len(requests)} requests:", "", "| from | to | ms (p50) |",
                  "|---|---|---:|"]
        lines += [f"| {a} | {b} | {ms:.3f} |" for a, b, ms in segments(requests)]
        lines += [f"| {SEND} | {RECEIPT} (total) | {totals[path]:.3f} |", ""]
    lines.append(f"classify_bls - direct, p50 totals: {totals['classify_bls'] - totals['direct']:.3f} ms")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from ..serve.options import ServerOptions
    from ..serve.server import TritonServer

    p = argparse.ArgumentParser(prog="bls-trace", description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=300, help="measured requests per path")
    p.add_argument("--warmup", type=int, default=30, help="requests per path before measuring")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    p.add_argument("--model-repository", type=Path, default=default_models(),
                   help="default: ./models or the checkout's; its resnet50_onnx needs an exported model.onnx (random "
                        "weights will do)")
    p.add_argument("--images", type=Path, default=default_samples(),
                   help="folder of JPEG photos (default: the checkout's samples/)")
    args = p.parse_args(argv)
    if args.model_repository is None or args.images is None:
        p.error("give --model-repository DIR and --images DIR (no checkout's models/ and samples/ here)")
    workdir = Path(tempfile.mkdtemp(prefix="bls-trace-"))
    try:
        repo, stamps = traced_repository(args.model_repository, workdir)
        server = TritonServer(ServerOptions.on_free_ports(repo, workdir / "tritonserver.log", models=TRACED_MODELS))
        try:
            missing = server.not_loaded(TRACED_MODELS)  # before starting it
            if missing:
                p.error(f"cannot trace without {', '.join(missing)} ({missing}); random resnet50 weights will do: "
                        + export_hint("resnet50_onnx", weights="random"))
            server.start()
            traces = trace(server.url(args.protocol), stamps, args.requests, args.warmup, args.protocol, args.images)
        finally:
            server.stop()
        print(report(traces))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0
