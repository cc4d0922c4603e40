"""bls-bench's concurrency sweep: N closed-loop clients per point, each sending one image per
request back to back (run_point), what a point measured (Point), decode+preprocess timed in
process, and the tables, ratios and plot of a sweep.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..base.statistics import COMPUTE, stat
from ..contract import CLASSIFIER_INPUT, CLASSIFIER_OUTPUT, REGION_COUNT, ROUTE
from ..serve.client import tritonclient_module
from ..stages.decode import DecodePolicy, decode
from ..stages.preprocess import PreprocessSpec, preprocess_into
from .bench_targets import (CASCADES, CLASSIFIER, HANDWRITTEN_CALLS, IN_PROCESS, PEER, REGION_TARGETS, SHADOW_TARGET,
                            engine_of, served_model, build_request)
from .loadgen import REFUSERS, TRITON_SUCCESS_COUNTS, model_statistics, outcome_of_exception

__all__ = ["Point", "children_per_image", "markdown", "plot", "ratios", "run_point", "time_preprocess"]

# The decoder's draft mode (DecodePolicy's draft_min_side), timed against a full decode.
DRAFT = DecodePolicy().draft_min_side


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
        out[model] = np.array([int(stats.get("execution_count", 0)), int(stats.get("inference_count", 0)), compute],
                              np.float64)
    return out


def children_per_image(before: dict[str, np.ndarray], after: dict[str, np.ndarray],
                       images: int) -> dict[str, dict[str, float]]:
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
    model = served_model(target, classifier)
    start_gate.wait()
    now = time.perf_counter()
    record_from[0] = now + warmup_s
    time.sleep(warmup_s)
    called = HANDWRITTEN_CALLS if target in REGION_TARGETS else ()
    before = _server_stats(stats_client, protocol, model)
    children_before = _child_counts(stats_client, protocol, called)
    time.sleep(duration_s)
    # The window lasts until every client sent a request in it: one whose requests take
    # longer than the window (a slow model on a busy machine) would leave it empty, 0 images/s.
    while not all(sent) and all(t.is_alive() for t in threads):
        time.sleep(0.005)
    stop_at[0] = time.perf_counter()
    window_s = stop_at[0] - record_from[0]
    after = _server_stats(stats_client, protocol, model)
    children_after = _child_counts(stats_client, protocol, called)
    for t in threads:
        t.join()
    stats_client.close()
    lat = np.array([x for per in latencies for x in per]) * 1e3
    n = max(after["count"] - before["count"], 1)
    pct = np.percentile(lat, [50, 95, 99]) if len(lat) else [float("nan")] * 3
    return Point(target, concurrency, len(lat) / window_s, *map(float, pct), len(lat), sum(errors),
                 (after["queue_ns"] - before["queue_ns"]) / n / 1e6,
                 (after["compute_ns"] - before["compute_ns"]) / n / 1e6,
                 sum(escalated) / len(lat) if target in CASCADES and len(lat) else None,
                 sum(regions) / window_s if target in REGION_TARGETS else None,
                 children_per_image(children_before, children_after, n) if called else None,
                 {who: k for who in REFUSERS if (k := sum(c[who] for c in refused_by))}, error_samples,
                 sum(degraded) / len(lat) if target in CASCADES and len(lat) else None)


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


def top1_with_and_without_draft(onnx_path: Path, data: bytes) -> tuple[int, int] | None:
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


def markdown(points: list[Point], prep: list[dict], meta: dict) -> str:
    images = meta.get("image_set") or f"{meta['images']} JPEGs of 500x375"
    if any(p.regions_per_s is not None for p in points):
        images += f" ({meta.get('pages', 0)} text pages for the region targets)"
    lines = [f"Machine: {meta['machine']}. Versions: {meta['versions']}. Protocol {meta['protocol']}, "
             f"{meta['duration_s']} s per point after {meta['warmup_s']} s warm-up. Images: {images}, one image per "
             "request. "
             + (f"Served: {meta['served']}. " if meta.get("served") else "")
             + f"Each point is the median-throughput one of {meta['rounds']} interleaved rounds.",
             "",
             "| target | concurrency | images/s | p50 ms | p95 ms | p99 ms | errors | of those refused: queue full / "
             "queue timeout / model | server queue ms | server compute ms | escalated (+ degraded) / regions |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in points:
        esc = "" if p.escalated_fraction is None else f"{p.escalated_fraction:.0%}" + (
            f" (+ {p.degraded_fraction:.0%})" if p.degraded_fraction else "")
        esc = esc or ("" if p.regions_per_s is None else f"{p.regions_per_s:.1f} regions/s")
        refused = " / ".join(str(p.refused_by.get(who, 0)) for who in REFUSERS)
        lines.append(f"| {p.target} | {p.concurrency} | {p.images_per_s:.1f} | {p.p50_ms:.1f} | {p.p95_ms:.1f} | "
                     f"{p.p99_ms:.1f} | {p.errors} | {refused} | {p.server_queue_ms:.1f} | {p.server_compute_ms:.1f} | "
                     f"{esc} |")
    lines += ["", "Server queue and compute ms: Triton's statistics, per request it counted a success; "
                  f"{TRITON_SUCCESS_COUNTS}."]
    ratios, per_round = meta.get("ratios", {}), meta.get("ratios_per_round", [])
    if ratios:
        lines += ["",
                  "| ratio (within each round) | median of rounds | "
                  + " | ".join(f"round {r + 1}" for r in range(len(per_round))) + " |",
                  "|---|" + "---:|" * (1 + len(per_round))]
        lines += [f"| {k} | {v:.3f} | " + " | ".join(f"{values[k]:.3f}" for values in per_round) + " |"
                  for k, v in ratios.items()]
    called = [p for p in points if p.children]
    if called:
        lines += ["",
                  "| target | concurrency | model called | executions / image | rows / execution | compute ms / row |",
                  "|---|---:|---|---:|---:|---:|"]
        lines += [f"| {p.target} | {p.concurrency} | {model} | {v['calls_per_image']:.2f} | {v['rows_per_call']:.2f} | "
                  f"{v['compute_ms_per_row']:.1f} |" for p in called for model, v in p.children.items()]
    if prep:
        lines += ["", "| decode+preprocess | draft_min_side | ms/image | ms/image, caches cold |",
                  "|---|---:|---:|---:|"]
        lines += [f"| {r['image']} | {r['draft_min_side'] or 'off (full decode)'} | {r['ms_per_image']:.2f} | "
                  f"{r['ms_per_image_cold_cache']:.2f} |" for r in prep]
    return "\n".join(lines) + "\n"


def ratios(runs: dict[tuple[str, int], list[Point]],
           prep: list[dict]) -> tuple[dict[str, float], list[dict[str, float]]]:
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
        out[f"classify_bls / classifier images/s at c={c8}"] = (by["classify_bls", c8].images_per_s
                                                                / by["classifier", c8].images_per_s)
    for c in conc:
        if ("classify_bls", c) in by and ("ensemble_resnet50", c) in by:
            out[f"classify_bls / ensemble images/s at c={c}"] = (by["classify_bls", c].images_per_s
                                                                 / by["ensemble_resnet50", c].images_per_s)
    c1 = conc[0]
    small = [r for r in prep if r["image"].startswith("500x375") and r["draft_min_side"]]
    if ("classify_bls", c1) in by and ("classifier", c1) in by and small:
        out[f"classify_bls p50 - (classifier p50 + preprocess) ms at c={c1}"] = (
            by["classify_bls", c1].p50_ms - by["classifier", c1].p50_ms - small[0]["ms_per_image"])
    for engine in sorted({m for t, _ in by if (e := engine_of(t)) for m in (e[1],)}):
        bls, alone = f"classify_bls@{engine}", f"classifier@{engine}"
        if (bls, c8) in by and ("classify_bls", c8) in by:
            out[f"{bls} / classify_bls images/s at c={c8}"] = (by[bls, c8].images_per_s
                                                               / by["classify_bls", c8].images_per_s)
        if (bls, c1) in by and ("classify_bls", c1) in by:
            out[f"{bls} p50 / classify_bls p50 at c={c1}"] = by[bls, c1].p50_ms / by["classify_bls", c1].p50_ms
        if (bls, c8) in by and (alone, c8) in by:
            out[f"{bls} / {alone} images/s at c={c8}"] = by[bls, c8].images_per_s / by[alone, c8].images_per_s
        if (alone, c8) in by and ("classifier", c8) in by:
            out[f"{alone} / classifier images/s at c={c8}"] = (by[alone, c8].images_per_s
                                                               / by["classifier", c8].images_per_s)
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
                out[f"{batched} / {single} regions/s at c={c}"] = (by[batched, c].regions_per_s
                                                                   / by[single, c].regions_per_s)
    for name in CASCADES:
        if (name, c8) in by and ("classify_bls", c8) in by:
            ratio = by[name, c8].images_per_s / by["classify_bls", c8].images_per_s
            out[f"{name} / classify_bls (resnet50 only) images/s at c={c8}"] = ratio
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
