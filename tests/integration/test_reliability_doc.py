"""docs/reliability.md's walkthrough as it stands, in a reader's checkout: a version tried
as a shadow, then a canary, then promoted, with bls-serve, bls-rollout and bls-classify."""

from __future__ import annotations

import re

import pytest

from docblocks import REPO, commands, run_block, tables, user_checkout

pytestmark = pytest.mark.integration


def test_the_shadow_and_canary_walkthrough(model_repo, tmp_path):
    (block,) = commands(REPO / "docs" / "reliability.md")
    result = run_block(block, user_checkout(tmp_path, model_repo), timeout=600)
    out = result.stdout
    assert result.returncode == 0, out
    print("\n".join(line for line in out.splitlines() if "shadowing" in line or line.startswith("  ")))
    assert "classify_bls: loading anew with shadow=resnet50_onnx=resnet50_onnx@2, shadow_share=1" in out
    compared = re.search(r"resnet50_onnx@2 shadowing resnet50_onnx: (\d+) calls compared, 0 failed", out)
    assert compared and int(compared.group(1)) > 0, out
    assert "top-1 agreement 100.00%, top-5 overlap 100.00%" in out  # version 2 is version 1's copy
    assert "canary=resnet50_onnx=resnet50_onnx@2, canary_share=0.5" in out
    *canary_rounds, promoted = tables(out)
    routes = {route for table in canary_rounds for _, route in table.values()}
    assert routes <= {"resnet50_onnx:escalated", "resnet50_onnx@2:escalated"} and routes, routes
    assert promoted == {"chelsea.jpg": (promoted["chelsea.jpg"][0], "resnet50_onnx@2:escalated")}
    assert "resnet50_onnx: serving versions 2" in out and "tritonserver stopped (exit code 0)" in out
