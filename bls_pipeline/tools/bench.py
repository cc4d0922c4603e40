"""`bls-bench`: load on classify_bls, its baselines and variants, and what their clients get.

Three modes, against a server bls-bench starts on a copy of the repository (bench_repository:
its targets as variants of the shipped models; --max-queue-size and --set change the copy) or a
running one (--url, --host and the port options):

    the concurrency sweep (default)  for each target and concurrency, N client threads send one
        image per request back to back for a fixed time: images/s, latency p50/p95/p99,
        errors and refusals (by Triton's queue or the model), Triton's server-side queue vs
        compute time per request; bench.json, bench.md, bench.png; also times
        decode+preprocess in process.
    --overload   goodput past capacity, per factor (overload.py): overload.json, overload.md.
    --open-loop  Poisson arrivals below capacity, per load (openloop.py): openloop.json, openloop.md.

The images: by default each photo centre-cropped to 4:3 and resized to 500x375 with its mirror
(the set docs/performance.md's tables were measured with), which bls-bench says per file before
it sends anything and in every table; --image-size original sends the files as given, and
--heavy-images N adds 12-megapixel JPEGs.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from PIL import Image
from tqdm import tqdm

from ..serve.client import tritonclient_module
from ..contract import CLASSIFIER_INPUT, CLASSIFIER_OUTPUT, IMAGE, LABELS, REGION_COUNT, ROUTE
from ..stages.decode import DecodePolicy, decode
from ..stages.preprocess import PreprocessSpec, preprocess_into
from .loadgen import REFUSERS, TRITON_SUCCESS_COUNTS, FinishedCounter, MetricsUnreadable, model_statistics, outcome_of_exception
from ..runtime.load.loader import is_flow_model
from ..base.modelconfig import config_variant, parse_config
from ..base.statistics import COMPUTE, stat
from ..serve.repository import export_hint
from ..serve.paths import checkout, default_models, default_samples, shared_mug
from ..serve.options import ServerOptions, free_port
from ..serve.server import TritonServer

__all__ = ["bench_repository", "build_request", "main", "make_image_set", "run_point", "tensor_set"]

CLASSIFIER = "resnet50_onnx"
TARGETS = ("classifier", "classify_bls", "ensemble_resnet50")
# Cascade variants (efficientnet_lite0 first, unsure images to resnet50) at two thresholds.
DRAFT = DecodePolicy().draft_min_side
CASCADES = {"cascade@0.5": "0.5", "cascade@0.9": "0.9"}
# A classifier engine as a target: "classifier@MODEL" is MODEL fed preprocessed tensors,
# "classify_bls@MODEL" classify_bls with MODEL as its only classifier (e.g. resnet50_int8),
# "classify_peer@MODEL" the same work in one python model that runs MODEL's engine itself, no
# child call (bench_flows/classify_peer/): classify_bls's one-model peer on the same engine;
# "classify_bls_in_process@MODEL" classify_bls@MODEL running MODEL in its own process
# (run_in_process: no BLS hop).
ENGINE_TARGETS = ("classifier", "classify_bls", "classify_peer", "classify_bls_in_process")
PEER = "classify_peer"
IN_PROCESS = "classify_bls_in_process"
# Region flows: read_text, and the same work with one child request per region, served from
# bench_flows/: read_text_per_region, a flow that loops over the lines; read_text_handwritten,
# a python model on pb_utils alone that loops over its requests, then their lines, the way
# hand-written BLS examples call a second-stage model. They read samples/sign.png and
# TEXT_LINES-line pages rendered here, and report regions per second beside images.
REGION_TARGETS = ("read_text", "read_text_per_region", "read_text_handwritten")
BENCH_FLOWS = Path(__file__).resolve().parent / "bench_flows"
PER_REGION_FLOW = BENCH_FLOWS / "read_text_per_region.py"
HANDWRITTEN = "read_text_handwritten"
HANDWRITTEN_CALLS = ("text_detector", "text_orientation", "text_recognizer")  # not a flow: loaded with it by name
TEXT_LINES = (2, 3, 4, 5, 6, 8)
# classify_bls (as the bench serves it) with a 100% shadow of its classifier on a twin of it
# (resnet50_onnx's files under another name): what mirroring every call costs.
SHADOW_TARGET, SHADOW_TWIN = "classify_bls_shadow", f"{CLASSIFIER}_twin"
# classify_bls as the main job serves it, beside the bench's plain classify_bls: the
# repository's config (the cascade on efficientnet in process, resnet50 for the unsure),
# except that a resnet50 exported with random weights is not among its classifiers, as
# bls-demo does not serve one (the unsure images are then answered degraded).
DEFAULT_TARGET = "classify_bls_default"
# The overload mode's targets: classify_bls as shipped, without resnet50 (as the main job
# serves it) and with it (the cascade the README draws, its unsure images escalated), the
# seed ensemble, the one-model peer on classify_bls's default engine.
OVERLOAD_TARGETS = (DEFAULT_TARGET, "cascade@0.5", "ensemble_resnet50", "classify_peer@efficientnet_lite0_onnx")
# The overload mode's clients: with only their own deadline (a gRPC deadline, an HTTP
# client's timeout: what nearly every client sends), or also Triton's `timeout` parameter.
CLIENT_KINDS = ("deadline", "timeout")


@dataclass
class Point:
    target: str
    concurrency: int
    images_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    requests: int
    errors: int  # requests that failed, refused ones included
    # Triton's statistics per request it counted a success (a python model's refusals and
    # errors answered included: loadgen.TRITON_SUCCESS_COUNTS)
    server_queue_ms: float  # per request, this model's own queue
    server_compute_ms: float  # per request, compute input + infer + output
    escalated_fraction: float | None = None  # cascade targets: share of images resnet50 decided
    regions_per_s: float | None = None  # region flows: regions (REGION_COUNT) answered per second
    # region flows: per model they call, executions, rows and compute ms per image answered
    children: dict[str, dict[str, float]] | None = None
    # of the errors, refusals (503 / UNAVAILABLE) by who refused (loadgen.REFUSERS)
    refused_by: dict[str, int] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)
    # cascade targets: share of images the cheap model answered because resnet50 was skipped
    # under overload (ROUTE ...:degraded): unsure, like the escalated ones
    degraded_fraction: float | None = None

    @property
    def refused(self) -> int:
        return sum(self.refused_by.values())


def make_image_set(sources: list[Path], size=(500, 375), quality=90) -> list[bytes]:
    """ImageNet-size JPEGs: each source centre-cropped to 4:3, resized, plus its mirror."""
    out = []
    for src in sources:
        img = _fitted(Image.open(src).convert("RGB"), size)
        for variant in (img, img.transpose(Image.FLIP_LEFT_RIGHT)):
            out.append(_jpeg(variant, quality))
    return out


def _fitted(img: Image.Image, size: tuple[int, int]) -> Image.Image:
    """img centre-cropped to 4:3, then resized to `size`."""
    w, h = img.size
    cw, ch = _crop_4_3(w, h)
    return img.crop(((w - cw) // 2, (h - ch) // 2, (w - cw) // 2 + cw, (h - ch) // 2 + ch)).resize(size, Image.BICUBIC)


def _crop_4_3(w: int, h: int) -> tuple[int, int]:
    return (w, w * 3 // 4) if w * 3 <= h * 4 else (h * 4 // 3, h)


def _jpeg(img: Image.Image, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


# ---- the images bls-bench sends -------------------------------------------------------------
IMAGE_SIZE = (500, 375)  # --image-size's default: the ImageNet-size set docs/performance.md's tables were measured with
ORIGINAL = "original"  # --image-size original: the files as given
HEAVY_SIZE = (4000, 3000)  # --heavy-images: 12-megapixel JPEGs


@dataclass(frozen=True)
class ImageSet:
    """What bls-bench sends: the payloads, a line per file saying what was sent (changed, or
    as given), and one line for the tables."""

    payloads: list[bytes]
    notes: list[str]
    summary: str
    changed: bool  # the files were not sent as given
    sources: list[Path]  # the files Pillow reads, in order


def parse_image_size(text: str) -> tuple[int, int] | None:
    """--image-size: "WxH" (each photo centre-cropped to 4:3 and resized to it, with its mirror)
    or "original" (the files as given): the size, or None for original."""
    if text.strip().lower() == ORIGINAL:
        return None
    w, sep, h = text.lower().partition("x")
    if not sep or not w.strip().isdigit() or not h.strip().isdigit() or int(w) < 1 or int(h) < 1:
        raise ValueError(f"--image-size: {text!r} is neither WxH (e.g. 500x375) nor {ORIGINAL}")
    return int(w), int(h)


def _kb(data: bytes | int) -> str:
    n = data if isinstance(data, int) else len(data)
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 1024:.0f} KB"


def image_set(files: list[Path], size: tuple[int, int] | None = IMAGE_SIZE, heavy: int = 0) -> ImageSet:
    """The images bls-bench sends: `files` as given (size None), or each centre-cropped to 4:3,
    resized to `size` and sent with its mirror (make_image_set); then `heavy` 12-megapixel
    JPEGs, each a readable file scaled up to HEAVY_SIZE. A file Pillow cannot read is sent as
    given only; otherwise it is named in a ValueError."""
    if not files:
        raise ValueError("no images to send: the --images folder has no *.jpg or *.jpeg file")
    payloads, notes, readable = [], [], []
    for path in files:
        data = path.read_bytes()
        try:
            with Image.open(io.BytesIO(data)) as probe:
                w, h, kind = *probe.size, probe.format
        except Exception as exc:  # noqa: BLE001 - any unreadable file is named
            if size is not None:
                raise ValueError(f"{path}: Pillow cannot read it ({exc}), so it cannot be resized; "
                                 f"--image-size {ORIGINAL} sends the files as given") from exc
            payloads.append(data)
            notes.append(f"{path.name}: {_kb(data)}, not an image Pillow reads: sent as given")
            continue
        readable.append(path)
        if size is None:
            payloads.append(data)
            notes.append(f"{path.name}: {w}x{h} {kind}, {_kb(data)}: sent as given")
            continue
        pair = make_image_set([path], size)
        payloads += pair
        cw, ch = _crop_4_3(w, h)
        crop = f"centre-cropped to {cw}x{ch} (4:3), " if (cw, ch) != (w, h) else ""
        notes.append(f"{path.name}: {w}x{h} {kind}, {_kb(data)} -> {crop}resized to {size[0]}x{size[1]}, "
                     f"re-encoded as JPEG quality 90 ({_kb(pair[0])}), sent with its mirror")
    if heavy and not readable:
        raise ValueError("--heavy-images: none of the files is an image Pillow reads, to scale up")
    for k in range(heavy):
        src = readable[k % len(readable)]
        data = _synthetic_12mp(src)
        payloads.append(data)
        notes.append(f"heavy {k + 1}: {HEAVY_SIZE[0]}x{HEAVY_SIZE[1]} JPEG ({HEAVY_SIZE[0] * HEAVY_SIZE[1] / 1e6:.0f} megapixels), "
                     f"{_kb(data)}: {src.name} scaled up (--heavy-images)")
    folder = files[0].parent
    these = f"the {len(files)} files of {folder}" if len(files) > 1 else f"{files[0]}"
    if size is None:
        summary = f"{these} as given (--image-size {ORIGINAL})"
    else:
        summary = (f"{len(payloads) - heavy} JPEGs of {size[0]}x{size[1]}: {these} centre-cropped "
                   f"to 4:3 and resized, each with its mirror (--image-size {size[0]}x{size[1]}: not the files as given)")
    if heavy:
        summary += f", and {heavy} heavy {HEAVY_SIZE[0]}x{HEAVY_SIZE[1]} JPEG{'s' if heavy > 1 else ''} (--heavy-images)"
    return ImageSet(payloads, notes, summary, size is not None, readable)


def announce(images: ImageSet, size: tuple[int, int] | None) -> str:
    """What bls-bench prints before it sends anything: what it does to the files, per file."""
    if images.changed:
        head = (f"bls-bench sends CHANGED images, not the files as given (--image-size {size[0]}x{size[1]}, the default, "
                f"as docs/performance.md's tables were measured); --image-size {ORIGINAL} sends the files as they are:")
    else:
        head = "bls-bench sends the files as given:"
    return "\n".join([head, *(f"  {note}" for note in images.notes)])


def text_image_set(lines: tuple[int, ...] = TEXT_LINES, size=(500, 375)) -> list[bytes]:
    """Pages of dark words on light paper, one per entry of `lines` with that many lines, the
    last line of every other page upside down (read_text turns it round). Deterministic PNGs."""
    from PIL import ImageDraw, ImageFont

    words = ("TRITON", "BATCHED", "REGIONS", "PIPELINE", "SERVING", "FLOW", "DETECT", "READ", "ORIENT", "CROP")
    pages = []
    for n, count in enumerate(lines):
        height = size[1] // (count + 1)
        font = ImageFont.load_default(size=max(14, min(32, int(height * 0.6))))
        page = Image.new("RGB", size, (236, 232, 220))
        for i in range(count):
            text = f"{words[(n + i) % len(words)]} {100 + 7 * n + i}"
            line = Image.new("RGB", (size[0] - 40, height - 4), (236, 232, 220))
            ImageDraw.Draw(line).text((4, 2), text, fill=(20, 20, 30), font=font)
            if n % 2 and i == count - 1:
                line = line.rotate(180)
            page.paste(line, (20, 10 + i * height))
        buf = io.BytesIO()
        page.save(buf, "PNG")
        pages.append(buf.getvalue())
    return pages


def region_pages(samples: Path | None) -> list[bytes]:
    """What the region targets read: samples/sign.png (3 lines, one upside down) when there
    is one, then text_image_set()'s pages."""
    sign = samples / "sign.png" if samples is not None else None
    return ([sign.read_bytes()] if sign is not None and sign.is_file() else []) + text_image_set()


