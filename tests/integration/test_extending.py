"""docs/extending.md as it stands: its files make new models (flows, a numpy head, an ONNX
child) in a copy of the test repository, with no change under bls_pipeline/; its commands
run the user's unit tests, export the ONNX child, then serve the models and ask them over
HTTP and gRPC."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from docblocks import commands, details, files, run_block, tables, user_checkout

pytestmark = pytest.mark.integration
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def guide_files() -> dict[str, str]:
    return files(GUIDE)


def guide_command(containing: str) -> str:
    """The guide's one `bash run` block that contains this text."""
    found = [c for c in commands(GUIDE) if containing in c]
    assert len(found) == 1, f"{len(found)} run blocks contain {containing!r}"
    return found[0]


@pytest.fixture(scope="module")
def user_repo(model_repo, tmp_path_factory) -> Path:
    """A user's checkout: the test repository's models/, the samples, the venv, and the guide's files."""
    root = user_checkout(tmp_path_factory.mktemp("user"), model_repo)
    for name, text in guide_files().items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture(scope="module")
def run(user_repo):
    """Run the guide's block that contains this text, once; later steps reuse its result (the
    export before the server that serves it), whichever test asks first."""
    done = {}

    def run(containing: str, timeout: int = 420):
        if containing not in done:
            done[containing] = run_block(guide_command(containing), user_repo, timeout=timeout)
        return done[containing]

    return run


USERS_FILES = {
    # sections 1-5: a flow
    "models/cat_check/config.pbtxt", "models/cat_check/1/model.py", "models/cat_check/1/flow.py",
    "tests/test_cat_check.py",
    # 6-7: a numpy model fed another model's output, and a flow with an extra output
    "models/cat_head/config.pbtxt", "models/cat_head/labels.txt", "models/cat_head/1/model.py",
    "models/cat_head/1/cat_head.py",
    "models/cat_or_not/config.pbtxt", "models/cat_or_not/1/model.py", "models/cat_or_not/1/flow.py",
    "tests/test_cat_or_not.py",
    # 8: an ONNX child exported with torch, and the flow that calls it
    "models/colour_net/config.pbtxt", "models/colour_net/labels.txt", "models/colour_net/export.py",
    "models/colour_net/1/model.py",
    "models/dominant_colour/config.pbtxt", "models/dominant_colour/1/model.py", "models/dominant_colour/1/flow.py",
    "tests/test_dominant_colour.py",
    # 9: a detector's regions sent to a second model
    "models/upside_down/config.pbtxt", "models/upside_down/1/model.py", "models/upside_down/1/flow.py",
    "tests/test_upside_down.py",
}


def test_the_guide_writes_only_the_users_own_files():
    written = set(guide_files())
    assert written == USERS_FILES
    assert all(f.startswith(("models/", "tests/")) for f in written)  # no library edit: nothing under bls_pipeline/
    assert len(commands(GUIDE)) == 6


def test_the_users_unit_test_passes_in_process(run):
    result = run("tests/test_cat_check.py", timeout=120)
    assert result.returncode == 0, result.stdout
    assert "4 passed" in result.stdout


def test_the_new_model_serves_over_http_and_grpc(run, repo_root):
    result = run("--models cat_check ")
    assert result.returncode == 0, result.stdout
    out = result.stdout
    # Not anchored at a line's start: bls-serve prints this banner while bls-classify's progress
    # bar (stderr, same terminal) may already be mid-line.
    assert re.search(r"Serving cat_check, efficientnet_lite0_onnx, resnet50_onnx from", out), out
    http, grpc = tables(out)
    # HTTP, every sample: the cat gets resnet50's second opinion; the rest are answered at once.
    assert set(http) == {p.name for p in (repo_root / "samples").iterdir() if p.suffix in (".jpg", ".png")}
    assert http["chelsea.jpg"][1] == "resnet50_onnx:second_opinion"
    assert http["mug.jpg"] == ("coffee mug (504)", "efficientnet_lite0_onnx:first_look")
    assert ({route for name, (_, route) in http.items() if name != "chelsea.jpg"}
            == {"efficientnet_lite0_onnx:first_look"})
    # gRPC, the cat alone, top-1: the same answer.
    assert grpc == {"chelsea.jpg": http["chelsea.jpg"]}
    # The mug with ask_expert, from curl and from tritonclient: the expert answers it.
    assert '"data":["resnet50_onnx:second_opinion"]' in out, out
    assert "tritonclient: resnet50_onnx:second_opinion" in out, out
    assert "successfully unloaded 'cat_check'" in out  # `kill %1`: bls-serve drained and stopped


