"""The JSON output on a real tritonserver: each image's answer as one document, over HTTP and
gRPC, saying what the tensors of the same response say; `bls-classify --json` and `--draw`."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bls_pipeline.serve.client import ClassifyClient

pytestmark = pytest.mark.integration
SIGN_TEXT = ["TRITON AVE", "BLS 2026", "FRAGILE"]  # samples/sign.png, top to bottom; FRAGILE stuck on upside down


def _ask(server, protocol: str, model: str, images: list[bytes], topk: int | None = None) -> tuple[dict, list[dict]]:
    """Every output of one request, and its JSON documents parsed."""
    client = ClassifyClient(server.url(protocol), protocol, model=model)
    try:
        out = client.classify(images, topk)
    finally:
        client.close()
    assert out["JSON"].shape == (len(images), 1)
    return out, [json.loads(row.decode("utf-8")) for row in out["JSON"][:, 0]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_read_text_answers_each_image_with_its_own_lines(server, protocol, repo_root, sample_images):
    sign = (repo_root / "samples" / "sign.png").read_bytes()
    out, (read, photo) = _ask(server, protocol, "read_text", [sign, sample_images["chelsea"]])
    assert read["route"] == "text_detector:text" and (read["labels"], read["scores"], read["class_ids"]) == ([], [], [])
    assert read["outputs"] == {"TEXT": "\n".join(SIGN_TEXT)}
    assert [r["outputs"]["REGION_TEXT"] for r in read["regions"]] == SIGN_TEXT
    for j, region in enumerate(read["regions"]):  # what the tensors of the same answer say, region by region
        assert list(region) == ["box", "route", "labels", "scores", "class_ids", "outputs"]
        np.testing.assert_allclose(region["box"], out["REGION_BOXES"][0, j], rtol=1e-6)
        assert region["route"] == out["REGION_ROUTE"][0, j].decode()
        flipped = region["outputs"]["REGION_TEXT"] == "FRAGILE"
        assert region["route"] == ("text_orientation:flipped" if flipped else "text_orientation:upright")
        assert (region["labels"], region["class_ids"]) == ((["180"], [1]) if flipped else (["0"], [0]))
        assert region["scores"][0] == pytest.approx(float(out["REGION_SCORES"][0, j, 0]), rel=1e-6)
        assert 0.8 < region["outputs"]["REGION_CONFIDENCE"] <= 1
    # The cat photo: no text, no regions; the tensors pad its rows to the sign's three.
    assert out["REGION_BOXES"].shape == (2, 3, 4)
    assert photo == {"route": "text_detector:no_text", "labels": [], "scores": [], "class_ids": [],
                     "outputs": {"TEXT": ""}, "regions": []}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classify_bls_answers_a_photo_with_its_labels(server, protocol, sample_images):
    out, (mug, camera) = _ask(server, protocol, "classify_bls", [sample_images["mug"], sample_images["camera"]], topk=3)
    assert mug["route"] == "efficientnet_lite0_onnx:confident"
    assert (mug["labels"][0], mug["class_ids"][0]) == ("coffee mug", 504)
    assert camera["labels"][0] == "tripod"
    for doc, labels, scores, ids, route in zip((mug, camera), out["LABELS"], out["SCORES"], out["CLASS_IDS"],
                                               out["ROUTE"]):
        assert set(doc) == {"route", "labels", "scores", "class_ids"}  # no outputs of its own, no regions
        assert doc["route"] == route[0].decode()
        assert ([v.decode().split(":", 2)[1:] for v in labels]
                == [[str(i), name] for i, name in zip(doc["class_ids"], doc["labels"])])
        assert doc["class_ids"] == ids.tolist()
        np.testing.assert_allclose(doc["scores"], scores, rtol=1e-6)
        assert doc["scores"] == sorted(doc["scores"], reverse=True) and sum(doc["scores"]) <= 1 + 1e-6


def test_json_alone_is_what_a_plain_http_client_reads(server, repo_root):
    """curl's view: KServe v2 JSON asking for JSON only; each document a string of JSON."""
    sign = base64.b64encode((repo_root / "samples" / "sign.png").read_bytes()).decode()
    body = {"inputs": [{"name": "IMAGE", "shape": [1, 1], "datatype": "BYTES", "data": [sign]}],
            "outputs": [{"name": "JSON"}]}
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/read_text/infer", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.loads(response.read())
    (output,) = answer["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("JSON", "BYTES", [1, 1])
    document = json.loads(output["data"][0], parse_constant=lambda c: pytest.fail(f"{c} in the JSON output"))
    assert [r["outputs"]["REGION_TEXT"] for r in document["regions"]] == SIGN_TEXT


def _bls_classify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "bls-classify"), *args], capture_output=True, text=True,
                          timeout=300)


def test_bls_classify_prints_one_json_line_per_image_and_draws_them(server, repo_root, tmp_path):
    sign, cat, mug = (str(repo_root / "samples" / name) for name in ("sign.png", "chelsea.jpg", "mug.jpg"))
    read = _bls_classify(sign, cat, "--model", "read_text", "--protocol", "grpc", "--url", server.grpc_url, "--json",
                         "--draw", str(tmp_path / "drawn"))
    assert read.returncode == 0, read.stdout + read.stderr
    lines = read.stdout.splitlines()
    assert len(lines) == 2, read.stdout
    by_file = {doc["file"]: doc for doc in map(json.loads, lines)}
    assert set(by_file) == {sign, cat}
    assert [r["outputs"]["REGION_TEXT"] for r in by_file[sign]["regions"]] == SIGN_TEXT
    assert by_file[cat]["regions"] == [] and by_file[cat]["route"] == "text_detector:no_text"
    assert sorted(p.name for p in (tmp_path / "drawn").iterdir()) == ["chelsea.png", "sign.png"]
    assert Image.open(tmp_path / "drawn" / "sign.png").size == Image.open(sign).size
    assert "drew 2 image(s)" in read.stderr
    # classify_bls over HTTP: the labels, one line per image, in the order given.
    photos = _bls_classify(mug, sign, "--url", server.http_url, "--json", "--topk", "2")
    assert photos.returncode == 0, photos.stdout + photos.stderr
    first, second = (json.loads(line) for line in photos.stdout.splitlines())
    assert (first["file"], first["labels"][0], len(first["labels"])) == (mug, "coffee mug", 2)
    assert second["file"] == sign and Path(second["file"]).name == "sign.png"
