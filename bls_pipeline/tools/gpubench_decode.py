"""gpubench decode and classifier, in process: decode + preprocess on the GPU path against the
CPU path (rates, parity, where the time goes, regions), and resnet50_torch per batch size."""

from __future__ import annotations

import io
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..stages.decode import DecodePolicy
from ..stages.jpeg_header import gpu_jpeg
from ..stages.preprocess import PreprocessSpec
from . import bench_images
from .gpubench_results import CEILING, record

__all__ = ["cmd_classifier", "cmd_decode"]


# ---- decode: (a) in process --------------------------------------------------------------------
def photo_set(args) -> list[bytes]:
    samples = sorted(Path(args.images).glob("*.jpg"))
    if not samples:
        raise SystemExit(f"gpubench: no *.jpg in {args.images}")
    return bench_images.make_image_set(samples)  # ImageNet-size (500x375) JPEGs, each photo and its mirror


def _parity(cpu: np.ndarray, other: np.ndarray, spec) -> dict:
    """How far apart two preprocessed batches are, in uint8 pixel steps (1/255 before the
    mean/std: one step is what one rounding of a pixel value moves)."""
    steps = (np.abs(cpu.astype(np.float32) - other.astype(np.float32))
             * np.asarray(spec.std, np.float32).reshape(-1, 1, 1) / spec.scale)
    return {"max_steps": float(steps.max()), "mean_steps": float(steps.mean()),
            "p99_9_steps": float(np.percentile(steps, 99.9)), "share_over_1_step": float((steps > 1.01).mean())}


def cmd_decode(args) -> int:
    from ..runtime.decode.device import HostDevice
    from ..runtime.decode.torch_device import TorchDevice

    spec, policy = PreprocessSpec(), DecodePolicy()
    images = photo_set(args)
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
                row[f"{path}_images_per_s"] = _rate(lambda: device.decode(batch, policy, spec, False), batch_size, args,
                                                    sync)
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
                                               torch_device.to_host(torch_device.decode(one, full, spec, False).batch),
                                               spec)
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
            "preprocess_only_images_per_s": _rate(lambda: ops.preprocess_batch(decoded, spec, device.device),
                                                  len(datas), args, sync),
            "decode_4_threads_images_per_s": _rate(threaded, len(datas), args, sync),
            "header_us_per_image": 1e6
            / _rate(lambda: [gpu_jpeg(d, DecodePolicy()) for d in datas], len(datas), args, lambda: None),
            "pillow_header_us_per_image": 1e6
            / _rate(lambda: [_pillow_header(d) for d in datas], len(datas), args, lambda: None)}


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
            report["rows"].append({"variant": name, "batch": size, "images_per_s": rate,
                                   "ms_per_batch": 1000 * size / rate})
            print(f"classifier {name} batch {size}: {rate:.0f} img/s")
        model = None  # its GPU memory back before the next variant
        if args.device == "cuda":
            torch.cuda.empty_cache()
    record(args.out, "classifier", report)
    return 0
