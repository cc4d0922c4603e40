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
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from tqdm import tqdm

from ..base.modelconfig import parse_config
from ..stages.decode import DecodePolicy
from ..stages.jpeg_header import gpu_jpeg
from ..stages.preprocess import PreprocessSpec
from ..serve.paths import checkout, default_models, default_samples
from . import bench_images, bench_sweep

__all__ = ["gpu_repository", "main"]

CEILING = "resnet50_torch"
GPU_FLOW, CPU_FLOW = "classify_bls_gpu", "classify_bls_cpu"
# The classifier alone, no cascade, no flipped pass: the same work as the ceiling per image.
FLOW_SETTINGS = {"cascade_classifiers": "none", "tta_threshold": "0", "classifiers": CEILING}
# A dry run without a GPU: resnet50_torch warms up to its max_batch_size at load (64 on the
# GPU), which in fp32 on a CPU takes seconds; the flows chunk their calls at this size.
DRY_RUN_MAX_BATCH = 8
BENCH_QUEUE = 4096
RESULTS, SUMMARY = "results.json", "summary.md"


# ---- results on disk ---------------------------------------------------------------------
def _load(out: Path) -> dict:
    path = out / RESULTS
    return json.loads(path.read_text()) if path.exists() else {}


def record(out: Path, section: str, data) -> None:
    """Merge one step's results into out/results.json and rewrite out/summary.md."""
    out.mkdir(parents=True, exist_ok=True)
    results = _load(out)
    results[section] = data
    (out / RESULTS).write_text(json.dumps(results, indent=2, default=str))
    (out / SUMMARY).write_text(summary(results))


def _fail(out: Path, section: str, message: str) -> int:
    record(out, section, {"ok": False, "error": message})
    print(f"gpubench {section}: FAILED: {message}", file=sys.stderr)
    return 1


# ---- env -------------------------------------------------------------------------------------
def _version(module: str) -> str | None:
    import importlib

    try:
        mod = importlib.import_module(module)
        return getattr(mod, "__version__", "?")
    except Exception as exc:  # noqa: BLE001 - a broken install reports itself
        return f"import failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def _nvidia_smi(*query: str) -> list[list[str]] | str:
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found"
    proc = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        return f"nvidia-smi failed: {proc.stderr.strip()[:200]}"
    return [[cell.strip() for cell in line.split(",")] for line in proc.stdout.strip().splitlines() if line.strip()]


def _stub_libraries() -> dict:
    """The python backend stub for this Python and the shared libraries it cannot find
    (libpython above all: the stub embeds this interpreter's)."""
    import importlib.util
    import sysconfig

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return {"ok": False, "error": "nvidia-pytriton is not installed (its wheel carries tritonserver and the stub)"}
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    stub = root / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}" / "triton_python_backend_stub"
    if not stub.exists():
        return {"ok": False, "error": f"no python backend stub for Python {sys.version_info.major}.{sys.version_info.minor} in {root}"}
    libs = root.parent.parent / "nvidia_pytriton.libs"
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(
        p for p in (sysconfig.get_config_var("LIBDIR") or "", str(libs), os.environ.get("LD_LIBRARY_PATH", "")) if p))
    if shutil.which("ldd") is None:
        return {"ok": True, "stub": str(stub), "note": "ldd not found: the stub's libraries were not checked"}
    proc = subprocess.run(["ldd", str(stub)], capture_output=True, text=True, env=env, timeout=30)
    missing = [line.split("=>")[0].strip() for line in proc.stdout.splitlines() if "not found" in line]
    result = {"ok": not missing, "stub": str(stub), "libdir": sysconfig.get_config_var("LIBDIR")}
    if missing:
        result["error"] = (f"the stub cannot find {', '.join(missing)}: install the shared library of this Python "
                           "(e.g. the libpython3.x package) or run from a Python that ships it")
    return result


