"""docs/extending.md as it stands: its files make a new flow model in a copy of the test
repository, with no change under bls_pipeline/; its commands run the user's unit test, then
serve the model and ask it over HTTP and gRPC."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from docblocks import commands, files, run_block, tables, user_checkout

pytestmark = pytest.mark.integration
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def guide_files() -> dict[str, str]:
    return files(GUIDE)


def guide_commands() -> list[str]:
    return commands(GUIDE)


@pytest.fixture(scope="module")
def user_repo(model_repo, tmp_path_factory) -> Path:
    """A user's checkout: the test repository's models/, the samples, the venv, and the guide's files."""
    root = user_checkout(tmp_path_factory.mktemp("user"), model_repo)
    for name, text in guide_files().items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_guide_writes_only_the_users_own_files():
    files = guide_files()
    assert set(files) == {"models/cat_check/config.pbtxt", "models/cat_check/1/model.py", "models/cat_check/1/flow.py",
                          "tests/test_cat_check.py"}
    assert not [f for f in files if f.startswith("bls_pipeline/")]
    assert len(guide_commands()) == 2


def test_the_users_unit_test_passes_in_process(user_repo):
    result = run_block(guide_commands()[0], user_repo, timeout=120)
    assert result.returncode == 0, result.stdout
    assert "1 passed" in result.stdout


def test_the_new_model_serves_over_http_and_grpc(user_repo, repo_root):
    result = run_block(guide_commands()[1], user_repo)
    assert result.returncode == 0, result.stdout
    out = result.stdout
    assert re.search(r"^Serving cat_check, efficientnet_lite0_onnx, resnet50_onnx from", out, re.M), out
    http, grpc = tables(out)
    # HTTP, every sample: the cat gets resnet50's second opinion; the rest are answered at once.
    assert set(http) == {p.name for p in (repo_root / "samples").iterdir() if p.suffix in (".jpg", ".png")}
    assert http["chelsea.jpg"][1] == "resnet50_onnx:second_opinion"
    assert http["mug.jpg"] == ("coffee mug (504)", "efficientnet_lite0_onnx:first_look")
    assert {route for name, (_, route) in http.items() if name != "chelsea.jpg"} == {"efficientnet_lite0_onnx:first_look"}
    # gRPC, the cat alone, top-1: the same answer.
    assert grpc == {"chelsea.jpg": http["chelsea.jpg"]}
    assert "successfully unloaded 'cat_check'" in out  # `kill %1`: bls-serve drained and stopped
