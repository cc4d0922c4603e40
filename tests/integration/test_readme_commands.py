"""The README's serving commands as they stand, in a reader's checkout: bls-serve, bls-classify
for the three flows (a table, a drawing, JSON lines), and the two curl commands (JSON with
base64, and the binary-data extension), their answers read by jq."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from PIL import Image

from docblocks import REPO, commands, run_block, tables, user_checkout

pytestmark = pytest.mark.integration


def test_the_serving_block_answers_every_client(model_repo, tmp_path):
    if shutil.which("jq") is None:
        pytest.fail("jq is not installed: the README's curl commands read their answers with it (apt-get install jq; "
                    ".ci/run does)")
    (block,) = commands(REPO / "README.md")
    checkout = user_checkout(tmp_path, model_repo)
    result = run_block(block, checkout)
    assert result.returncode == 0, result.stdout
    out = result.stdout
    grpc, triage, read = tables(out)
    assert grpc["mug.jpg"] == ("coffee mug (504)", "efficientnet_lite0_onnx:confident")
    assert set(grpc) == {p.name for p in (REPO / "samples").iterdir() if p.suffix in (".jpg", ".png")}
    assert triage == {"night.png": ("(no label)", "image_quality:too_dark")}
    assert read == {"sign.png": ("(no label)", "text_detector:text")}
    assert 'TEXT: "TRITON AVE\\nBLS 2026\\nFRAGILE"' in out
    # --draw: the sign with its lines boxed; --json: the mug's answer on one line, with its file.
    assert Image.open(checkout / "build" / "drawn" / "sign.png").size == Image.open(REPO / "samples" / "sign.png").size
    (line,) = re.findall(r'^\{"file": "samples/mug\.jpg".*\}$', out, re.M)
    mug = json.loads(line)
    assert ((mug["labels"][0], mug["class_ids"][0], mug["route"])
            == ("coffee mug", 504, "efficientnet_lite0_onnx:confident"))
    # curl and jq: the sign's document through read_text (pretty), the mug's through classify_bls (one line).
    (sign,) = (json.loads(m) for m in re.findall(r'^\{\n  "route": .*?^\}$', out, re.M | re.S))
    assert sign["route"] == "text_detector:text" and sign["outputs"] == {"TEXT": "TRITON AVE\nBLS 2026\nFRAGILE"}
    assert [(r["outputs"]["REGION_TEXT"], r["route"], r["labels"]) for r in sign["regions"]] == [
        ("TRITON AVE", "text_orientation:upright", ["0"]), ("BLS 2026", "text_orientation:upright", ["0"]),
        ("FRAGILE", "text_orientation:flipped", ["180"])]
    (binary,) = (json.loads(m) for m in re.findall(r'^\{"route":.*\}$', out, re.M))
    assert binary["route"] == mug["route"] and binary["labels"] == mug["labels"]  # the answer bls-classify printed
    assert binary["scores"] == pytest.approx(mug["scores"], rel=1e-4)
    assert re.search(r"Serving .*\bclassify_bls\b", out) and "tritonserver stopped (exit code 0)" in out
