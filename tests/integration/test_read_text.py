"""read_text on a real tritonserver: the text detector's regions, oriented and read, over
HTTP, gRPC and plain KServe v2 JSON, with the PP-OCRv4 weights of the rapidocr wheel."""

from __future__ import annotations

import base64
import json
import urllib.request

import numpy as np
import pytest

from bls_pipeline.serve.client import ClassifyClient

pytestmark = pytest.mark.integration
MODEL = "read_text"
# samples/sign.png: where each line was drawn (x0, y0, x1, y1), and what it says.
SIGN_LINES = {"TRITON AVE": (90, 80, 385, 125), "BLS 2026": (90, 150, 250, 180), "FRAGILE": (410, 290, 570, 330)}


def _iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_sign_is_read_line_by_line(server, protocol, repo_root, sample_images):
    sign = (repo_root / "samples" / "sign.png").read_bytes()
    client = ClassifyClient(server.url(protocol), protocol, model=MODEL)
    try:
        out = client.classify([sign, sample_images["chelsea"]])
    finally:
        client.close()
    assert out["ROUTE"][:, 0].tolist() == [b"text_detector:text", b"text_detector:no_text"]
    assert out["REGION_COUNT"][:, 0].tolist() == [3, 0]
    assert out["REGION_BOXES"].shape == (2, 3, 4) and (out["REGION_BOXES"][1] == 0).all()  # padded
    read = {text.decode(): (box, route.decode(), label.decode())
            for text, box, route, label in zip(out["REGION_TEXT"][0], out["REGION_BOXES"][0], out["REGION_ROUTE"][0],
                                               out["REGION_LABELS"][0, :, 0])}
    assert set(read) == set(SIGN_LINES), read
    for text, (box, route, label) in read.items():
        assert _iou(box, SIGN_LINES[text]) > 0.5, (text, box)
        flipped = text == "FRAGILE"  # the label stuck on upside down
        assert route == ("text_orientation:flipped" if flipped else "text_orientation:upright")
        assert label.endswith(":1:180" if flipped else ":0:0")
    assert (out["REGION_CONFIDENCE"][0] > 0.8).all()
    assert out["TEXT"][:, 0].tolist() == [b"TRITON AVE\nBLS 2026\nFRAGILE", b""]
    assert out["LABELS"][0, 0] == b""  # images are answered by their text, not a label


def test_kserve_json_is_readable_as_it_comes(server, repo_root):
    """What curl gets: JSON, the regions as nested lists of the declared shapes."""
    body = {"inputs": [{"name": "IMAGE", "shape": [1, 1], "datatype": "BYTES",
                        "data": [base64.b64encode((repo_root / "samples" / "sign.png").read_bytes()).decode()]}]}
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/{MODEL}/infer", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.loads(response.read())
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["REGION_BOXES"]["shape"] == [1, 3, 4] and outputs["REGION_BOXES"]["datatype"] == "FP32"
    assert outputs["REGION_TEXT"]["data"] == ["TRITON AVE", "BLS 2026", "FRAGILE"]
    assert outputs["TEXT"]["data"] == ["TRITON AVE\nBLS 2026\nFRAGILE"]
    assert np.isfinite(outputs["REGION_CONFIDENCE"]["data"]).all()
