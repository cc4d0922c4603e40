"""docs/extending.md as it stands: its files make a new flow model in a copy of the test
repository, with no change under bls_pipeline/; its commands run the user's unit test, then
serve the model and ask it over HTTP and gRPC."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
FILE_BLOCK = re.compile(r"```\w+ file=(\S+)\n(.*?)```", re.S)
RUN_BLOCK = re.compile(r"```bash run\n(.*?)```", re.S)


def guide_files() -> dict[str, str]:
    return dict(FILE_BLOCK.findall(GUIDE.read_text()))


def guide_commands() -> list[str]:
    return RUN_BLOCK.findall(GUIDE.read_text())


def run_block(block: str, cwd: Path, timeout: int = 420) -> subprocess.CompletedProcess:
    """One command block through bash, as a user would paste it; its process group (a
    server it started in the background included) is gone afterwards."""
    proc = subprocess.Popen(["bash", "-ec", block], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(block, proc.returncode, out)


@pytest.fixture(scope="module")
def user_repo(model_repo, repo_root, tmp_path_factory) -> Path:
    """A user's checkout: the test repository's models/, the samples, the venv, and the guide's files."""
    root = tmp_path_factory.mktemp("user")
    shutil.copytree(model_repo, root / "models", symlinks=True)
    (root / "samples").symlink_to(repo_root / "samples")
    (root / ".venv").symlink_to(repo_root / ".venv")
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


def _tables(out: str) -> list[dict[str, tuple[str, str]]]:
    """bls-classify's tables in `out`: per table, file -> (its top class, its route)."""
    tables = []
    for chunk in re.split(r"^file\s+score\s+class\s+route$", out, flags=re.M)[1:]:
        rows = re.findall(r"^(\S+\.(?:jpg|png))\s+(?:\d\.\d{3}|-)\s+(.+?)\s+(\S+:\S+)$", chunk, re.M)
        tables.append({name: (top, route) for name, top, route in rows})
    return tables


def test_the_new_model_serves_over_http_and_grpc(user_repo, repo_root):
    result = run_block(guide_commands()[1], user_repo)
    assert result.returncode == 0, result.stdout
    out = result.stdout
    assert re.search(r"^Serving cat_check, efficientnet_lite0_onnx, resnet50_onnx from", out, re.M), out
    http, grpc = _tables(out)
    # HTTP, every sample: the cat gets resnet50's second opinion; the rest are answered at once.
    assert set(http) == {p.name for p in (repo_root / "samples").iterdir() if p.suffix in (".jpg", ".png")}
    assert http["chelsea.jpg"][1] == "resnet50_onnx:second_opinion"
    assert http["mug.jpg"] == ("coffee mug (504)", "efficientnet_lite0_onnx:first_look")
    assert {route for name, (_, route) in http.items() if name != "chelsea.jpg"} == {"efficientnet_lite0_onnx:first_look"}
    # gRPC, the cat alone, top-1: the same answer.
    assert grpc == {"chelsea.jpg": http["chelsea.jpg"]}
    assert "successfully unloaded 'cat_check'" in out  # `kill %1`: bls-serve drained and stopped