def cmd_env(args) -> int:
    import numpy

    report: dict = {"python": f"{platform.python_version()} ({sys.executable})", "cores": os.cpu_count(),
                    "machine": platform.platform(), "numpy": numpy.__version__, "numpy_path": numpy.__file__}
    for module in ("torch", "torchvision", "PIL", "onnx", "onnxruntime", "onnxscript", "grpc", "google.protobuf"):
        report[module] = _version(module)
    try:
        import tritonclient.grpc  # noqa: F401 - its generated code checks grpcio and protobuf versions

        report["tritonclient.grpc"] = "ok"
    except Exception as exc:  # noqa: BLE001
        report["tritonclient.grpc"] = f"import failed: {type(exc).__name__}: {exc}"
    try:
        import torch

        report["cuda"] = {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
                          "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    except Exception as exc:  # noqa: BLE001
        report["cuda"] = f"unknown: {exc}"
    report["gpus"] = _nvidia_smi("--query-gpu=name,driver_version,memory.total,clocks.max.sm")
    report["tensorrt"] = "installed" if _spec("tensorrt") else "absent (no TensorRT on this machine)"
    report["stub"] = _stub_libraries()
    problems = []
    if int(numpy.__version__.split(".")[0]) >= 2:
        problems.append(f"numpy {numpy.__version__}: the python backend stub of nvidia-pytriton 0.7.0 (pybind11 2.10) "
                        "needs numpy < 2; install numpy 1.26 first on the path (scripts/gpu/run.sh carries it)")
    if report["tritonclient.grpc"] != "ok":
        problems.append(f"tritonclient.grpc: {report['tritonclient.grpc']}")
    if not report["stub"]["ok"]:
        problems.append(report["stub"]["error"])
    if args.device != "cpu" and not (isinstance(report["cuda"], dict) and report["cuda"]["available"]):
        problems.append("torch sees no CUDA device")
    report["ok"], report["problems"] = not problems, problems
    record(args.out, "env", report)
    for problem in problems:
        print(f"gpubench env: {problem}", file=sys.stderr)
    return 0 if not problems else 1


def _spec(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# ---- stub-check ------------------------------------------------------------------------------
_ECHO_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "F", data_type: TYPE_FP32, dims: [ 3 ] }}, {{ name: "S", data_type: TYPE_STRING, dims: [ 1 ] }} ]
output [
  {{ name: "F2", data_type: TYPE_FP32, dims: [ 3 ] }}, {{ name: "S2", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "G3", data_type: TYPE_FP32, dims: [ 3 ] }}, {{ name: "INFO", data_type: TYPE_STRING, dims: [ 1 ] }}
]
instance_group [ {{ count: 1, kind: {kind} }} ]
"""

# The stub check's model: numpy and string tensors in and out; on a GPU instance, a CUDA
# tensor out through DLPack. Written to a temporary repository, never served otherwise.
_ECHO_MODEL = '''import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.kind = args["model_instance_kind"]

    def execute(self, requests):
        responses = []
        for request in requests:
            f = pb_utils.get_input_tensor_by_name(request, "F").as_numpy()
            s = pb_utils.get_input_tensor_by_name(request, "S").as_numpy()
            info = {"numpy": np.__version__, "kind": self.kind}
            tensors = [pb_utils.Tensor("F2", (f * 2).astype(np.float32)),
                       pb_utils.Tensor("S2", np.array([[x[0] + b"!"] for x in s], dtype=object))]
            if self.kind == "GPU":
                import torch
                g = torch.from_numpy(np.ascontiguousarray(f)).cuda() * 3
                tensors.append(pb_utils.Tensor.from_dlpack("G3", g))
                info["torch"] = torch.__version__
            else:
                tensors.append(pb_utils.Tensor("G3", (f * 3).astype(np.float32)))
            tensors.append(pb_utils.Tensor("INFO", np.array([[json.dumps(info).encode()]] * len(f), dtype=object)))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
'''


def _echo(url: str, model: str) -> dict:
    body = {"inputs": [{"name": "F", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]},
                       {"name": "S", "shape": [2, 1], "datatype": "BYTES", "data": ["ab", "cd"]}]}
    req = urllib.request.Request(f"http://{url}/v2/models/{model}/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            outputs = {o["name"]: o["data"] for o in json.loads(r.read())["outputs"]}
    except urllib.error.HTTPError as exc:
        return {"ok": False, "error": f"HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}"}
    except Exception as exc:  # noqa: BLE001 - a dead stub, a refused connection
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    expected = {"F2": [2, 4, 6, 8, 10, 12], "S2": ["ab!", "cd!"], "G3": [3, 6, 9, 12, 15, 18]}
    wrong = {k: outputs.get(k) for k, v in expected.items() if outputs.get(k) != v}
    info = json.loads(outputs["INFO"][0]) if outputs.get("INFO") else {}
    return {"ok": not wrong, "stub": info, **({"wrong": wrong} if wrong else {})}


def cmd_stub_check(args) -> int:
    from ..serve.options import ServerOptions
    from ..serve.server import TritonServer

    kinds = {"echo_cpu": "KIND_CPU"} if args.device == "cpu" else {"echo_cpu": "KIND_CPU", "echo_gpu": "KIND_GPU"}
    work = Path(tempfile.mkdtemp(prefix="bls-stub-check-"))
    report: dict = {"models": {}}
    server = None
    try:
        for name, kind in kinds.items():
            (work / "models" / name / "1").mkdir(parents=True)
            (work / "models" / name / "config.pbtxt").write_text(_ECHO_CONFIG.format(name=name, kind=kind))
            (work / "models" / name / "1" / "model.py").write_text(_ECHO_MODEL)
        server = TritonServer(ServerOptions.on_free_ports(work / "models", work / "tritonserver.log", startup_timeout_s=120))
        try:
            server.start()
        except Exception as exc:  # noqa: BLE001 - the reason is the point of this step
            report["models"] = {name: {"ok": False, "error": "did not load"} for name in kinds}
            raise RuntimeError(f"the server did not start: {exc}") from None
        for name in kinds:
            report["models"][name] = _echo(server.http_url, name)
    except Exception as exc:  # noqa: BLE001
        report["error"] = str(exc)
    finally:
        if server is not None:
            server.stop()
        report["ok"] = "error" not in report and all(m.get("ok") for m in report["models"].values())
        log = work / "tritonserver.log"
        if log.exists() and not report["ok"]:
            lines = log.read_text(errors="replace").splitlines()
            report["server_log_errors"] = [ln for ln in lines if ln.startswith(("E", "terminate", "  what()"))][-20:]
        shutil.rmtree(work, ignore_errors=True)
    if not report["ok"]:
        numpy_hint = ("; a stub that dies on its first string tensor is the numpy >= 2 symptom (pybind11 2.10): "
                      "check results.json env.numpy")
        report.setdefault("error", "a stub answered wrongly: " + json.dumps(report["models"]) + numpy_hint)
    record(args.out, "stub_check", report)
    if not report["ok"]:
        print(f"gpubench stub-check: FAILED: {report['error']}", file=sys.stderr)
        return 1
    stubs = ", ".join(f"{name}: {model['stub']}" for name, model in report["models"].items())
    print(f"gpubench stub-check: ok ({stubs})")
    return 0


# ---- decode: (a) in process --------------------------------------------------------------------
def _images(args) -> list[bytes]:
    samples = sorted(Path(args.images).glob("*.jpg"))
    if not samples:
        raise SystemExit(f"gpubench: no *.jpg in {args.images}")
    return bench_images.make_image_set(samples)  # ImageNet-size (500x375) JPEGs, each photo and its mirror


def _parity(cpu: np.ndarray, other: np.ndarray, spec) -> dict:
    """How far apart two preprocessed batches are, in uint8 pixel steps (1/255 before the
    mean/std: one step is what one rounding of a pixel value moves)."""
    steps = np.abs(cpu.astype(np.float32) - other.astype(np.float32)) * np.asarray(spec.std, np.float32).reshape(-1, 1, 1) / spec.scale
    return {"max_steps": float(steps.max()), "mean_steps": float(steps.mean()),
            "p99_9_steps": float(np.percentile(steps, 99.9)), "share_over_1_step": float((steps > 1.01).mean())}


def cmd_decode(args) -> int:
    from ..runtime.decode.device import HostDevice
    from ..runtime.decode.torch_device import TorchDevice

    spec, policy = PreprocessSpec(), DecodePolicy()
    images = _images(args)
    cores = os.cpu_count() or 1
    device_name = "cuda:0" if args.device == "cuda" else "cpu"
    torch_device = TorchDevice(device_name)
    import torch

    def sync():
        if torch_device.device.type == "cuda":
            torch.cuda.synchronize(torch_device.device)

    report: dict = {"images": f"{len(images)} distinct JPEGs of 500x375 (bls-bench's set), repeated to each batch",
                    "spec": "shorter side 256, centre crop 224, ImageNet mean/std, FP32 NCHW", "cpu_threads": cores,
                    "gpu_path_device": torch_device.name, "rows": []}
    with ThreadPoolExecutor(max_workers=cores, thread_name_prefix="decode") as pool:
        host = HostDevice(pool)
        for batch_size in args.batch:
            batch = [[images[i % len(images)]] for i in range(batch_size)]
            row = {"batch": batch_size}
            for path, device in (("gpu_path", torch_device), ("cpu_path", host)):
                row[f"{path}_images_per_s"] = _rate(lambda: device.decode(batch, policy, spec, False), batch_size, args, sync)
            row["gpu_over_cpu"] = row["gpu_path_images_per_s"] / row["cpu_path_images_per_s"]
            row.update(_decode_breakdown(torch_device, [b[0] for b in batch], spec, args, sync))
            report["rows"].append(row)
            print(f"decode batch {batch_size}: GPU path {row['gpu_path_images_per_s']:.0f} img/s, CPU path on {cores} "
                  f"threads {row['cpu_path_images_per_s']:.0f} img/s")
        report["regions"] = _regions(torch_device, host, images * 4, 8, args, sync, pool)
        # Parity on the distinct images: against the CPU path as it runs (its JPEG draft decode
        # is off for these, their shorter side is under 2 x 256) and with the draft off.
        one = [[data] for data in images]
        gpu = torch_device.to_host(torch_device.decode(one, policy, spec, False).batch)
        report["parity"] = _parity(host.decode(one, policy, spec, False).batch, gpu, spec)
        full = DecodePolicy(draft_min_side=0)
        report["parity_full_decode"] = _parity(host.decode(one, full, spec, False).batch,
                                               torch_device.to_host(torch_device.decode(one, full, spec, False).batch), spec)
    torch_device.close()
    report["target_images_per_s"] = 15000
    record(args.out, "decode", report)
    return 0


def _rate(fn, images: int, args, sync) -> float:
    """images/s of fn() (one warm call first), over args.seconds and at least args.min_runs calls."""
    fn()
    sync()
    runs, t0 = 0, time.perf_counter()
    while runs < args.min_runs or time.perf_counter() - t0 < args.seconds:
        fn()
        sync()
        runs += 1
    return images * runs / (time.perf_counter() - t0)


def _decode_breakdown(device, datas: list[bytes], spec, args, sync) -> dict:
    """Where the GPU path's time goes: the batched JPEG decode alone, preprocessing alone, and
    the decode split over 4 threads at once (does the decoder run calls in parallel?)."""
    ops = device._ops
    decoded = ops.decode_jpegs(datas, device.device)
    quarters = [datas[i::4] for i in range(4)]

    def threaded():
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda part: ops.decode_jpegs(part, device.device), quarters))

    return {"decode_only_images_per_s": _rate(lambda: ops.decode_jpegs(datas, device.device), len(datas), args, sync),
            "preprocess_only_images_per_s": _rate(lambda: ops.preprocess_batch(decoded, spec, device.device), len(datas), args, sync),
            "decode_4_threads_images_per_s": _rate(threaded, len(datas), args, sync),
            "header_us_per_image": 1e6 / _rate(lambda: [gpu_jpeg(d, DecodePolicy()) for d in datas], len(datas), args, lambda: None),
            "pillow_header_us_per_image": 1e6 / _rate(lambda: [_pillow_header(d) for d in datas], len(datas), args, lambda: None)}


def _pillow_header(data: bytes) -> tuple:
    """What the GPU path read from each header with Pillow before its own marker walk."""
    from PIL import Image

    with Image.open(io.BytesIO(data), formats=["JPEG"]) as img:
        return img.size, img.mode, img.getexif().get(0x0112, 1)


def _regions(torch_device, host, datas: list[bytes], per_image: int, args, sync, pool) -> dict:
    """Regions cut from decoded images into one batch (a detect-then-classify flow's second
    stage): `per_image` boxes on each image, the GPU path's crop_batch (torchvision roi_align)
    against the CPU path's (Pillow, per region, on the pool), regions/s."""
    from PIL import Image

    from ..stages.batching import crop_batch
    from ..stages.preprocess import PreprocessSpec

    rng = np.random.default_rng(0)
    on_device = torch_device._ops.decode_jpegs(datas, torch_device.device)
    on_host = [Image.open(io.BytesIO(d)).convert("RGB") for d in datas]
    rows = np.repeat(np.arange(len(datas)), per_image)
    boxes = []
    for row in rows:
        width, height = on_host[row].size
        x0, y0 = rng.uniform(0, width * 0.6), rng.uniform(0, height * 0.6)
        boxes.append((x0, y0, x0 + rng.uniform(24, width * 0.4), y0 + rng.uniform(24, height * 0.4)))
    boxes = np.array(boxes)
    out: dict = {"images": len(datas), "regions_per_image": per_image}
    for name, spec in (("classifier_224", PreprocessSpec()),
                       ("text_line_32x128", PreprocessSpec(mode="keep_aspect", crop=32, width=128))):
        gpu = _rate(lambda: torch_device.crop(on_device, rows, boxes, spec), len(rows), args, sync)
        cpu = _rate(lambda: crop_batch(on_host, rows, boxes, spec, pool), len(rows), args, lambda: None)
        out[name] = {"gpu_regions_per_s": gpu, "cpu_regions_per_s": cpu, "gpu_over_cpu": gpu / cpu}
        print(f"regions {name}: GPU {gpu:.0f}/s, CPU on {os.cpu_count()} threads {cpu:.0f}/s")
    return out


