"""bls-bench's ratios: taken within each round, then the median over rounds; the repository
copy it serves (no server starts here: what it would load is read from the copy)."""

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np

from bls_pipeline.base.modelconfig import parse_config, string_parameters
from bls_pipeline.serve.repository import plan_loading
from bls_pipeline.tools.bench_targets import (CASCADES, HANDWRITTEN, HANDWRITTEN_CALLS, SHADOW_TARGET, SHADOW_TWIN,
                                              TARGETS, served_model, bench_repository)
from bls_pipeline.tools.bench_images import TEXT_LINES, region_pages, text_image_set
from bls_pipeline.tools.bench_sweep import Point, children_per_image, ratios

MODELS = Path(__file__).resolve().parents[2] / "models"
SAMPLES = MODELS.parent / "samples"


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
    assert ([round(r["classify_bls / classifier images/s at c=8"], 4) for r in per_round]
            == [round(40 / 45, 4), round(20 / 21, 4), round(38 / 46, 4)])
    assert median["classify_bls / classifier images/s at c=8"] == sorted([40 / 45, 20 / 21, 38 / 46])[1]
    assert median["classify_bls / ensemble images/s at c=1"] == sorted([40 / 41, 20 / 19, 38 / 39])[1]
    assert median["classify_bls p50 - (classifier p50 + preprocess) ms at c=1"] == 5.0 - 1.5 + 0.0


def test_the_bench_repository_serves_every_target(tmp_path):
    src = tmp_path / "models"
    shutil.copytree(MODELS, src,
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.onnx.json", "*.plan", "*.xml", "*.bin",
                                                  "*.xml.json", "__pycache__"))
    for onnx in src.glob("*_onnx"):
        (onnx / "1" / "model.onnx").write_bytes(b"an export")
    dst = tmp_path / "bench" / "models"
    bench_repository(src, dst, keep_branches=False)

    needed = tuple(sorted({served_model(t) for t in TARGETS + tuple(CASCADES) + (SHADOW_TARGET,)}))
    plan = plan_loading(dst, {"python"}, only=needed)
    assert set(needed) | {SHADOW_TWIN} <= set(plan.load), plan.skipped  # the shadow's twin loads with it
    params = {name: string_parameters(parse_config(dst / name)) for name in needed if name.startswith("classify_bls")}
    # classify_bls does the ensemble's work (resnet50 alone, no flip pass); the cascades keep
    # efficientnet_lite0 first, at their own thresholds.
    assert (params["classify_bls"]["cascade_classifiers"], params["classify_bls"]["tta_threshold"]) == ("none", "0")
    for target, threshold in CASCADES.items():
        cascade = params[served_model(target)]
        assert (cascade["cascade_threshold"], cascade["tta_threshold"]) == (threshold, "0")
        assert "cascade_classifiers" not in cascade  # the flow's own: efficientnet_lite0 first
    assert (dst / "resnet50_onnx" / "1" / "model.onnx").read_bytes() == b"an export"  # linked, not re-exported
    shadow = params[SHADOW_TARGET]
    assert (shadow["shadow"], shadow["shadow_share"]) == (f"resnet50_onnx={SHADOW_TWIN}", "1")
    assert {k: v for k, v in shadow.items() if not k.startswith("shadow")} == params["classify_bls"]


def test_region_targets_compare_regions_per_second_within_a_round():
    runs = {}
    for batched, single in ((120.0, 40.0), (60.0, 30.0)):  # round 2 slow for both
        for c in (1, 8):
            runs.setdefault(("read_text", c), []).append(replace(_point("read_text", c, batched / 4),
                                                                 regions_per_s=batched))
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


def test_read_text_is_compared_with_each_per_region_baseline_within_a_round():
    runs = {}
    for batched, flow_loop, handwritten in ((120.0, 40.0, 60.0), (60.0, 30.0, 20.0)):  # round 2 slow for all
        for target, regions in (("read_text", batched), ("read_text_per_region", flow_loop),
                                (HANDWRITTEN, handwritten)):
            runs.setdefault((target, 8), []).append(replace(_point(target, 8, regions / 4), regions_per_s=regions))
    median, per_round = ratios(runs, [])
    assert [r[f"read_text / {HANDWRITTEN} regions/s at c=8"] for r in per_round] == [2.0, 3.0]
    assert median[f"read_text / {HANDWRITTEN} regions/s at c=8"] == 2.5
    assert [r["read_text / read_text_per_region regions/s at c=8"] for r in per_round] == [3.0, 2.0]


