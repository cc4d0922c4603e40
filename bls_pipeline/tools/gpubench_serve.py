"""gpubench serve: end to end over gRPC at each concurrency, classify_bls decoding on the GPU
against resnet50_torch fed tensors (the ceiling) and classify_bls decoding on the CPU."""

from __future__ import annotations

import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path

from google.protobuf import text_format
from tqdm import tqdm

from ..base.modelconfig import parse_config
from . import bench_images, bench_sweep
from .gpubench_checks import nvidia_smi
from .gpubench_decode import photo_set
from .gpubench_results import CEILING, CPU_FLOW, GPU_FLOW, fail, load, record

__all__ = ["cmd_serve", "gpu_repository", "serve_ratios"]

# ---- serve: (b) end to end -----------------------------------------------------------------------
# The classifier alone, no cascade, no flipped pass: the same work as the ceiling per image.
FLOW_SETTINGS = {"cascade_classifiers": "none", "tta_threshold": "0", "classifiers": CEILING}
# A dry run without a GPU: resnet50_torch warms up to its max_batch_size at load (64 on the
# GPU), which in fp32 on a CPU takes seconds; the flows chunk their calls at this size.
DRY_RUN_MAX_BATCH = 8
BENCH_QUEUE = 4096


def gpu_repository(src: Path, dst: Path, gpu: bool, gpu_flow_instances: int = 1, classifier_instances: int = 1) -> None:
    """models/ with its artifacts linked, plus the bench's variants: classify_bls decoding on
    the GPU (`gpu_flow_instances` stubs on it) and on the CPU (as shipped: two CPU instances),
    both on resnet50_torch alone; resnet50_torch on the GPU (or, for a dry run without one,
    everything on CPU instances, resnet50_torch in fp32 without CUDA graphs)."""
    shutil.copytree(src, dst, symlinks=True,
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.plan", "*.pt", "__pycache__"))
    for pattern in ("*/1/*.onnx", "*/1/*.onnx.data", "*/1/*.plan", "*/1/*.pt"):
        for artifact in src.glob(pattern):
            (dst / artifact.relative_to(src)).symlink_to(artifact.resolve())
    for name, kind in ((GPU_FLOW, "KIND_GPU" if gpu else "KIND_CPU"), (CPU_FLOW, "KIND_CPU")):
        (dst / name).mkdir()
        (dst / name / "1").symlink_to((dst / "classify_bls" / "1").resolve())
        count = gpu_flow_instances if gpu and name == GPU_FLOW else None
        (dst / name / "config.pbtxt").write_text(_variant(src / "classify_bls", name, FLOW_SETTINGS, kind, count=count))
    if gpu and classifier_instances != 1:
        (dst / CEILING / "config.pbtxt").write_text(_variant(src / CEILING, CEILING, {}, "KIND_GPU",
                                                             count=classifier_instances))
    if not gpu:
        cpu_settings = {"precision": "fp32", "cuda_graphs": "0"}  # CUDA graphs need a KIND_GPU instance
        (dst / CEILING / "config.pbtxt").write_text(_variant(src / CEILING, CEILING, cpu_settings, "KIND_CPU",
                                                             max_batch_size=DRY_RUN_MAX_BATCH))


def _variant(model_dir: Path, name: str, params: dict[str, str], kind: str, count: int | None = None,
             max_batch_size: int | None = None) -> str:
    config = parse_config(model_dir)
    config.name = name
    if max_batch_size is not None:
        config.max_batch_size = max_batch_size
    for key, value in params.items():
        config.parameters[key].string_value = value
    if name in (GPU_FLOW, CPU_FLOW):
        # A throughput sweep, not an overload test: the shipped queue bound (64) refuses most
        # of a 512-client point's requests; queued ones are measured instead.
        config.dynamic_batching.default_queue_policy.max_queue_size = BENCH_QUEUE
        # An execute() as every GPU run measured it (docs/gpu.md): up to 64 images from the queue,
        # not the shipped CPU's batches of 8.
        config.dynamic_batching.ClearField("preferred_batch_size")
    for group in config.instance_group:
        group.kind = group.KIND_GPU if kind == "KIND_GPU" else group.KIND_CPU
        if count is not None:
            group.count = count
    return text_format.MessageToString(config)


def _run_points(url: str, target: str, model: str, concurrency: int, payloads: list, args, pool) -> bench_sweep.Point:
    """One load point from `procs` client processes at once (one Python process's gRPC client
    saturates near a few thousand requests/s): images/s summed; latency percentiles and the
    server's per-request times averaged over the processes, weighted by their requests."""
    procs = max(1, min(concurrency, args.client_procs))
    shares = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    futures = [pool.submit(_point_in_process, url, target, model, c, payloads, args.duration, args.warmup)
               for c in shares]
    points = [f.result() for f in futures]
    n = sum(p.requests for p in points) or 1
    mean = lambda field: float(sum(getattr(p, field) * p.requests for p in points) / n)  # noqa: E731
    return bench_sweep.Point(model if target == "classifier" else target, concurrency,
                             sum(p.images_per_s for p in points),
                       mean("p50_ms"), mean("p95_ms"), mean("p99_ms"), sum(p.requests for p in points),
                       sum(p.errors for p in points), mean("server_queue_ms"), mean("server_compute_ms"))


def _started(_: int) -> None:
    """Nothing: a spawned client process that runs it has imported this module (and bench)."""


def _point_in_process(url, target, model, concurrency, payloads, duration, warmup) -> bench_sweep.Point:
    """In a client process: the classifier target means `model` (bls-bench's is resnet50_onnx)."""
    return bench_sweep.run_point(url, "grpc", target, concurrency, payloads, duration, warmup, classifier=model)


def gpu_memory(loaded: tuple[str, ...]) -> dict:
    """MiB of GPU memory per process (nvidia-smi), named by the model its python stub serves."""
    rows = nvidia_smi("--query-compute-apps=pid,used_memory")
    if isinstance(rows, str):
        return {"unavailable": rows}
    out: dict = {}
    for pid, used in rows:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            model_path = next((a.decode() for a in argv if a.endswith(b"/model.py")), "")
            name = Path(model_path).parent.parent.name if model_path else Path(argv[0].decode()).name
        except OSError:
            name = f"pid {pid} (not visible here)"
        key = name if name in loaded or name == "tritonserver" else f"{name} (pid {pid})"
        out[key] = out.get(key, 0) + int(float(used))
    return out


def cmd_serve(args) -> int:
    from ..serve.options import ServerOptions
    from ..serve.server import TritonServer

    gpu = args.device == "cuda"
    deadline = time.monotonic() + args.time_budget if args.time_budget else None
    work = Path(tempfile.mkdtemp(prefix="bls-gpubench-"))
    repo = work / "models"
    gpu_repository(args.model_repository, repo, gpu, args.gpu_flow_instances, args.classifier_instances)
    targets = [(GPU_FLOW, GPU_FLOW), ("classifier", CEILING), (CPU_FLOW, CPU_FLOW)]
    models = tuple(dict.fromkeys(m for _, m in targets))
    log = args.out / "tritonserver_bench.log"
    # BLS tensors in GPU memory cross between the stubs through Triton's CUDA memory pool:
    # room for a few 64-image batches in flight (the default 64 MB holds one).
    extra = (f"--cuda-memory-pool-byte-size=0:{args.cuda_pool_mb << 20}",) if gpu else ()
    server = TritonServer(ServerOptions.on_free_ports(repo, log, models=models, startup_timeout_s=300,
                                                      extra_args=extra))
    missing = server.not_loaded(models)
    report: dict = {"device": args.device, "client_processes": args.client_procs, "duration_s": args.duration,
                    "warmup_s": args.warmup, "gpu_flow_instances": args.gpu_flow_instances if gpu else None,
                    "classifier_instances": args.classifier_instances if gpu else None,
                    "server_args": list(extra), "points": [], "gpu_memory_mib": {}, "stopped_early": None}
    if missing:
        shutil.rmtree(work, ignore_errors=True)
        return fail(args.out, "serve", f"cannot load {missing}")
    images = photo_set(args)
    tensors = bench_images.tensor_set(images)
    report["images"] = len(images)
    per_point = args.duration + args.warmup + 3.0
    try:
        server.start()
        url = server.url("grpc")
        report["loaded"] = list(server.loaded)
        report["gpu_memory_mib"]["after_load"] = gpu_memory(server.loaded)
        with ProcessPoolExecutor(max_workers=args.client_procs, mp_context=get_context("spawn")) as pool:
            list(pool.map(_started, range(args.client_procs)))  # the client processes up, their imports done
            grid = [(target, model, c) for c in args.concurrency for target, model in targets]
            for target, model, c in tqdm(grid, desc="serve", unit="point"):
                if deadline is not None and time.monotonic() + per_point > deadline:
                    report["stopped_early"] = f"time budget: stopped before {model} at concurrency {c}"
                    break
                point = _run_points(url, target, model, c, tensors if target == "classifier" else images, args, pool)
                report["points"].append(asdict(point))
                if c == args.concurrency[-1] or c == max(args.concurrency):
                    report["gpu_memory_mib"][f"{model} at c={c}"] = gpu_memory(server.loaded)
                record(args.out, "serve", report)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    report["ratios"] = serve_ratios(report["points"], load(args.out).get("decode"))
    record(args.out, "serve", report)
    return 0


def serve_ratios(points: list[dict], decode: dict | None) -> dict:
    """The issue's two targets from the points: classify_bls on the GPU path against the
    ceiling at its best concurrency (>= 0.8), and against the CPU-decode path (by the factor
    the decode rates of step (a) predict)."""
    best = {}
    for p in points:
        if p["errors"] == 0 and p["images_per_s"] > best.get(p["target"], {}).get("images_per_s", -1):
            best[p["target"]] = p
    out: dict = {"best": {t: {"concurrency": p["concurrency"], "images_per_s": p["images_per_s"]}
                          for t, p in best.items()}}
    if GPU_FLOW in best and CEILING in best:
        out["gpu_flow_over_ceiling"] = best[GPU_FLOW]["images_per_s"] / best[CEILING]["images_per_s"]
    if GPU_FLOW in best and CPU_FLOW in best:
        out["gpu_flow_over_cpu_flow"] = best[GPU_FLOW]["images_per_s"] / best[CPU_FLOW]["images_per_s"]
        rows = (decode or {}).get("rows") or []
        if rows and CEILING in best:
            top = max(rows, key=lambda r: r["batch"])
            ceiling = best[CEILING]["images_per_s"]
            out["predicted_gpu_flow_over_cpu_flow"] = (min(ceiling, top["gpu_path_images_per_s"])
                                                       / min(ceiling, top["cpu_path_images_per_s"]))
    return out
