"""bls-bench's ratios: taken within each round, then the median over rounds; the repository
copy it serves (no server starts here: what it would load is read from the copy)."""

import shutil
from dataclasses import replace
from pathlib import Path

from bls_pipeline.runtime.modelconfig import parse_config, string_parameters
from bls_pipeline.serve.repository import plan_loading
from bls_pipeline.tools.bench import CASCADES, SHADOW_TARGET, SHADOW_TWIN, TARGETS, TEXT_LINES, Point, _model, bench_repository, ratios, text_image_set

MODELS = Path(__file__).resolve().parents[2] / "models"


def _point(target: str, c: int, images_per_s: float, p50_ms: float = 30.0) -> Point:
    return Point(target, c, images_per_s, p50_ms, p50_ms, p50_ms, 100, 0, 0.0, p50_ms)


def test_ratios_pair_points_of_the_same_round():
    # Round 2 is slow for everyone (drift): its pair still compares like with like.
    rounds = [(40, 45, 41, 30, 25), (20, 21, 19, 60, 55), (38, 46, 39, 31, 26)]
    runs = {}
    for bls, cls, ens, bls_p50, cls_p50 in rounds:
        for c in (1, 8):
            runs.setdefault(("classify_bls", c), []).append(_point("classify_bls", c, bls, bls_p50))
            runs.setdefault(("classifier", c), []).append(_point("classifier", c, cls, cls_p50))
            runs.setdefault(("ensemble_resnet50", c), []).append(_point("ensemble_resnet50", c, ens))
    prep = [{"image": "500x375 JPEG", "draft_min_side": 256, "ms_per_image": 1.5, "ms_per_image_cold_cache": 2.0}]
    median, per_round = ratios(runs, prep)
    assert [round(r["classify_bls / classifier images/s at c=8"], 4) for r in per_round] == [round(40 / 45, 4), round(20 / 21, 4), round(38 / 46, 4)]
    assert median["classify_bls / classifier images/s at c=8"] == sorted([40 / 45, 20 / 21, 38 / 46])[1]
    assert median["classify_bls / ensemble images/s at c=1"] == sorted([40 / 41, 20 / 19, 38 / 39])[1]
    assert median["classify_bls p50 - (classifier p50 + preprocess) ms at c=1"] == 5.0 - 1.5 + 0.0


def test_the_bench_repository_serves_every_target(tmp_path):
    src = tmp_path / "models"
    shutil.copytree(MODELS, src, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.onnx.json", "*.plan", "*.xml", "*.bin", "*.xml.json", "__pycache__"))
    for onnx in src.glob("*_onnx"):
        (onnx / "1" / "model.onnx").write_bytes(b"an export")
    dst = tmp_path / "bench" / "models"
    bench_repository(src, dst, keep_branches=False)

    needed = tuple(sorted({_model(t) for t in TARGETS + tuple(CASCADES) + (SHADOW_TARGET,)}))
    plan = plan_loading(dst, {"python"}, only=needed)
    assert set(needed) | {SHADOW_TWIN} <= set(plan.load), plan.skipped  # the shadow's twin loads with it
    params = {name: string_parameters(parse_config(dst / name)) for name in needed if name.startswith("classify_bls")}
    # classify_bls does the ensemble's work (resnet50 alone, no flip pass); the cascades keep
    # efficientnet_lite0 first, at their own thresholds.
    assert (params["classify_bls"]["cascade_classifiers"], params["classify_bls"]["tta_threshold"]) == ("none", "0")
    for target, threshold in CASCADES.items():
        cascade = params[_model(target)]
        assert (cascade["cascade_threshold"], cascade["tta_threshold"]) == (threshold, "0")
        assert cascade["cascade_classifiers"] != "none"
    assert (dst / "resnet50_onnx" / "1" / "model.onnx").read_bytes() == b"an export"  # linked, not re-exported
    shadow = params[SHADOW_TARGET]
    assert (shadow["shadow"], shadow["shadow_share"]) == (f"resnet50_onnx={SHADOW_TWIN}", "1")
    assert {k: v for k, v in shadow.items() if not k.startswith("shadow")} == params["classify_bls"]


def test_region_targets_compare_regions_per_second_within_a_round():
    runs = {}
    for batched, single in ((120.0, 40.0), (60.0, 30.0)):  # round 2 slow for both
        for c in (1, 8):
            runs.setdefault(("read_text", c), []).append(replace(_point("read_text", c, batched / 4), regions_per_s=batched))
            runs.setdefault(("read_text_per_region", c), []).append(
                replace(_point("read_text_per_region", c, single / 4), regions_per_s=single))
    _, per_round = ratios(runs, [])
    assert [r["read_text / read_text_per_region regions/s at c=8"] for r in per_round] == [3.0, 2.0]


def test_the_bench_repository_has_the_per_region_baseline_beside_read_text(tmp_path):
    src = tmp_path / "models"
    shutil.copytree(MODELS, src, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.plan", "__pycache__"))
    dst = tmp_path / "bench" / "models"
    bench_repository(src, dst, keep_branches=False)
    baseline = dst / "read_text_per_region"
    assert string_parameters(parse_config(baseline)) == string_parameters(parse_config(src / "read_text"))
    assert parse_config(baseline).name == "read_text_per_region"
    assert "one child request per region" in (baseline / "1" / "flow.py").read_text()


def test_the_text_pages_are_deterministic_pngs():
    first, second = text_image_set(), text_image_set()
    assert first == second and len(first) == len(TEXT_LINES)
    assert all(page.startswith(b"\x89PNG") for page in first)