# ---- classifier: resnet50_torch in process -------------------------------------------------------
def cmd_classifier(args) -> int:
    """resnet50_torch's TorchClassifier in process, per batch size: eager (padded to its
    bucket) against CUDA graphs, images/s; what decides the model's cuda_graphs default."""
    import torch

    from ..engines.torch_classifier import TorchClassifier, TorchSettings

    weights = args.model_repository / CEILING / "1" / "model.pt"
    device = "cuda:0" if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        variants = {"eager": TorchSettings(), "cuda_graphs": TorchSettings(cuda_graphs=True)}
    else:
        variants = {"eager": TorchSettings(precision="fp32")}

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    # The served model's max_batch_size on the GPU. A dry run on the CPU warms up only what
    # it measures: a batch of 64 through resnet50 in fp32 takes seconds on a CPU.
    max_batch_size = 64 if args.device == "cuda" else max(args.classifier_batch)
    report: dict = {"weights": str(weights), "device": device, "rows": [], "load_s": {}}
    for name, settings in variants.items():
        t0 = time.perf_counter()
        model = TorchClassifier(weights, settings, device, max_batch_size=max_batch_size)
        report["load_s"][name] = time.perf_counter() - t0
        for size in args.classifier_batch:
            x = torch.randn(size, 3, 224, 224, device=device)
            rate = _rate(lambda: model(x), size, args, sync)
            report["rows"].append({"variant": name, "batch": size, "images_per_s": rate, "ms_per_batch": 1000 * size / rate})
            print(f"classifier {name} batch {size}: {rate:.0f} img/s")
        model = None  # its GPU memory back before the next variant
        if args.device == "cuda":
            torch.cuda.empty_cache()
    record(args.out, "classifier", report)
    return 0