def tensor_set(images: list[bytes]) -> list[np.ndarray]:
    spec = PreprocessSpec()
    tensors = []
    for data in images:
        t = np.empty((1, *spec.input_shape), np.float32)
        preprocess_into(decode(data), spec, t[0])
        tensors.append(t)
    return tensors


def _engine(target: str) -> tuple[str, str] | None:
    """("classifier" or "classify_bls", MODEL) for an engine target, else None."""
    kind, _, model = target.partition("@")
    return (kind, model) if model and kind in ENGINE_TARGETS else None


def _model(target: str, classifier: str = CLASSIFIER) -> str:
    if target == "classifier":
        return classifier
    engine = _engine(target)
    if engine is not None:
        return engine[1] if engine[0] == "classifier" else f"{engine[0]}__{engine[1]}"
    if target in CASCADES:
        return "classify_bls_cascade_" + CASCADES[target].replace(".", "")
    return target


def build_request(tc, target: str, payload, classifier: str = CLASSIFIER) -> tuple[str, list, list]:
    """Model name, inputs and outputs for one request, built once and reused. The
    "classifier" target is `classifier` fed preprocessed tensors."""
    if _fed_tensors(target):
        inp = tc.InferInput(CLASSIFIER_INPUT.name, list(payload.shape), "FP32")
        inp.set_data_from_numpy(payload)
        return _model(target, classifier), [inp], [tc.InferRequestedOutput(CLASSIFIER_OUTPUT.name)]
    inp = tc.InferInput(IMAGE.name, [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[payload]], dtype=object))
    outputs = [tc.InferRequestedOutput(LABELS.name)]
    if target in CASCADES:
        outputs.append(tc.InferRequestedOutput(ROUTE.name))
    if target in REGION_TARGETS:
        outputs = [tc.InferRequestedOutput(REGION_COUNT.name)]
    return _model(target), [inp], outputs


def _fed_tensors(target: str) -> bool:
    return target == "classifier" or (_engine(target) or ("",))[0] == "classifier"


def _server_stats(client, protocol: str, model: str) -> dict[str, int]:
    stats = model_statistics(client, protocol, model)["model_stats"][0]["inference_stats"]
    compute = sum(stat(stats, k, "ns") for k in COMPUTE)
    return {"count": stat(stats, "success"), "queue_ns": stat(stats, "queue", "ns"), "compute_ns": compute}


