"""The README's commands are what the repository runs, and the main job works."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from docblocks import REPO, commands, user_checkout

pytestmark = pytest.mark.integration


def _top_commands(readme: str) -> list[str]:
    block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_top_commands_are_the_scripts(repo_root):
    commands = _top_commands((repo_root / "README.md").read_text())
    assert commands == ["./scripts/demo.sh", "./scripts/test.sh"]
    demo, test = (repo_root / c for c in commands)
    assert "bls-demo" in demo.read_text() and "pytest" in test.read_text()
    assert "./scripts/test.sh" in (repo_root / ".ci" / "run").read_text()


def test_triton_tag_is_set_once(repo_root):
    dockerfile = (repo_root / "Dockerfile").read_text()
    assert len(re.findall(r"^ARG TRITON_TAG=\d{2}\.\d{2}$", dockerfile, re.M)) == 1
    assert "FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}-py3" in dockerfile
    tracked = subprocess.run(["git", "ls-files"], cwd=repo_root, capture_output=True, text=True).stdout.split()
    for name in tracked:
        path = repo_root / name
        if path.suffix in {".md", ".py", ".sh", ".pbtxt", ""} and path.is_file() and name != "Dockerfile":
            assert not re.search(r"tritonserver:\d{2}\.\d{2}", path.read_text(errors="ignore")), name


def test_main_job_classifies_the_samples(model_repo, repo_root, tmp_path):
    """bls-demo (what ./scripts/demo.sh runs after setup) on a reader's checkout of the test repository."""
    models = user_checkout(tmp_path, model_repo) / "models"
    proc = subprocess.run([sys.executable, "-m", "bls_pipeline.tools.demo", "--model-repository", str(models), "--topk",
                           "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for protocol in ("HTTP", "GRPC"):
        assert f"== classify_bls over {protocol}" in proc.stdout
        assert f"== read_text over {protocol}" in proc.stdout
    assert "== triage_bls over GRPC" in proc.stdout
    for sample in sorted(Path(repo_root / "samples").glob("*.*g")):
        assert proc.stdout.count(sample.name) == 5  # classify_bls and read_text once per protocol, triage_bls once
    # The test repo's resnet50 has random weights: the main job must not serve it, so every
    # label comes from efficientnet_lite0's real weights.
    assert "RANDOM weights (a test export): not serving it" in proc.stdout
    assert "resnet50_onnx:" not in proc.stdout.split("== classify_bls over HTTP")[1]
    # classify_bls runs its cheap classifier in its own process (run_in_process, as shipped)
    assert (re.search(r"classify_bls calls: efficientnet_lite0_(onnx|int8) \(cascade_classifiers, in process\)",
                      proc.stdout)), proc.stdout
    http = proc.stdout.split("== classify_bls over HTTP")[1].split("== classify_bls over GRPC")[0]
    # FP32, or the INT8 engine where the main job kept it (a CPU whose INT8 kernels pass its check)
    assert re.search(r"mug\.jpg\s+0\.\d+\s+coffee mug \(504\)\s+efficientnet_lite0_(onnx|int8):confident", http), http
    assert re.search(r"coffee\.jpg\s+0\.\d+\s+espresso \(967\)", http), http
    triage = proc.stdout.split("== triage_bls over GRPC")[1]
    assert re.search(r"night\.png\s+-\s+\(no label\)\s+image_quality:too_dark", triage), triage
    assert re.search(r"blank\.png\s+-\s+\(no label\)\s+image_quality:blank", triage), triage
    assert re.search(r"mug\.jpg\s+0\.\d+\s+coffee mug \(504\)\s+efficientnet_lite0_(onnx|int8):alone", triage), triage
    # read_text: the sign's three lines read, the upside-down one turned round first; the
    # same over both protocols.
    read_http, read_grpc = (proc.stdout.split(f"== read_text over {p}")[1].split("\n== ")[0].split("\n", 1)[1]
                            for p in ("HTTP", "GRPC"))
    assert read_http.replace("server stopped.", "").strip() == read_grpc.replace("server stopped.", "").strip()
    assert re.search(r'sign\.png\s+-\s+\(no label\)\s+text_detector:text\n\s+TEXT: "TRITON AVE\\nBLS 2026\\nFRAGILE"\n',
                     read_http), read_http
    assert re.search(r"\]  180 \(1\.00\)  text_orientation:flipped  REGION_TEXT: FRAGILE ", read_http), read_http
    assert re.search(r"blank\.png\s+-\s+\(no label\)\s+text_detector:no_text", read_http), read_http
    assert "server stopped." in proc.stdout


def _binary_recipe() -> str:
    """The README's raw-bytes curl recipe: its lines from `size=` to the curl that sends them."""
    (block,) = commands(REPO / "README.md")
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("size=$(stat"))
    end = next(i for i in range(start, len(lines)) if "/infer" in lines[i])
    return "\n".join(lines[start:end + 1])


def test_the_binary_recipe_sends_a_photo_over_8_mb(server, tmp_path):
    """The recipe with a 10 MB photo: curl's default type (application/x-www-form-urlencoded)
    on a body over ~4.5 MB crashed Triton 2.51's HTTP server, so the recipe says octet-stream."""
    if shutil.which("jq") is None:
        pytest.fail("jq is not installed: the README's curl commands read their answers with it (apt-get install jq; "
                    ".ci/run does)")
    recipe = _binary_recipe()
    assert "-H 'Content-Type: application/octet-stream'" in recipe
    # noise: JPEG cannot shrink it
    pixels = np.random.default_rng(25).integers(0, 256, size=(1800, 2400, 3), dtype=np.uint8)
    photo = tmp_path / "noise.jpg"
    Image.fromarray(pixels).save(photo, "JPEG", quality=95, subsampling=0)
    assert photo.stat().st_size > 8 * 2**20
    script = recipe.replace("samples/mug.jpg", str(photo)).replace("127.0.0.1:8000", server.http_url)
    assert script.count(str(photo)) == 2 and server.http_url in script, script
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answer = json.loads(proc.stdout)  # jq's one line: the image's JSON document
    assert re.fullmatch(r"\w+:\w+", answer["route"]), answer
    assert len(answer["labels"]) == len(answer["class_ids"]) == 5  # classify_bls's default_topk
    assert answer["scores"] == sorted(answer["scores"], reverse=True) and 0 < answer["scores"][0] <= 1
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=30) as ready:
        assert ready.status == 200  # still serving