# ---- serve: (b) end to end -----------------------------------------------------------------------
def gpu_repository(src: Path, dst: Path, gpu: bool, gpu_flow_instances: int = 1, classifier_instances: int = 1) -> None:
    """models/ with its artifacts linked, plus the bench's variants: classify_bls decoding on
    the GPU (`gpu_flow_instances` stubs on it) and on the CPU (as shipped: two CPU instances),
    both on resnet50_torch alone; resnet50_torch on the GPU (or, for a dry run without one,
    everything on CPU instances, resnet50_torch in fp32 without CUDA graphs)."""
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.plan", "*.pt", "__pycache__"))
    for pattern in ("*/1/*.onnx", "*/1/*.onnx.data", "*/1/*.plan", "*/1/*.pt"):
        for artifact in src.glob(pattern):
            (dst / artifact.relative_to(src)).symlink_to(artifact.resolve())
    for name, kind in ((GPU_FLOW, "KIND_GPU" if gpu else "KIND_CPU"), (CPU_FLOW, "KIND_CPU")):
        (dst / name).mkdir()
        (dst / name / "1").symlink_to((dst / "classify_bls" / "1").resolve())
        count = gpu_flow_instances if gpu and name == GPU_FLOW else None
        (dst / name / "config.pbtxt").write_text(_variant(src / "classify_bls", name, FLOW_SETTINGS, kind, count=count))
    if gpu and classifier_instances != 1:
        (dst / CEILING / "config.pbtxt").write_text(_variant(src / CEILING, CEILING, {}, "KIND_GPU", count=classifier_instances))
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
    futures = [pool.submit(_point_in_process, url, target, model, c, payloads, args.duration, args.warmup) for c in shares]
    points = [f.result() for f in futures]
    n = sum(p.requests for p in points) or 1
    mean = lambda field: float(sum(getattr(p, field) * p.requests for p in points) / n)  # noqa: E731
    return bench_sweep.Point(model if target == "classifier" else target, concurrency, sum(p.images_per_s for p in points),
                       mean("p50_ms"), mean("p95_ms"), mean("p99_ms"), sum(p.requests for p in points), sum(p.errors for p in points),
                       mean("server_queue_ms"), mean("server_compute_ms"))


