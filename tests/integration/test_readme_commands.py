"""The README's serving commands as they stand, in a reader's checkout: bls-serve, bls-classify
for the three flows, and the two curl commands (JSON with base64, and the binary-data extension)."""

from __future__ import annotations

import json
import re

import pytest

from docblocks import REPO, commands, run_block, tables, user_checkout

pytestmark = pytest.mark.integration


def test_the_serving_block_answers_every_client(model_repo, tmp_path):
    (block,) = commands(REPO / "README.md")
    result = run_block(block, user_checkout(tmp_path, model_repo))
    assert result.returncode == 0, result.stdout
    out = result.stdout
    grpc, triage, read = tables(out)
    assert grpc["mug.jpg"] == ("coffee mug (504)", "efficientnet_lite0_onnx:confident")
    assert set(grpc) == {p.name for p in (REPO / "samples").iterdir() if p.suffix in (".jpg", ".png")}
    assert triage == {"night.png": ("(no label)", "image_quality:too_dark")}
    assert read == {"sign.png": ("(no label)", "text_detector:text")}
    assert 'TEXT: "TRITON AVE\\nBLS 2026\\nFRAGILE"' in out
    # Both curl answers are JSON naming the mug, the first with every output, the second LABELS only.
    answers = [json.loads(line) for line in re.findall(r'^\{"model_name":"classify_bls".*\}$', out, re.M)]
    assert len(answers) == 2, out
    for answer, outputs in zip(answers, ({"LABELS", "SCORES", "CLASS_IDS", "ROUTE"}, {"LABELS"})):
        by_name = {o["name"]: o for o in answer["outputs"]}
        assert set(by_name) == outputs
        assert by_name["LABELS"]["data"][0].endswith(":504:coffee mug")
    assert "Serving classify_bls" in out and "tritonserver stopped (exit code 0)" in out
