"""gpubench's results on disk: each step merges what it measured into DIR/results.json and
rewrites DIR/summary.md from all of them (the models measured are named here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from . import bench_sweep

__all__ = ["CEILING", "CPU_FLOW", "GPU_FLOW", "fail", "load", "record", "summary"]

CEILING = "resnet50_torch"
GPU_FLOW, CPU_FLOW = "classify_bls_gpu", "classify_bls_cpu"
RESULTS, SUMMARY = "results.json", "summary.md"


# ---- results on disk ---------------------------------------------------------------------
def load(out: Path) -> dict:
    path = out / RESULTS
    return json.loads(path.read_text()) if path.exists() else {}


def record(out: Path, section: str, data) -> None:
    """Merge one step's results into out/results.json and rewrite out/summary.md."""
    out.mkdir(parents=True, exist_ok=True)
    results = load(out)
    results[section] = data
    (out / RESULTS).write_text(json.dumps(results, indent=2, default=str))
    (out / SUMMARY).write_text(summary(results))


def fail(out: Path, section: str, message: str) -> int:
    record(out, section, {"ok": False, "error": message})
    print(f"gpubench {section}: FAILED: {message}", file=sys.stderr)
    return 1


# ---- summary.md ---------------------------------------------------------------------------------
def summary(results: dict) -> str:
    lines = ["# GPU path: checks and measurements", "", "Written by `python -m bls_pipeline.tools.gpubench` "
             "(scripts/gpu/run.sh); every number below was measured in this run. results.json holds all of them.", ""]
    env = results.get("env")
    if env:
        lines += ["## Machine", "",
                  f"- Python {env.get('python')}, {env.get('cores')} cores; numpy {env.get('numpy')}; torch "
                  f"{env.get('torch')}; torchvision {env.get('torchvision')}; onnxruntime {env.get('onnxruntime')}",
                  f"- GPUs (nvidia-smi): {env.get('gpus')}; torch CUDA: {env.get('cuda')}",
                  f"- TensorRT: {env.get('tensorrt')}",
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
                  f"{decode['target_images_per_s']} img/s.", "",
                  "| batch | GPU path img/s | CPU path img/s | GPU / CPU |", "|---:|---:|---:|---:|"]
        lines += [f"| {r['batch']} | {r['gpu_path_images_per_s']:.0f} | {r['cpu_path_images_per_s']:.0f} | "
                  f"{r['gpu_over_cpu']:.2f} |"
                  for r in decode["rows"]]
        split = [r for r in decode["rows"] if "decode_only_images_per_s" in r]
        if split:
            lines += ["", "Where the GPU path's time goes (img/s of each part alone; header reading in µs per image, "
                      "the marker walk the path uses against Pillow's reading):", "",
                      "| batch | JPEG decode | preprocess | decode on 4 threads at once | header µs | Pillow header µs "
                      "|", "|---:|---:|---:|---:|---:|---:|"]
            lines += [f"| {r['batch']} | {r['decode_only_images_per_s']:.0f} | {r['preprocess_only_images_per_s']:.0f} "
                      f"| {r['decode_4_threads_images_per_s']:.0f} | {r.get('header_us_per_image', float('nan')):.1f} "
                      f"| {r.get('pillow_header_us_per_image', float('nan')):.1f} |" for r in split]
        regions = decode.get("regions")
        if regions:
            lines += ["",
                      f"Regions: {regions['regions_per_image']} boxes on each of {regions['images']} decoded images, "
                      "cut, resized and normalised into one batch:", "",
                      "| spec | GPU regions/s | CPU regions/s | GPU / CPU |", "|---|---:|---:|---:|"]
            lines += [f"| {name} | {r['gpu_regions_per_s']:.0f} | {r['cpu_regions_per_s']:.0f} | "
                      f"{r['gpu_over_cpu']:.1f} |"
                      for name, r in regions.items() if isinstance(r, dict)]
        for key, what in (("parity", "as the CPU path runs"),
                          ("parity_full_decode", "CPU path without its JPEG draft decode")):
            p = decode.get(key)
            if p:
                lines.append(f"\nParity ({what}), in uint8 steps: max {p['max_steps']:.2f}, mean "
                             f"{p['mean_steps']:.3f}, 99.9th percentile {p['p99_9_steps']:.2f}, over one step "
                             f"{p['share_over_1_step']:.2%}.")
        lines.append("")
    classifier = results.get("classifier")
    if classifier and classifier.get("rows"):
        lines += ["## resnet50_torch in process", "", f"On {classifier['device']}; load (with warm-up or capture): "
                  + ", ".join(f"{k} {v:.1f} s" for k, v in classifier["load_s"].items()) + ".", "",
                  "| variant | batch | images/s | ms per batch |", "|---|---:|---:|---:|"]
        lines += [f"| {r['variant']} | {r['batch']} | {r['images_per_s']:.0f} | {r['ms_per_batch']:.2f} |"
                  for r in classifier["rows"]]
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