def _started(_: int) -> None:
    """Nothing: a spawned client process that runs it has imported this module (and bench)."""


def _point_in_process(url, target, model, concurrency, payloads, duration, warmup) -> bench_sweep.Point:
    """In a client process: the classifier target means `model` (bls-bench's is resnet50_onnx)."""
    return bench_sweep.run_point(url, "grpc", target, concurrency, payloads, duration, warmup, classifier=model)


def gpu_memory(loaded: tuple[str, ...]) -> dict:
    """MiB of GPU memory per process (nvidia-smi), named by the model its python stub serves."""
    rows = _nvidia_smi("--query-compute-apps=pid,used_memory")
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
    server = TritonServer(ServerOptions.on_free_ports(repo, log, models=models, startup_timeout_s=300, extra_args=extra))
    missing = server.not_loaded(models)
    report: dict = {"device": args.device, "client_processes": args.client_procs, "duration_s": args.duration,
                    "warmup_s": args.warmup, "gpu_flow_instances": args.gpu_flow_instances if gpu else None,
                    "classifier_instances": args.classifier_instances if gpu else None,
                    "server_args": list(extra), "points": [], "gpu_memory_mib": {}, "stopped_early": None}
    if missing:
        shutil.rmtree(work, ignore_errors=True)
        return _fail(args.out, "serve", f"cannot load {missing}")
    images = _images(args)
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
    report["ratios"] = serve_ratios(report["points"], _load(args.out).get("decode"))
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
    out: dict = {"best": {t: {"concurrency": p["concurrency"], "images_per_s": p["images_per_s"]} for t, p in best.items()}}
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


