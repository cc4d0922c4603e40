"""bls-bench keeps working: a few-second run (the real numbers come from a full run, see README)."""

import json
import shutil
import sys

import pytest

from bls_pipeline.tools import bench

pytestmark = pytest.mark.integration


def test_bench_smoke(model_repo, tmp_path):
    out = tmp_path / "bench"
    code = bench.main(["--concurrency", "1,2", "--duration", "1", "--warmup", "0.5", "--model-repository", str(model_repo),
                       "--targets", "classifier,classify_bls,ensemble_resnet50,cascade@0.5", "--out", str(out)])
    assert code == 0
    report = json.loads((out / "bench.json").read_text())
    points = {(p["target"], p["concurrency"]): p for p in report["points"]}
    assert set(points) == {(t, c) for t in ("classifier", "classify_bls", "ensemble_resnet50", "cascade@0.5") for c in (1, 2)}
    for p in points.values():
        assert p["errors"] == 0 and p["images_per_s"] > 0 and p["p50_ms"] <= p["p99_ms"]
    assert 0 <= points["cascade@0.5", 1]["escalated_fraction"] <= 1
    assert points["classify_bls", 1]["escalated_fraction"] is None
    assert "classify_bls / classifier images/s" in " ".join(report["meta"]["ratios"])
    assert (out / "bench.png").stat().st_size > 10_000
    table = (out / "bench.md").read_text()
    assert "| classify_bls | 1 |" in table and "12MP" in table
    assert all(r["ms_per_image"] > 0 and r["ms_per_image_cold_cache"] > 0 for r in report["preprocess"])


def test_bench_names_a_missing_model_before_it_starts(tmp_path, repo_root, capsys):
    repo = tmp_path / "models"
    shutil.copytree(repo_root / "models", repo, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.json", "__pycache__"))
    with pytest.raises(SystemExit) as exc:
        bench.main(["--concurrency", "1", "--duration", "1", "--warmup", "0", "--model-repository", str(repo),
                    "--targets", "classifier,classify_bls", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "cannot benchmark without resnet50_onnx" in err
    assert f"{sys.executable} -m engine_build export --model resnet50 --weights random" in err  # works when copied
    assert not (tmp_path / "out").exists()