def _child_counts(client, protocol: str, models: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Per model: executions, inferences (rows), compute ns so far (Triton's statistics)."""
    out = {}
    for model in models:
        stats = model_statistics(client, protocol, model)["model_stats"][0]
        compute = sum(stat(stats["inference_stats"], k, "ns") for k in COMPUTE)
        out[model] = np.array([int(stats.get("execution_count", 0)), int(stats.get("inference_count", 0)), compute], np.float64)
    return out


def children_per_image(before: dict[str, np.ndarray], after: dict[str, np.ndarray], images: int) -> dict[str, dict[str, float]]:
    """Each called model's executions per image the target answered, rows per execution and
    compute ms per row. The last two are its own counters' ratios; the first compares them
    with the target's, so requests in flight at the window's ends blur it (long windows)."""
    out = {}
    for model in before:
        calls, rows, ns = after[model] - before[model]
        out[model] = {"calls_per_image": float(calls / max(images, 1)), "rows_per_call": float(rows / max(calls, 1)),
                      "compute_ms_per_row": float(ns / 1e6 / max(rows, 1))}
    return out


def run_point(url: str, protocol: str, target: str, concurrency: int, payloads: list, duration_s: float,
              warmup_s: float, classifier: str = CLASSIFIER) -> Point:
    tc = tritonclient_module(protocol)
    stop_at = [float("inf")]
    record_from = [float("inf")]
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    refused_by = [Counter() for _ in range(concurrency)]
    error_samples: list[str] = []
    escalated = [0] * concurrency
    degraded = [0] * concurrency
    regions = [0] * concurrency
    sent = [0] * concurrency  # requests each client sent in the measured window
    start_gate = threading.Barrier(concurrency + 1)

    def worker(w: int) -> None:
        client = tc.InferenceServerClient(url)
        requests = [build_request(tc, target, p, classifier) for p in payloads]
        i = w
        start_gate.wait()
        while True:
            model, inputs, outputs = requests[i % len(requests)]
            i += 1
            t0 = time.perf_counter()
            if t0 >= stop_at[0]:
                break
            if t0 >= record_from[0]:
                sent[w] += 1
            try:
                result = client.infer(model, inputs, outputs=outputs)
                ok = True
            except Exception as exc:  # noqa: BLE001 - counted, the loop goes on
                ok, outcome = False, outcome_of_exception(exc)
            if t0 >= record_from[0]:
                if ok:
                    latencies[w].append(time.perf_counter() - t0)
                    route = result.as_numpy(ROUTE.name)[0, 0] if len(outputs) > 1 else b""
                    escalated[w] += route.endswith(b":escalated")
                    degraded[w] += route.endswith(b":degraded")
                    if target in REGION_TARGETS:
                        regions[w] += int(result.as_numpy(REGION_COUNT.name).sum())
                else:
                    errors[w] += 1
                    if outcome.startswith("refused: "):
                        refused_by[w][outcome.removeprefix("refused: ")] += 1
                    elif len(error_samples) < 3:
                        error_samples.append(outcome)
        client.close()

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(concurrency)]
    for t in threads:
        t.start()
    stats_client = tc.InferenceServerClient(url)
    model = _model(target, classifier)
    start_gate.wait()
    now = time.perf_counter()
    record_from[0] = now + warmup_s
    time.sleep(warmup_s)
    called = HANDWRITTEN_CALLS if target in REGION_TARGETS else ()
    before, children_before = _server_stats(stats_client, protocol, model), _child_counts(stats_client, protocol, called)
    time.sleep(duration_s)
    # The window lasts until every client sent a request in it: one whose requests take
    # longer than the window (a slow model on a busy machine) would leave it empty, 0 images/s.
    while not all(sent) and all(t.is_alive() for t in threads):
        time.sleep(0.005)
    stop_at[0] = time.perf_counter()
    window_s = stop_at[0] - record_from[0]
    after, children_after = _server_stats(stats_client, protocol, model), _child_counts(stats_client, protocol, called)
    for t in threads:
        t.join()
    stats_client.close()
    lat = np.array([x for per in latencies for x in per]) * 1e3
    n = max(after["count"] - before["count"], 1)
    pct = np.percentile(lat, [50, 95, 99]) if len(lat) else [float("nan")] * 3
    return Point(target, concurrency, len(lat) / window_s, *map(float, pct), len(lat), sum(errors),
                 (after["queue_ns"] - before["queue_ns"]) / n / 1e6, (after["compute_ns"] - before["compute_ns"]) / n / 1e6,
                 sum(escalated) / len(lat) if target in CASCADES and len(lat) else None,
                 sum(regions) / window_s if target in REGION_TARGETS else None,
                 children_per_image(children_before, children_after, n) if called else None,
                 {who: k for who in REFUSERS if (k := sum(c[who] for c in refused_by))}, error_samples,
                 sum(degraded) / len(lat) if target in CASCADES and len(lat) else None)


# ---- in-process decode + preprocess --------------------------------------------------
def time_preprocess(images: dict[str, bytes], repeats: int = 20) -> list[dict]:
    """Median ms per image, caches warm (back to back) and cold: before each cold run a
    64 MB sweep evicts them, as resnet50's ~100 MB of weights do between two requests in
    the server, where classify_bls decodes on the cores onnxruntime just used."""
    spec = PreprocessSpec()
    out = np.empty(spec.input_shape, np.float32)
    sweep = np.zeros(8 * 2**20)  # 64 MB of float64
    rows = []
    for name, data in images.items():
        for draft in (DRAFT, 0):
            policy = DecodePolicy(draft_min_side=draft)
            times: dict[bool, list[float]] = {False: [], True: []}
            for cold in (False, True) * repeats:
                if cold:
                    sweep += 1.0
                t0 = time.perf_counter()
                preprocess_into(decode(data, policy), spec, out)
                times[cold].append(time.perf_counter() - t0)
            rows.append({"image": name, "draft_min_side": draft, "ms_per_image": float(np.median(times[False]) * 1e3),
                         "ms_per_image_cold_cache": float(np.median(times[True]) * 1e3)})
    return rows


def _top1_with_and_without_draft(onnx_path: Path, data: bytes) -> tuple[int, int] | None:
    if not onnx_path.exists():
        return None
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    spec = PreprocessSpec()
    batch = np.empty((2, *spec.input_shape), np.float32)
    preprocess_into(decode(data, DecodePolicy(draft_min_side=DRAFT)), spec, batch[0])
    preprocess_into(decode(data, DecodePolicy(draft_min_side=0)), spec, batch[1])
    top = session.run([CLASSIFIER_OUTPUT.name], {CLASSIFIER_INPUT.name: batch})[0].argmax(axis=1)
    return int(top[0]), int(top[1])


# ---- reporting --------------------------------------------------------------------------
def markdown(points: list[Point], prep: list[dict], meta: dict) -> str:
    images = meta.get("image_set") or f"{meta['images']} JPEGs of 500x375"
    if any(p.regions_per_s is not None for p in points):
        images += f" ({meta.get('pages', 0)} text pages for the region targets)"
    lines = [f"Machine: {meta['machine']}. Versions: {meta['versions']}. Protocol {meta['protocol']}, "
             f"{meta['duration_s']} s per point after {meta['warmup_s']} s warm-up. Images: {images}, one image per request. "
             + (f"Served: {meta['served']}. " if meta.get("served") else "")
             + f"Each point is the median-throughput one of {meta['rounds']} interleaved rounds.",
             "", "| target | concurrency | images/s | p50 ms | p95 ms | p99 ms | errors | of those refused: queue full / queue timeout / model "
             "| server queue ms | server compute ms | escalated (+ degraded) / regions |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in points:
        esc = "" if p.escalated_fraction is None else f"{p.escalated_fraction:.0%}" + (
            f" (+ {p.degraded_fraction:.0%})" if p.degraded_fraction else "")
        esc = esc or ("" if p.regions_per_s is None else f"{p.regions_per_s:.1f} regions/s")
        refused = " / ".join(str(p.refused_by.get(who, 0)) for who in REFUSERS)
        lines.append(f"| {p.target} | {p.concurrency} | {p.images_per_s:.1f} | {p.p50_ms:.1f} | {p.p95_ms:.1f} | {p.p99_ms:.1f} | "
                     f"{p.errors} | {refused} | {p.server_queue_ms:.1f} | {p.server_compute_ms:.1f} | {esc} |")
    lines += ["", "Server queue and compute ms: Triton's statistics, per request it counted a success; "
                  f"{TRITON_SUCCESS_COUNTS}."]
    ratios, per_round = meta.get("ratios", {}), meta.get("ratios_per_round", [])
    if ratios:
        lines += ["", "| ratio (within each round) | median of rounds | " + " | ".join(f"round {r + 1}" for r in range(len(per_round))) + " |",
                  "|---|" + "---:|" * (1 + len(per_round))]
        lines += [f"| {k} | {v:.3f} | " + " | ".join(f"{values[k]:.3f}" for values in per_round) + " |" for k, v in ratios.items()]
    called = [p for p in points if p.children]
    if called:
        lines += ["", "| target | concurrency | model called | executions / image | rows / execution | compute ms / row |",
                  "|---|---:|---|---:|---:|---:|"]
        lines += [f"| {p.target} | {p.concurrency} | {model} | {v['calls_per_image']:.2f} | {v['rows_per_call']:.2f} | "
                  f"{v['compute_ms_per_row']:.1f} |" for p in called for model, v in p.children.items()]
    if prep:
        lines += ["", "| decode+preprocess | draft_min_side | ms/image | ms/image, caches cold |", "|---|---:|---:|---:|"]
        lines += [f"| {r['image']} | {r['draft_min_side'] or 'off (full decode)'} | {r['ms_per_image']:.2f} | "
                  f"{r['ms_per_image_cold_cache']:.2f} |" for r in prep]
    return "\n".join(lines) + "\n"


def ratios(runs: dict[tuple[str, int], list[Point]], prep: list[dict]) -> tuple[dict[str, float], list[dict[str, float]]]:
    """The issue's ratios, each taken within one round (its two points were measured a few
    seconds apart, so slow drift on a shared machine cancels): the median over rounds, and
    every round's own values."""
    rounds = min(len(pts) for pts in runs.values())
    per_round = [_round_ratios({key: pts[r] for key, pts in runs.items()}, prep) for r in range(rounds)]
    return {name: float(np.median([values[name] for values in per_round])) for name in per_round[0]}, per_round


def _round_ratios(by: dict[tuple[str, int], Point], prep: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    conc = sorted({c for _, c in by})
    c8 = 8 if 8 in conc else conc[-1]
    if ("classify_bls", c8) in by and ("classifier", c8) in by:
        out[f"classify_bls / classifier images/s at c={c8}"] = by["classify_bls", c8].images_per_s / by["classifier", c8].images_per_s
    for c in conc:
        if ("classify_bls", c) in by and ("ensemble_resnet50", c) in by:
            out[f"classify_bls / ensemble images/s at c={c}"] = by["classify_bls", c].images_per_s / by["ensemble_resnet50", c].images_per_s
    c1 = conc[0]
    small = [r for r in prep if r["image"].startswith("500x375") and r["draft_min_side"]]
    if ("classify_bls", c1) in by and ("classifier", c1) in by and small:
        out[f"classify_bls p50 - (classifier p50 + preprocess) ms at c={c1}"] = (
            by["classify_bls", c1].p50_ms - by["classifier", c1].p50_ms - small[0]["ms_per_image"])
    for engine in sorted({m for t, _ in by if (e := _engine(t)) for m in (e[1],)}):
        bls, alone = f"classify_bls@{engine}", f"classifier@{engine}"
        if (bls, c8) in by and ("classify_bls", c8) in by:
            out[f"{bls} / classify_bls images/s at c={c8}"] = by[bls, c8].images_per_s / by["classify_bls", c8].images_per_s
        if (bls, c1) in by and ("classify_bls", c1) in by:
            out[f"{bls} p50 / classify_bls p50 at c={c1}"] = by[bls, c1].p50_ms / by["classify_bls", c1].p50_ms
        if (bls, c8) in by and (alone, c8) in by:
            out[f"{bls} / {alone} images/s at c={c8}"] = by[bls, c8].images_per_s / by[alone, c8].images_per_s
        if (alone, c8) in by and ("classifier", c8) in by:
            out[f"{alone} / classifier images/s at c={c8}"] = by[alone, c8].images_per_s / by["classifier", c8].images_per_s
        bls = "classify_bls" if engine == CLASSIFIER and (bls, c1) not in by else bls  # the FP32 peer's classify_bls
        for flow in (bls, f"{IN_PROCESS}@{engine}"):
            for c in conc:
                if (flow, c) in by and (f"{PEER}@{engine}", c) in by:
                    peer = by[f"{PEER}@{engine}", c]
                    out[f"{flow} / {PEER}@{engine} images/s at c={c}"] = by[flow, c].images_per_s / peer.images_per_s
                    if c == c1:
                        out[f"{flow} - {PEER}@{engine} p50 ms at c={c}"] = by[flow, c].p50_ms - peer.p50_ms
    for c in conc:
        if (SHADOW_TARGET, c) in by and ("classify_bls", c) in by:
            on, off = by[SHADOW_TARGET, c], by["classify_bls", c]
            out[f"{SHADOW_TARGET} / classify_bls images/s at c={c}"] = on.images_per_s / off.images_per_s
            out[f"{SHADOW_TARGET} - classify_bls p50 ms at c={c}"] = on.p50_ms - off.p50_ms
            out[f"{SHADOW_TARGET} - classify_bls p99 ms at c={c}"] = on.p99_ms - off.p99_ms
    batched, *singles = REGION_TARGETS
    for single in singles:
        for c in conc:
            if (batched, c) in by and (single, c) in by and by[single, c].regions_per_s:
                out[f"{batched} / {single} regions/s at c={c}"] = by[batched, c].regions_per_s / by[single, c].regions_per_s
    for name in CASCADES:
        if (name, c8) in by and ("classify_bls", c8) in by:
            out[f"{name} / classify_bls (resnet50 only) images/s at c={c8}"] = by[name, c8].images_per_s / by["classify_bls", c8].images_per_s
    big = {r["draft_min_side"]: r["ms_per_image"] for r in prep if r["image"].startswith("12MP")}
    if len(big) == 2:
        out["12MP full decode / draft decode time"] = big[0] / big[DRAFT]
    return out


def plot(points: list[Point], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for target in dict.fromkeys(p.target for p in points):
        pts = [p for p in points if p.target == target]
        a.plot([p.concurrency for p in pts], [p.images_per_s for p in pts], marker="o", label=target)
        b.plot([p.concurrency for p in pts], [p.p99_ms for p in pts], marker="o", label=target)
    for ax, title in ((a, "throughput (images/s)"), (b, "p99 latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")), platform.processor())
    from importlib.metadata import version

    versions = ", ".join(f"{p} {version(p)}" for p in ("nvidia-pytriton", "onnxruntime", "torch", "pillow", "numpy"))
    return {"machine": f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}", "versions": versions}


def bench_repository(src: Path, dst: Path, keep_branches: bool, engines: tuple[str, ...] = (),
                     shadow_share: float = 1.0, peers: tuple[str, ...] = (), in_process: tuple[str, ...] = ()) -> None:
    """A copy of models/ for the bench (artifacts linked, not copied); by default the
    flip branch is off so classify_bls does the same work as the branch-less ensemble.
    Each of `engines` gets a classify_bls__ENGINE: classify_bls with that classifier alone;
    each of `peers` a classify_peer__ENGINE: the one-model peer running that classifier's engine;
    each of `in_process` a classify_bls_in_process__ENGINE: classify_bls__ENGINE running it in process."""
    artifacts = ("*.onnx", "*.onnx.data", "*.plan", "*.xml", "*.bin")
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(*artifacts, "__pycache__"))
    for artifact in [a for pattern in artifacts for a in src.glob(f"*/1/{pattern}")]:
        (dst / artifact.relative_to(src)).symlink_to(artifact.resolve())
    bls = src / "classify_bls"
    for threshold in CASCADES.values():
        name = "classify_bls_cascade_" + threshold.replace(".", "")
        if (dst / name).exists():  # the source had one of that name: the bench's own replaces it
            shutil.rmtree(dst / name)
        (dst / name).mkdir()
        (dst / name / "1").symlink_to((dst / "classify_bls" / "1").resolve())
        (dst / name / "config.pbtxt").write_text(config_variant(bls, name, {"cascade_threshold": threshold, "tta_threshold": "0"}))
    for kind, engine in [("classify_bls", e) for e in engines] + [(IN_PROCESS, e) for e in in_process]:
        name = f"{kind}__{engine}"
        (dst / name).mkdir()
        (dst / name / "1").symlink_to((dst / "classify_bls" / "1").resolve())
        (dst / name / "config.pbtxt").write_text(config_variant(bls, name, {
            "classifiers": engine, "cascade_classifiers": "none", "run_in_process": engine if kind == IN_PROCESS else "none",
            **({} if keep_branches else {"tta_threshold": "0"})}))
    for engine in peers:
        name = f"{PEER}__{engine}"
        (dst / name / "1").mkdir(parents=True)
        shutil.copy(BENCH_FLOWS / PEER / "model.py", dst / name / "1" / "model.py")
        (dst / name / "config.pbtxt").write_text(config_variant(BENCH_FLOWS / PEER, name, {"engine": engine}))
    if (src / "read_text").is_dir():  # the per-region baseline: read_text's config, its own flow
        name = "read_text_per_region"
        if (dst / name).exists():
            shutil.rmtree(dst / name)
        (dst / name / "1").mkdir(parents=True)
        # read_text's flow with the per-region read_lines after it (it replaces read_text's)
        (dst / name / "1" / "flow.py").write_text((src / "read_text" / "1" / "flow.py").read_text() + "\n"
                                                  + PER_REGION_FLOW.read_text())
        shutil.copy(src / "read_text" / "1" / "model.py", dst / name / "1" / "model.py")
        (dst / name / "config.pbtxt").write_text(config_variant(src / "read_text", name, {}))
        # the hand-written baseline: a plain python model, its own config (read_text's values)
        if (dst / HANDWRITTEN).exists():
            shutil.rmtree(dst / HANDWRITTEN)
        (dst / HANDWRITTEN / "1").mkdir(parents=True)
        shutil.copy(BENCH_FLOWS / HANDWRITTEN / "model.py", dst / HANDWRITTEN / "1" / "model.py")
        shutil.copy(BENCH_FLOWS / HANDWRITTEN / "config.pbtxt", dst / HANDWRITTEN / "config.pbtxt")
    if (dst / DEFAULT_TARGET).exists():
        shutil.rmtree(dst / DEFAULT_TARGET)
    (dst / DEFAULT_TARGET).mkdir()
    (dst / DEFAULT_TARGET / "1").symlink_to((dst / "classify_bls" / "1").resolve())
    (dst / DEFAULT_TARGET / "config.pbtxt").write_text(config_variant(bls, DEFAULT_TARGET, _as_served(src, bls)))
    # resnet50 alone on FP32 onnxruntime, the ensemble's classifier (not the first engine built),
    # and without keep_branches no flip pass: the same work as the ensemble.
    plain = {"cascade_classifiers": "none", "classifiers": CLASSIFIER, **({} if keep_branches else {"tta_threshold": "0"})}
    (dst / "classify_bls" / "config.pbtxt").write_text(config_variant(bls, "classify_bls", plain))
    for name in (SHADOW_TWIN, SHADOW_TARGET):
        if (dst / name).exists():
            shutil.rmtree(dst / name)
        (dst / name).mkdir()
    (dst / SHADOW_TWIN / "1").symlink_to((dst / CLASSIFIER / "1").resolve())
    shutil.copy(dst / CLASSIFIER / "labels.txt", dst / SHADOW_TWIN / "labels.txt")
    (dst / SHADOW_TWIN / "config.pbtxt").write_text(config_variant(src / CLASSIFIER, SHADOW_TWIN, {}))
    (dst / SHADOW_TARGET / "1").symlink_to((dst / "classify_bls" / "1").resolve())
    (dst / SHADOW_TARGET / "config.pbtxt").write_text(
        config_variant(bls, SHADOW_TARGET, {**plain, "shadow": f"{CLASSIFIER}={SHADOW_TWIN}", "shadow_share": f"{shadow_share:g}"}))


def _as_served(repo: Path, flow: Path) -> dict[str, str]:
    """classify_bls's `classifiers` as the main job serves them: without the resnet50 models
    when resnet50_onnx was exported with random weights (a test export, which bls-demo does
    not serve); a model no CPU server loads stands in when none is left."""
    from engine_build.export_onnx import exported_weights

    if exported_weights(repo / CLASSIFIER / "1" / "model.onnx") != "random":
        return {}
    from ..runtime.load.loader import flow_settings

    kept = [m for m in flow_settings(flow)[1].classifiers if not m.startswith("resnet50_")]
    return {"classifiers": ",".join(kept) or "resnet50_trt"}


# ---- the server: a running one, or one bls-bench starts ------------------------------------------
# A running server's ports where none is given: Triton's own (8000, 8001, 8002), as ServerOptions has them.
PORT_DEFAULTS = {what: ServerOptions.__dataclass_fields__[f"{what}_port"].default for what in ("http", "grpc", "metrics")}


@dataclass(frozen=True)
class Endpoints:
    """Where a server answers: HOST:PORT for each protocol's tritonclient, and its metrics URL."""

    http: str
    grpc: str
    metrics: str

    def url(self, protocol: str) -> str:
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be 'http' or 'grpc', got {protocol!r}")
        return self.http if protocol == "http" else self.grpc


def running_endpoints(url: str | None, host: str | None, ports: dict[str, int | None], metrics_url: str | None,
                      protocol: str) -> Endpoints | None:
    """The running server that --url or --host names; None for neither (bls-bench starts one).
    --url HOST:PORT is --protocol's endpoint (HOST alone: every port from the options); the
    other protocol and the metrics are on the same host at --http-port, --grpc-port and
    --metrics-port (`ports`; Triton's 8000, 8001, 8002 where None), or at --metrics-url."""
    if url is None and host is None:
        return None
    ports = dict(ports)
    if url is not None:
        if "/" in url:
            raise ValueError(f"--url: give HOST:PORT, as tritonclient takes it (e.g. 127.0.0.1:8001), not {url!r}")
        url_host, sep, port = url.rpartition(":")
        url_host, port = (url_host, port) if sep else (url, "")
        if port and not port.isdigit():
            raise ValueError(f"--url: {url!r} has no port number after its host")
        if host is not None and host != url_host:
            raise ValueError(f"--url {url} and --host {host} name two hosts: give one")
        if port and ports.get(protocol) not in (None, int(port)):
            raise ValueError(f"--url {url} and --{protocol}-port {ports[protocol]} name two {protocol} ports: give one")
        if port:
            ports[protocol] = int(port)
        host = url_host
    ports = {what: ports.get(what) or default for what, default in PORT_DEFAULTS.items()}
    return Endpoints(f"{host}:{ports['http']}", f"{host}:{ports['grpc']}",
                     metrics_url or f"http://{host}:{ports['metrics']}/metrics")


def _check_ready(endpoints: Endpoints, protocols: list[str], models: dict[str, str]) -> None:
    """Every target's model (`models`: target -> model) READY on the running server, over each
    protocol the run uses; else a SystemExit naming what is not."""
    from ..serve.client import tritonclient_module

    for protocol in protocols:
        url = endpoints.url(protocol)
        client = tritonclient_module(protocol).InferenceServerClient(url)
        try:
            missing = {t: m for t, m in models.items() if not client.is_model_ready(m)}
        except Exception as exc:  # noqa: BLE001 - any failure to reach it is named
            raise SystemExit(f"bls-bench: cannot reach the server's {protocol} endpoint at {url} ({exc}); "
                             "give its ports: --http-port, --grpc-port (and --metrics-port)") from exc
        finally:
            client.close()
        if missing:
            raise SystemExit(f"bls-bench: the server at {url} has no READY model for: "
                             + ", ".join(f"{t} ({m})" for t, m in missing.items()))


# ---- the repository bls-bench serves: another queue bound, other settings ------------------------
def parse_setting(text: str) -> tuple[str, str, str]:
    """--set MODEL.PARAMETER=VALUE: (MODEL, PARAMETER, VALUE); MODEL may be a target (cascade@0.5)."""
    left, eq, value = text.partition("=")
    model, dot, key = left.rpartition(".")
    if not (eq and dot and model and key):
        raise ValueError(f"--set: {text!r} is not MODEL.PARAMETER=VALUE (e.g. classify_bls.latency_target_ms=0)")
    return model, key, value


def _classify_bls_family(dst: Path) -> list[str]:
    """classify_bls and every model of the copy that runs its code (its 1/ is classify_bls's)."""
    own = (dst / "classify_bls" / "1").resolve()
    return sorted(d.name for d in dst.iterdir()
                  if d.name == "classify_bls" or ((d / "1").is_symlink() and (d / "1").resolve() == own))


def _edit_config(model_dir: Path, max_queue_size: int | None = None, params: dict[str, str] | None = None) -> None:
    config = parse_config(model_dir)
    if max_queue_size is not None:
        if not config.HasField("dynamic_batching"):
            raise ValueError(f"--max-queue-size: {config.name} has no dynamic batcher, so no queue to bound")
        config.dynamic_batching.default_queue_policy.max_queue_size = max_queue_size
    for key, value in (params or {}).items():
        config.parameters[key].string_value = value
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))


