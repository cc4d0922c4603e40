"""docs/deploy.md's one-machine blocks as they stand, in a reader's checkout: the embedded
tritonserver as a plain command (bls-tritonserver) serving models/, then bls-pack-env's copy
for this Python served by it, its stubs started through the copy's environment."""

from __future__ import annotations

import pytest

from docblocks import REPO, commands, run_block, tables, user_checkout

pytestmark = pytest.mark.integration


def test_one_machine_with_a_plain_tritonserver(model_repo, tmp_path):
    plain, packed = commands(REPO / "docs" / "deploy.md")
    checkout = user_checkout(tmp_path, model_repo)

    result = run_block(plain, checkout)
    assert result.returncode == 0, result.stdout
    http, grpc = tables(result.stdout)
    assert http["mug.jpg"] == ("coffee mug (504)", "efficientnet_lite0_onnx:confident")
    assert http["chelsea.jpg"][1] == "efficientnet_lite0_onnx:degraded"  # resnet50 is not loaded
    assert grpc == {"mug.jpg": http["mug.jpg"]}

    result = run_block(packed, checkout)
    assert result.returncode == 0, result.stdout
    assert "Python 3." in result.stdout and "packed bls-env-py3." in result.stdout
    assert "Starting Python backend stub: source /" in result.stdout  # the copy's environment, not .venv
    assert tables(result.stdout) == [{"mug.jpg": http["mug.jpg"]}]