# ---- summary.md ---------------------------------------------------------------------------------
def summary(results: dict) -> str:
    lines = ["# GPU path: checks and measurements", "", "Written by `python -m bls_pipeline.tools.gpubench` "
             "(scripts/gpu/run.sh); every number below was measured in this run. results.json holds all of them.", ""]
    env = results.get("env")
    if env:
        lines += ["## Machine", "", f"- Python {env.get('python')}, {env.get('cores')} cores; numpy {env.get('numpy')}; "
                  f"torch {env.get('torch')}; torchvision {env.get('torchvision')}; onnxruntime {env.get('onnxruntime')}",
                  f"- GPUs (nvidia-smi): {env.get('gpus')}; torch CUDA: {env.get('cuda')}", f"- TensorRT: {env.get('tensorrt')}",
                  f"- checks: {'ok' if env.get('ok') else 'PROBLEMS: ' + '; '.join(env.get('problems', []))}", ""]
    for section, title in (("stub_check", "Python backend stub"), ("exports", "Exports"), ("tests", "tests/gpu")):
        data = results.get(section)
        if data:
            state = "ok" if data.get("ok") else f"FAILED: {data.get('error', '')}"
            lines += [f"## {title}: {state}", ""]
            if section == "tests" and data.get("summary"):
                lines += [f"    {data['summary']}", ""]
    decode = results.get("decode")
    if decode and decode.get("rows"):
        lines += ["## (a) decode + preprocess in process", "", f"{decode['images']}; {decode['spec']}. GPU path on "
                  f"{decode['gpu_path_device']}; CPU path on {decode['cpu_threads']} threads. Target: "
                  f"{decode['target_images_per_s']} img/s.", "", "| batch | GPU path img/s | CPU path img/s | GPU / CPU |",
                  "|---:|---:|---:|---:|"]
        lines += [f"| {r['batch']} | {r['gpu_path_images_per_s']:.0f} | {r['cpu_path_images_per_s']:.0f} | {r['gpu_over_cpu']:.2f} |"
                  for r in decode["rows"]]
        split = [r for r in decode["rows"] if "decode_only_images_per_s" in r]
        if split:
            lines += ["", "Where the GPU path's time goes (img/s of each part alone; header reading in µs per image, "
                      "the marker walk the path uses against Pillow's reading):", "",
                      "| batch | JPEG decode | preprocess | decode on 4 threads at once | header µs | Pillow header µs |",
                      "|---:|---:|---:|---:|---:|---:|"]
            lines += [f"| {r['batch']} | {r['decode_only_images_per_s']:.0f} | {r['preprocess_only_images_per_s']:.0f} "
                      f"| {r['decode_4_threads_images_per_s']:.0f} | {r.get('header_us_per_image', float('nan')):.1f} "
                      f"| {r.get('pillow_header_us_per_image', float('nan')):.1f} |" for r in split]
        regions = decode.get("regions")
        if regions:
            lines += ["", f"Regions: {regions['regions_per_image']} boxes on each of {regions['images']} decoded images, "
                      "cut, resized and normalised into one batch:", "", "| spec | GPU regions/s | CPU regions/s | GPU / CPU |",
                      "|---|---:|---:|---:|"]
            lines += [f"| {name} | {r['gpu_regions_per_s']:.0f} | {r['cpu_regions_per_s']:.0f} | {r['gpu_over_cpu']:.1f} |"
                      for name, r in regions.items() if isinstance(r, dict)]
        for key, what in (("parity", "as the CPU path runs"), ("parity_full_decode", "CPU path without its JPEG draft decode")):
            p = decode.get(key)
            if p:
                lines.append(f"\nParity ({what}), in uint8 steps: max {p['max_steps']:.2f}, mean {p['mean_steps']:.3f}, "
                             f"99.9th percentile {p['p99_9_steps']:.2f}, over one step {p['share_over_1_step']:.2%}.")
        lines.append("")
    classifier = results.get("classifier")
    if classifier and classifier.get("rows"):
        lines += ["## resnet50_torch in process", "", f"On {classifier['device']}; load (with warm-up or capture): "
                  + ", ".join(f"{k} {v:.1f} s" for k, v in classifier["load_s"].items()) + ".", "",
                  "| variant | batch | images/s | ms per batch |", "|---|---:|---:|---:|"]
        lines += [f"| {r['variant']} | {r['batch']} | {r['images_per_s']:.0f} | {r['ms_per_batch']:.2f} |" for r in classifier["rows"]]
        lines.append("")
    serve = results.get("serve")
    if serve and serve.get("points"):
        points = [bench_sweep.Point(**p) for p in serve["points"]]
        meta = {"machine": f"{(env or {}).get('cores')} cores, {(env or {}).get('gpus')}", "versions": "see Machine",
                "protocol": "grpc", "duration_s": serve["duration_s"], "warmup_s": serve["warmup_s"],
                "images": serve.get("images", "?"), "rounds": 1}
        lines += ["## (b) end to end over gRPC", "", f"{serve['client_processes']} client processes share each point's "
                  "concurrency; p50/p95/p99 are their request-weighted means. classify_bls on the GPU: "
                  f"{serve.get('gpu_flow_instances')} instance(s), {CEILING} {serve.get('classifier_instances')}; "
                  f"server arguments: {serve.get('server_args')}.", "",
                  bench_sweep.markdown(points, [], meta)]
        if serve.get("stopped_early"):
            lines.append(f"Stopped early: {serve['stopped_early']}.\n")
        ratios = serve.get("ratios") or {}
        for key, target in (("gpu_flow_over_ceiling", ">= 0.8"), ("gpu_flow_over_cpu_flow", "the predicted factor"),
                            ("predicted_gpu_flow_over_cpu_flow", "from (a) and the ceiling")):
            if key in ratios:
                lines.append(f"- {key}: {ratios[key]:.3f} (target: {target})")
        if serve.get("gpu_memory_mib"):
            lines += ["", "GPU memory per process (MiB, nvidia-smi):", ""]
            lines += [f"- {when}: {json.dumps(mem)}" for when, mem in serve["gpu_memory_mib"].items()]
        lines.append("")
    return "\n".join(lines) + "\n"


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
    p.add_argument("--out", type=Path, default=(checkout() or Path(".")) / "gpu_results", help="results.json and summary.md go here")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the same steps without a GPU (a dry run)")
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
    p.add_argument("--time-budget", type=float, default=0.0, help="serve: stop the sweep before this many seconds (0: no limit)")
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
        return _fail(args.out, args.step.replace("-", "_"), f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