def serve_with(dst: Path, max_queue_size: int | None = None, settings: list[tuple[str, str, str]] = ()) -> None:
    """--max-queue-size and --set on bench_repository()'s copy. The bound goes to classify_bls's
    dynamic batcher (default_queue_policy), every variant of it and every one-model peer (they
    batch as classify_bls does); MODEL.PARAMETER=VALUE to that model, or with MODEL classify_bls,
    to it and every variant of it. A MODEL not in the copy is a ValueError."""
    family = _classify_bls_family(dst)
    if max_queue_size is not None:
        for name in family + sorted(d.name for d in dst.iterdir() if d.name.startswith(f"{PEER}__")):
            _edit_config(dst / name, max_queue_size=max_queue_size)
    for model, key, value in settings:
        name = _model(model)
        if not (dst / name / "config.pbtxt").is_file():
            raise ValueError(f"--set {model}.{key}={value}: the repository bls-bench serves has no model {name}")
        for each in family if name == "classify_bls" else [name]:
            _edit_config(dst / each, params={key: value})


def queue_bound(model_dir: Path) -> str:
    """The queue bound a model's config gives Triton's dynamic batcher, in words."""
    config = parse_config(model_dir)
    if not config.HasField("dynamic_batching"):
        return "no dynamic batcher"
    size = config.dynamic_batching.default_queue_policy.max_queue_size
    return f"max_queue_size {size}" if size else "max_queue_size 0 (unbounded)"