def test_the_head_on_another_models_logits_passes_in_process(run):
    result = run("tests/test_cat_or_not.py", timeout=120)
    assert result.returncode == 0, result.stdout
    assert "1 passed" in result.stdout


def test_the_onnx_child_exports_and_passes_in_process(run, user_repo):
    result = run("models/colour_net/export.py", timeout=180)
    assert result.returncode == 0, result.stdout
    assert "1 passed" in result.stdout
    assert (user_repo / "models" / "colour_net" / "1" / "model.onnx").is_file()


def test_the_region_flow_passes_in_process(run):
    result = run("tests/test_upside_down.py", timeout=120)
    assert result.returncode == 0, result.stdout
    assert "1 passed" in result.stdout


def test_the_new_models_serve_together_over_http_and_grpc(run, repo_root):
    assert run("models/colour_net/export.py", timeout=180).returncode == 0  # the ONNX file it serves
    result = run("--models cat_or_not,dominant_colour,upside_down")
    assert result.returncode == 0, result.stdout
    out = result.stdout
    assert re.search(r"Serving cat_head, cat_or_not, colour_net, dominant_colour, efficientnet_lite0_onnx, "
                     r"text_detector, text_orientation, upside_down from", out), out  # not anchored: as above
    cat_or_not, colours, colours_grpc, signs = tables(out)
    cat_details, _, _, sign_details = details(out)
    # cat_or_not: the head's answer on efficientnet_lite0's logits, and the extra output.
    assert cat_or_not == {"chelsea.jpg": ("cat (1)", "cat_head:efficientnet_lite0_onnx"),
                          "mug.jpg": ("not a cat (0)", "cat_head:efficientnet_lite0_onnx")}
    assert cat_details == {"chelsea.jpg": ["NEEDS_REVIEW: True"], "mug.jpg": ["NEEDS_REVIEW: False"]}
    # ... and over gRPC as JSON lines: the flow's own outputs under "outputs" (cat_or_not declares no
    # JSON output: bls-classify makes the document from its tensors).
    (answer,) = (json.loads(line) for line in re.findall(r'^\{"file": "samples/chelsea\.jpg".*$', out, re.M))
    assert (answer["labels"][0], answer["class_ids"][0]) == ("cat", 1) and answer["outputs"] == {"NEEDS_REVIEW": True}
    # dominant_colour: the ONNX child on every sample, in BGR as it reads them: the sky is blue.
    assert set(colours) == {p.name for p in (repo_root / "samples").iterdir() if p.suffix in (".jpg", ".png")}
    assert {route for _, route in colours.values()} == {"colour_net:colour"}
    assert colours["rocket.jpg"] == ("blue (0)", "colour_net:colour")
    assert colours["coffee.jpg"] == ("red (2)", "colour_net:colour")
    assert colours_grpc == {"rocket.jpg": colours["rocket.jpg"]}
    # upside_down: each sign's lines under it, the one upside-down label among them.
    assert (signs
            == {"sign.png": ("(no label)", "text_orientation:upright"),
                "blank.png": ("(no label)", "text_detector:no_text")})
    assert sign_details["blank.png"] == ["FLIPPED_LINES: 0"]
    first, *lines = sign_details["sign.png"]
    assert first == "FLIPPED_LINES: 1" and len(lines) == 3
    assert [re.search(r"\]\s+(\S+) \(", line).group(1) for line in lines] == ["0", "0", "180"]
    # ... over gRPC: the same regions, with their boxes; and as KServe v2 JSON from curl.
    (sign,) = (json.loads(line) for line in re.findall(r'^\{"file": "samples/sign\.png".*$', out, re.M))
    assert sign["outputs"] == {"FLIPPED_LINES": 1} and [r["labels"][0] for r in sign["regions"]] == ["0", "0", "180"]
    kserve = json.loads(re.search(r'^\{"model_name":"upside_down".*$', out, re.M).group(0))
    tensors = {t["name"]: t for t in kserve["outputs"]}
    assert tensors["REGION_COUNT"]["data"] == [3] and tensors["REGION_BOXES"]["shape"] == [1, 3, 4]
    assert tensors["REGION_BOXES"]["data"] == pytest.approx([v for r in sign["regions"] for v in r["box"]], abs=1e-3)
    assert json.loads(tensors["JSON"]["data"][0]) == {k: v for k, v in sign.items() if k != "file"}  # its JSON output
    assert "successfully unloaded 'cat_or_not'" in out and "successfully unloaded 'dominant_colour'" in out