def test_the_handwritten_baseline_is_served_with_read_texts_batching_and_thresholds(tmp_path):
    src = tmp_path / "models"
    shutil.copytree(MODELS, src, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.plan", "__pycache__"))
    for model in HANDWRITTEN_CALLS:  # what bls-serve looks for before it loads them
        (src / model / "1" / "model.onnx").write_bytes(b"a build")
    dst = tmp_path / "bench" / "models"
    bench_repository(src, dst, keep_branches=False)
    ours, theirs = parse_config(dst / HANDWRITTEN), parse_config(src / "read_text")
    assert ours.name == HANDWRITTEN
    assert (ours.max_batch_size, ours.dynamic_batching, list(ours.instance_group)) == (
        theirs.max_batch_size, theirs.dynamic_batching, list(theirs.instance_group))
    mine = string_parameters(ours)
    assert {"min_height", "min_box_score", "flip_threshold", "min_confidence", "draft_min_side"} == set(mine)
    from bls_pipeline.runtime.load.loader import flow_settings

    # read_text's as it loads them: its flow's defaults, its config
    runtime, settings = flow_settings(src / "read_text")
    assert {k: float(v) for k, v in mine.items()} == {**{k: getattr(settings, k) for k in mine
                                                         if k != "draft_min_side"},
                                                      "draft_min_side": runtime.decode.draft_min_side}
    outputs = {o.name: o for o in theirs.output}
    assert all(o == outputs[o.name] for o in ours.output) and [i.name for i in ours.input] == ["IMAGE"]
    source = (dst / HANDWRITTEN / "1" / "model.py").read_text()
    # pb_utils alone, no flow runtime
    assert "pb_utils.InferenceRequest(" in source and "bls_pipeline.flow" not in source
    plan = plan_loading(dst, {"python"}, only=(HANDWRITTEN, *HANDWRITTEN_CALLS))
    assert {HANDWRITTEN, *HANDWRITTEN_CALLS} <= set(plan.load), plan.skipped


def test_the_region_pages_start_with_the_sign():
    pages = region_pages(SAMPLES)
    assert pages[0] == (SAMPLES / "sign.png").read_bytes() and pages[1:] == text_image_set()
    assert region_pages(None) == text_image_set()


def test_children_are_counted_per_image_answered():
    before = {"text_recognizer": np.array([10.0, 40.0, 2e9])}
    after = {"text_recognizer": np.array([30.0, 140.0, 4e9])}
    assert children_per_image(before, after, 20) == {
        "text_recognizer": {"calls_per_image": 1.0, "rows_per_call": 5.0, "compute_ms_per_row": 20.0}}


def test_the_one_model_peer_runs_the_same_engine_and_is_compared_within_a_round(tmp_path):
    from bls_pipeline.tools.bench_targets import PEER

    src = tmp_path / "models"
    shutil.copytree(MODELS, src,
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.json", "*.xml", "*.bin", "__pycache__"))
    bench_repository(src, tmp_path / "bench", keep_branches=False, engines=("resnet50_int8",), peers=("resnet50_int8",))
    name = served_model(f"{PEER}@resnet50_int8")
    assert name == f"{PEER}__resnet50_int8" and (tmp_path / "bench" / name / "1" / "model.py").is_file()
    config = parse_config(tmp_path / "bench" / name)
    assert string_parameters(config)["engine"] == "resnet50_int8" and config.name == name
    bls = parse_config(MODELS / "classify_bls")  # the peer queues, batches and scales as classify_bls does
    assert ((config.max_batch_size, config.instance_group, config.dynamic_batching)
            == (bls.max_batch_size, bls.instance_group, bls.dynamic_batching))
    runs = {(t, c): [_point(t, c, ips * (2 if c == 8 else 1), p50)]
            for t, ips, p50 in (("classify_bls", 20, 50), (f"{PEER}@resnet50_onnx", 25, 45),
                                ("classify_bls@resnet50_int8", 60, 18),
                                (f"{PEER}@resnet50_int8", 50, 16)) for c in (1, 8)}
    median, _ = ratios(runs, [])
    assert median[f"classify_bls@resnet50_int8 / {PEER}@resnet50_int8 images/s at c=8"] == 60 / 50
    assert median[f"classify_bls@resnet50_int8 / {PEER}@resnet50_int8 images/s at c=1"] == 60 / 50
    assert median[f"classify_bls@resnet50_int8 - {PEER}@resnet50_int8 p50 ms at c=1"] == 2.0
    assert median[f"classify_bls / {PEER}@resnet50_onnx images/s at c=8"] == 20 / 25  # FP32: the bench's classify_bls