def served_description(dst: Path, targets: list[str], max_queue_size: int | None, settings: list[tuple[str, str, str]]) -> str:
    """Which queue bound (and --set parameters) each target's model was served with."""
    bounds = [f"{t} with {queue_bound(dst / _model(t))}" for t in targets if (dst / _model(t) / "config.pbtxt").is_file()]
    text = "bls-bench's own server: " + ", ".join(bounds)
    text += " (--max-queue-size)" if max_queue_size is not None else " (as the repository configures it)"
    if settings:
        text += "; " + ", ".join(f"{m}.{k}={v}" for m, k, v in settings) + " (--set)"
    return text


RUNNING_SERVED = "a running server, with its own config (its queue bounds are not read here)"


# ---- the command ------------------------------------------------------------------------------
OPEN_LOOP_TARGETS = (DEFAULT_TARGET,)
DEFAULT_DEADLINE_S = {"overload": 0.5, "open_loop": 2.0}


def _floats(option: str, text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(not v > 0 for v in values):
        raise ValueError(f"{option}: {text!r} is not a comma-separated list of numbers above 0")
    return values


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bls-bench", description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="1,2,4,8,16,32", help="comma-separated sweep: closed-loop clients per point")
    p.add_argument("--duration", type=float, default=15.0,
                   help="seconds measured per point (longer until every client sent a request in them); with --open-loop, "
                        "per load")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds per point (with --open-loop, per load) before measuring")
    p.add_argument("--targets", default=None,
                   help=f"any of {', '.join(TARGETS + tuple(CASCADES))}, classifier@MODEL, classify_bls@MODEL or {PEER}@MODEL "
                        "for a classifier MODEL of the repository (e.g. resnet50_int8), or any flow model in the repository "
                        f"(as it is configured); default {','.join(TARGETS)} (--overload: {','.join(OVERLOAD_TARGETS)}; "
                        f"--open-loop: {','.join(OPEN_LOOP_TARGETS)})")
    p.add_argument("--rounds", type=int, default=1, help="measure each point this many times (interleaved); report the median")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc", help="the concurrency sweep's protocol")
    p.add_argument("--model-repository", type=Path, default=default_models(), help="default: ./models or the checkout's")
    p.add_argument("--images", type=Path, default=default_samples(),
                   help="folder of JPEG photos, *.jpg and *.jpeg (default: the checkout's samples/)")
    p.add_argument("--image-size", default=f"{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}",
                   help=f"WxH: each photo centre-cropped to 4:3, resized to WxH and re-encoded, sent with its mirror (default "
                        f"{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}, as docs/performance.md's tables were measured); {ORIGINAL}: the "
                        "files as given. bls-bench says per file what it sends.")
    p.add_argument("--heavy-images", type=int, default=0, metavar="N",
                   help=f"add N heavy {HEAVY_SIZE[0]}x{HEAVY_SIZE[1]} (12-megapixel) JPEGs to the images sent, each a photo "
                        "scaled up (every mode)")
    p.add_argument("--keep-branches", action="store_true", help="keep classify_bls's tta_threshold (default: 0, like the ensemble)")
    p.add_argument("--shadow-share", type=float, default=1.0, help=f"the {SHADOW_TARGET} target's shadow_share")
    p.add_argument("--out", type=Path, default=(checkout() or Path(".")) / "bench_results")
    server = p.add_argument_group(
        "the server: without --url or --host bls-bench starts one on a copy of --model-repository (on loopback, on the ports "
        "given, free ports otherwise)")
    server.add_argument("--url", help="use a running server (its own config) instead of starting one: HOST:PORT of --protocol's "
                                      "endpoint (HOST alone: the ports below)")
    server.add_argument("--host", help="use a running server on HOST instead of starting one, at the ports below")
    server.add_argument("--http-port", type=int, help=f"HTTP port (a running server's: default {PORT_DEFAULTS['http']})")
    server.add_argument("--grpc-port", type=int, help=f"gRPC port (a running server's: default {PORT_DEFAULTS['grpc']})")
    server.add_argument("--metrics-port", type=int,
                        help=f"metrics port, where the flows' own counts are read (a running server's: default "
                             f"{PORT_DEFAULTS['metrics']})")
    server.add_argument("--metrics-url", help="a running server's metrics URL, if not http://HOST:METRICS_PORT/metrics")
    server.add_argument("--max-queue-size", type=int, metavar="N",
                        help="serve classify_bls, every variant of it and the one-model peers with this queue bound "
                             "(dynamic_batching default_queue_policy max_queue_size; 0: unbounded) in bls-bench's copy")
    server.add_argument("--set", action="append", default=[], metavar="MODEL.PARAMETER=VALUE", dest="set",
                        help="a parameter of MODEL (a model or target; classify_bls: it and every variant of it) in "
                             "bls-bench's copy, e.g. classify_bls.latency_target_ms=0; may repeat")
    load = p.add_argument_group(
        "overload (--overload) and open-loop (--open-loop) modes: asyncio clients in one thread, each target over each protocol "
        "and client kind in turn; --concurrency and --rounds do not apply")
    load.add_argument("--overload", action="store_true",
                      help="measure goodput past capacity (bls_pipeline/tools/overload.py): capacity, then a spike of clients "
                           "with deadlines per --factor, then recovery")
    load.add_argument("--open-loop", metavar="LOADS",
                      help="measure below capacity (bls_pipeline/tools/openloop.py): capacity, then Poisson arrivals at each "
                           "of these fractions of it, e.g. 0.5,0.8,0.95, --duration seconds each")
    load.add_argument("--protocols", default="grpc,http", help="the protocols to measure, in turn")
    load.add_argument("--deadline", type=float, default=None,
                      help=f"each request's deadline, seconds (default: --overload {DEFAULT_DEADLINE_S['overload']}, --open-loop "
                           f"{DEFAULT_DEADLINE_S['open_loop']}); over gRPC the call's deadline, over HTTP the client's timeout")
    load.add_argument("--clients", default=None,
                      help="the client kinds, each in turn: deadline (only their own: a gRPC deadline, an HTTP client's "
                           f"timeout), timeout (also Triton's timeout request parameter); default: --overload "
                           f"{','.join(CLIENT_KINDS)}, --open-loop deadline")
    load.add_argument("--capacity-clients", type=int, default=8, help="closed-loop clients that measure capacity (and recovery)")
    load.add_argument("--capacity-duration", type=float, default=10.0, help="seconds measured for capacity")
    load.add_argument("--capacity", type=float, metavar="REQUESTS_PER_S",
                      help="open loop: take this capacity instead of measuring it (the same arrival rates across servers)")
    load.add_argument("--factor", default="4", help="overload: clients = factor x capacity x deadline; several: 4,8 (a row each)")
    load.add_argument("--spike", type=float, default=30.0, help="overload: seconds of each spike")
    load.add_argument("--recovery", type=float, default=10.0, help="overload: seconds watched after each spike")
    load.add_argument("--no-timeout-parameter", action="store_true", help="overload: the same as --clients deadline")
    return p


def _parsed(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The options, with their lists parsed and checked (p.error on a bad one)."""
    args = p.parse_args(argv)
    mode = "overload" if args.overload else "open_loop" if args.open_loop else None
    args.mode = mode
    try:
        if args.overload and args.open_loop:
            raise ValueError("--overload and --open-loop are two runs: give one")
        args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
        default = {"overload": OVERLOAD_TARGETS, "open_loop": OPEN_LOOP_TARGETS}.get(mode, TARGETS)
        args.targets = [t for t in (args.targets or ",".join(default)).split(",") if t]
        args.size = parse_image_size(args.image_size)
        if args.heavy_images < 0:
            raise ValueError(f"--heavy-images: {args.heavy_images} is below 0")
        args.factors = _floats("--factor", args.factor)
        args.loads = _floats("--open-loop", args.open_loop) if args.open_loop else []
        args.settings = [parse_setting(s) for s in args.set]
        args.running = running_endpoints(args.url, args.host, {"http": args.http_port, "grpc": args.grpc_port,
                                                               "metrics": args.metrics_port}, args.metrics_url, args.protocol)
        if args.running is None and args.metrics_url:
            raise ValueError("--metrics-url is a running server's (with --url or --host); bls-bench knows its own server's")
        if args.running is not None and (args.max_queue_size is not None or args.settings):
            raise ValueError("--max-queue-size and --set change bls-bench's own copy of the repository: not with --url or --host")
        if args.max_queue_size is not None and args.max_queue_size < 0:
            raise ValueError(f"--max-queue-size: {args.max_queue_size} is below 0 (0: unbounded)")
        if args.capacity is not None and mode != "open_loop":
            raise ValueError("--capacity is for --open-loop")
        args.protocol_list = [x for x in args.protocols.split(",") if x] if mode else [args.protocol]
        if set(args.protocol_list) - {"grpc", "http"}:
            raise ValueError(f"--protocols: {args.protocols!r}; use grpc, http or grpc,http")
        kinds = "deadline" if args.no_timeout_parameter or (mode == "open_loop" and args.clients is None) else args.clients
        args.kinds = [k for k in (kinds or ",".join(CLIENT_KINDS)).split(",") if k]
        if set(args.kinds) - set(CLIENT_KINDS):
            raise ValueError(f"--clients: unknown kind(s) {sorted(set(args.kinds) - set(CLIENT_KINDS))}; use {','.join(CLIENT_KINDS)}")
        if args.deadline is None and mode:
            args.deadline = DEFAULT_DEADLINE_S[mode]
    except ValueError as exc:
        p.error(str(exc))
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """bls-bench's options, parsed and checked (what main runs with)."""
    return _parsed(_parser(), argv)


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = _parsed(p, argv)
    targets = args.targets
    if args.model_repository is None or args.images is None:
        p.error("give --model-repository DIR and --images DIR (no checkout's models/ and samples/ here)")
    flows = sorted(d.name for d in args.model_repository.iterdir() if is_flow_model(d))
    engines = tuple(sorted({e[1] for t in targets if (e := _engine(t))}))
    peers = tuple(sorted({e[1] for t in targets if (e := _engine(t)) and e[0] == PEER}))
    in_process = tuple(sorted({e[1] for t in targets if (e := _engine(t)) and e[0] == IN_PROCESS}))
    bad = sorted(set(targets) - set(TARGETS) - set(CASCADES) - set(flows) - set(REGION_TARGETS) - {SHADOW_TARGET, DEFAULT_TARGET}
                 - {t for t in targets if (e := _engine(t)) and (args.model_repository / e[1] / "config.pbtxt").is_file()})
    if bad:
        p.error(f"unknown targets {bad}; choose from {', '.join(TARGETS + tuple(CASCADES))} or a flow model ({', '.join(flows)})")
    files = sorted(f for f in args.images.iterdir() if f.suffix.lower() in (".jpg", ".jpeg") and f.is_file())
    try:
        images = image_set(files, args.size, args.heavy_images)
    except ValueError as exc:
        p.error(str(exc))
    print(announce(images, args.size), file=sys.stderr)
    points: list[Point] = []
    runs: dict[tuple[str, int], list[Point]] = {}
    server = None
    workdir = None
    endpoints = args.running
    served = RUNNING_SERVED
    try:
        if endpoints is None:
            workdir = Path(tempfile.mkdtemp(prefix="bls-bench-"))
            repo = workdir / "models"
            bench_repository(args.model_repository, repo, args.keep_branches, engines, args.shadow_share, peers, in_process)
            try:
                serve_with(repo, args.max_queue_size, args.settings)
            except ValueError as exc:
                p.error(str(exc))
            served = served_description(repo, targets, args.max_queue_size, args.settings)
            needed = {_model(t) for t in targets} | (set(HANDWRITTEN_CALLS) if HANDWRITTEN in targets else set())
            if any(_model(t).startswith("classify_bls") and _engine(t) is None and t != DEFAULT_TARGET for t in targets):
                needed.add(CLASSIFIER)  # the bench's flows call it: without it, their answers are degraded
            needed = tuple(sorted(needed))
            server = TritonServer(ServerOptions(repo, http_port=args.http_port or free_port(), grpc_port=args.grpc_port or free_port(),
                                               metrics_port=args.metrics_port or free_port(),
                                               log_file=workdir / "tritonserver.log", models=needed))
            missing = server.not_loaded(needed)  # before any work
            if missing and set(missing) & set(engines):
                p.error(f"cannot benchmark without {missing}: build the engines first "
                        "(python -m engine_build int8 --help, python -m engine_build openvino --help)")
            if missing:
                p.error(f"cannot benchmark without {', '.join(missing)} ({missing}); random resnet50 weights will do: "
                        + export_hint("resnet50_onnx", weights="random"))
        if not args.mode:  # the sweep's own inputs, before the server starts
            if not images.sources:
                p.error("none of the files is an image Pillow reads: the sweep times decode+preprocess on one")
            try:
                tensors = tensor_set(images.payloads) if any(_fed_tensors(t) for t in targets) else []
            except Exception as exc:  # noqa: BLE001 - a file sent as given that does not decode
                p.error(f"the classifier targets are sent decoded tensors, and an image does not decode ({exc}): "
                        "leave them out, or the files that are no images")
            pages = region_pages(default_samples())
            big = shared_mug()
            big_bytes = big.read_bytes() if big else _synthetic_12mp(images.sources[0])
            small = make_image_set(images.sources[:1])[0]
            prep = time_preprocess({"500x375 JPEG": small,
                                    "12MP JPEG (3361x2521)" if big else "12MP JPEG (synthetic 4000x3000)": big_bytes})
            top1 = _top1_with_and_without_draft(args.model_repository / CLASSIFIER / "1" / "model.onnx", big_bytes)
        if server is not None:
            server.start()
            endpoints = Endpoints(server.http_url, server.grpc_url, server.metrics_url)
        else:
            _check_ready(endpoints, args.protocol_list, {t: _model(t) for t in targets})
        print(f"bls-bench serves: {served}; HTTP {endpoints.http}, gRPC {endpoints.grpc}, metrics {endpoints.metrics}",
              file=sys.stderr)
        context = {"image_set": images.summary, "image_notes": images.notes, "served": served, "endpoints": asdict(endpoints)}
        if args.mode:
            # A flow's answers are read from its own count on the metrics port, with --url as
            # without: checked here, before any load, so a wrong port fails at once.
            known = {t: True if _model(t) in flows or _model(t).startswith("classify_bls") else None for t in targets}
            try:
                is_flow = {t: FinishedCounter.for_model(_model(t), endpoints.metrics, endpoints.url(args.protocol_list[0]),
                                                        args.protocol_list[0], known[t]).by_flow for t in targets}
            except MetricsUnreadable as exc:
                raise SystemExit(f"bls-bench: {exc}") from exc
            run = _overload if args.overload else _open_loop
            return run(args, targets, images.payloads, endpoints, server, is_flow, context)
        url = endpoints.url(args.protocol)
        # Interleaved (every target at one concurrency, then the next; rounds outermost):
        # drift on a shared machine hits every target alike.
        grid = [(r, t, c) for r in range(args.rounds) for c in args.concurrency for t in targets]
        for _, target, c in tqdm(grid, desc="bench", unit="point"):
            payloads = tensors if _fed_tensors(target) else pages if target in REGION_TARGETS else images.payloads
            runs.setdefault((target, c), []).append(run_point(url, args.protocol, target, c, payloads, args.duration, args.warmup))
        points = [sorted(rs, key=lambda pt: pt.images_per_s)[len(rs) // 2] for rs in runs.values()]
    finally:
        if server is not None:
            server.stop()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    points.sort(key=lambda pt: (targets.index(pt.target), pt.concurrency))
    meta = {**_machine(), "protocol": args.protocol, "duration_s": args.duration, "warmup_s": args.warmup,
            "images": len(images.payloads), **context, "pages": len(pages), "rounds": args.rounds,
            "keep_branches": args.keep_branches, "shadow_share": args.shadow_share, "top1_12mp_draft_vs_full": top1}
    meta["ratios"], meta["ratios_per_round"] = ratios(runs, prep)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps({"meta": meta, "points": [asdict(pt) for pt in points], "preprocess": prep}, indent=2))
    table = markdown(points, prep, meta)
    if top1 is not None:
        table += f"\n12MP top-1 class with draft decode: {top1[0]}, with full decode: {top1[1]} ({'unchanged' if top1[0] == top1[1] else 'CHANGED'}).\n"
    (args.out / "bench.md").write_text(table)
    plot(points, args.out / "bench.png")
    print(table)
    print(f"wrote {args.out}/bench.json, bench.md, bench.png")
    return 0


def _load_grid(args, targets: list[str]) -> list[tuple[str, str, str]]:
    return [(t, proto, kind) for proto in args.protocol_list for kind in args.kinds for t in targets]


def _overload(args, targets: list[str], payloads: list[bytes], endpoints: Endpoints, server, is_flow: dict[str, bool],
              context: dict) -> int:
    """--overload: each target over each protocol and client kind in turn, one server
    (bls_pipeline/tools/overload.py); each factor a row."""
    from . import overload

    results = []
    meta = {**_machine(), **context, "deadline_s": args.deadline, "factor": args.factors[0], "factors": args.factors,
            "capacity_clients": args.capacity_clients, "capacity_s": args.capacity_duration, "spike_s": args.spike,
            "recovery_s": args.recovery}
    for target, protocol, kind in tqdm(_load_grid(args, targets), desc="overload", unit="target"):
        results += overload.run_factors(
            endpoints.url(protocol), protocol, target, _model(target), payloads, output=LABELS.name, is_flow=is_flow[target],
            metrics_url=endpoints.metrics, deadline_s=args.deadline, factors=tuple(args.factors),
            capacity_clients=args.capacity_clients, capacity_s=args.capacity_duration, spike_s=args.spike,
            recovery_s=args.recovery, warmup_s=args.warmup, timeout_parameter=kind == "timeout")
        args.out.mkdir(parents=True, exist_ok=True)  # after each target: what ran is on disk if a later one fails
        (args.out / "overload.json").write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=2))
    if server is not None:  # the stop after the spikes, as an operator's SIGTERM would find the server
        start = time.monotonic()
        code = server.stop()
        meta["stop"] = {"seconds": round(time.monotonic() - start, 2), "exit_code": code, "drained": server.last_stop.drained}
        (args.out / "overload.json").write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=2))
    table = overload.markdown(results, meta)
    (args.out / "overload.md").write_text(table)
    print(table)
    print(f"wrote {args.out}/overload.json, overload.md")
    return 0


