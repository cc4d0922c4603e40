"""scripts/gpu/run.sh --cpu-check: the one-command GPU run's every step, here without a GPU
(CPU instances, the torch path on the CPU, short measurements), so that a broken script
fails here and not on the GPU machine. Integration: it starts servers and exports models."""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = pytest.mark.integration


# efficientnet_lite0 first: with pytest-xdist's workers, this one exports it while the
# session server's worker exports resnet50 (tests/conftest.py: once_per_run).
def test_the_gpu_script_runs_every_step_without_a_gpu(repo_root, tmp_path, effnet_onnx_model, onnx_model,
                                                      place_exports):
    work, out = tmp_path / "work", tmp_path / "out"
    # the session's exports: two fewer to make
    place_exports(work / "models", {"resnet50_onnx": onnx_model, "efficientnet_lite0_onnx": effnet_onnx_model})
    proc = subprocess.run(["bash", str(repo_root / "scripts" / "gpu" / "run.sh"), "--cpu-check", "--quick",
                           "--out", str(out), "--work", str(work)], capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "run.log", "summary.md", "tests_gpu.txt",
                                                      "tritonserver_bench.log"]
    results = json.loads((out / "results.json").read_text())
    assert results["env"]["ok"] and results["stub_check"]["ok"] and results["exports"]["ok"] and results["tests"]["ok"]
    kept = {line.split("/models/")[-1] for line in log.splitlines() if line.startswith("have ")}
    assert kept == {"resnet50_onnx/1/model.onnx", "efficientnet_lite0_onnx/1/model.onnx"}, kept  # the given exports
    assert "skipped" in results["tests"]["summary"]  # without a GPU, every GPU test says why it skipped
    assert (results["decode"]["rows"][0]["batch"] == 16
            and results["decode"]["parity_full_decode"]["max_steps"] <= 1.0 + 1e-3)
    serve = results["serve"]
    assert {p["target"] for p in serve["points"]} == {"classify_bls_gpu", "resnet50_torch", "classify_bls_cpu"}
    failed = [p for p in serve["points"] if p["errors"] or not p["images_per_s"]]
    assert not failed, failed
    assert "gpu_flow_over_ceiling" in serve["ratios"]
    summary = (out / "summary.md").read_text()
    assert "(a) decode + preprocess in process" in summary and "(b) end to end over gRPC" in summary
    assert not list(work.glob("env/lib/python*/site-packages/numpy"))  # --cpu-check installs no wheel
