"""bls-bench's ratios: taken within each round, then the median over rounds."""

from bls_pipeline.tools.bench import Point, ratios


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