def _open_loop(args, targets: list[str], payloads: list[bytes], endpoints: Endpoints, server, is_flow: dict[str, bool],
               context: dict) -> int:
    """--open-loop: each target over each protocol and client kind in turn, one server
    (bls_pipeline/tools/openloop.py); each load a row."""
    from . import openloop

    results = []
    capacity = (f"{args.capacity:g} requests/s, as given (--capacity)" if args.capacity is not None else
                f"measured first per target, protocol and client kind: {args.capacity_clients} closed-loop clients, no deadline, "
                f"{args.capacity_duration} s after {args.warmup} s")
    meta = {**_machine(), **context, "capacity": capacity, "loads": args.loads, "deadline_s": args.deadline,
            "duration_s": args.duration, "warmup_s": args.warmup}
    for target, protocol, kind in tqdm(_load_grid(args, targets), desc="open loop", unit="target"):
        results += openloop.run_target(
            endpoints.url(protocol), protocol, target, _model(target), payloads, output=LABELS.name, loads=tuple(args.loads),
            is_flow=is_flow[target], metrics_url=endpoints.metrics, deadline_s=args.deadline, duration_s=args.duration,
            warmup_s=args.warmup, capacity_clients=args.capacity_clients, capacity_s=args.capacity_duration,
            capacity=args.capacity, timeout_parameter=kind == "timeout")
        args.out.mkdir(parents=True, exist_ok=True)  # after each target: what ran is on disk if a later one fails
        (args.out / "openloop.json").write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=2))
    table = openloop.markdown(results, meta)
    (args.out / "openloop.md").write_text(table)
    print(table)
    print(f"wrote {args.out}/openloop.json, openloop.md")
    return 0


def _synthetic_12mp(src: Path) -> bytes:
    buf = io.BytesIO()
    Image.open(src).convert("RGB").resize(HEAVY_SIZE, Image.BICUBIC).save(buf, "JPEG", quality=90)
    return buf.getvalue()


# ---- for tools that measure bls-bench's targets another way (bls-perf compare) ----------
def served_model(target: str) -> str:
    """The model that `target`'s requests go to in bench_repository()'s copy."""
    return _model(target)


def repository_for(targets: list[str], src: Path, dst: Path) -> None:
    """bench_repository(src, dst) with the variants `targets` need, as bls-bench makes it."""
    engines = tuple(sorted({e[1] for t in targets if (e := _engine(t))}))
    peers = tuple(sorted({e[1] for t in targets if (e := _engine(t)) and e[0] == PEER}))
    in_process = tuple(sorted({e[1] for t in targets if (e := _engine(t)) and e[0] == IN_PROCESS}))
    bench_repository(src, dst, False, engines, 1.0, peers, in_process)
