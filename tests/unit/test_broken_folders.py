"""A model folder whose config.pbtxt does not read is named (the file, where in it, why) and
kept to itself: the repository reads the other folders, the plan loads what was asked for
around it and reports it as a failed load when it was asked for, and bls-serve --fail-fast
exits 2 on it in one line, leaving no temporary folder. (The integration test serves beside
one: tests/integration/test_broken_folder.py.)"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from bls_pipeline.base.modelconfig import ConfigFileError, parse_config
from bls_pipeline.serve import cli
from bls_pipeline.serve.repository import Repository, config_problems, plan_loading
from bls_pipeline.serve.model_index import ModelStates

MODELS = Path(__file__).resolve().parents[2] / "models"
UNPARSABLE = 'name: "broken"\nbackend: "python"\nmax_batch_size: 64 {\n'  # what the operator wrote


@pytest.fixture
def repo(tmp_path) -> Path:
    """The shipped classify_bls and the models it calls, each *_onnx with a (fake) ONNX file,
    and a folder `broken` whose config.pbtxt does not parse."""
    dst = tmp_path / "models"
    for name in Repository.read(MODELS).closure(("classify_bls",)):
        shutil.copytree(MODELS / name, dst / name, symlinks=True,
                        ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.onnx.json", "*.plan", "*.xml",
                                                      "*.bin", "*.xml.json", "__pycache__"))
    for onnx in dst.glob("*_onnx"):
        (onnx / "1" / "model.onnx").write_bytes(b"")
    (dst / "broken" / "1").mkdir(parents=True)
    (dst / "broken" / "config.pbtxt").write_text(UNPARSABLE)
    return dst


@pytest.mark.parametrize("text, reason", [
    (UNPARSABLE, ":3:20: 'max_batch_size: 64 {': Expected identifier or number, got {."),
    ('name: "broken"\nmax_batch_sise: 8\n',
     ':2:1: Message type "inference.ModelConfig" has no field named "max_batch_sise".'),
    (b'name: "\xff"\n', ": not UTF-8 text (byte 7: invalid start byte)"),
])
def test_a_config_that_does_not_read_is_named_with_where_and_why_on_one_line(tmp_path, text, reason):
    path = tmp_path / "config.pbtxt"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigFileError) as raised:
        parse_config(tmp_path)
    assert str(raised.value) == f"{path}{reason}"
    assert isinstance(raised.value, ValueError)  # what bls-serve and its restart loop already report in one line


def test_the_repository_reads_the_other_folders_and_keeps_the_broken_one_apart(repo):
    read = Repository.read(repo)
    assert "broken" not in read.configs and "classify_bls" in read.configs
    assert read.broken == {"broken": f"{repo / 'broken' / 'config.pbtxt'}:3:20: 'max_batch_size: 64 {{': "
                                     "Expected identifier or number, got {."}
    assert "broken" in read.names


def test_a_broken_folder_nobody_asked_for_changes_nothing(repo):
    beside = plan_loading(repo, {"python"}, only=("classify_bls",))
    (repo / "broken" / "config.pbtxt").unlink()
    alone = plan_loading(repo, {"python"}, only=("classify_bls",))
    assert beside == alone and not beside.broken and "classify_bls" in beside.load


def test_a_broken_folder_that_is_wanted_is_a_failed_load_and_the_rest_load(repo):
    everything = plan_loading(repo, {"python"})
    assert list(everything.broken) == ["broken"] and "broken" not in everything.load + tuple(everything.skipped)
    assert everything.load == plan_loading(repo, {"python"}, only=("classify_bls",)).load
    asked = plan_loading(repo, {"python"}, only=("classify_bls", "broken"))
    assert asked.broken == everything.broken and "classify_bls" in asked.load
    assert "broken" not in plan_loading(repo, {"python"}, exclude={"broken": "left out"}).broken


def test_a_flows_broken_child_is_reported_as_a_failed_load(repo):
    (repo / "resnet50_onnx" / "config.pbtxt").write_text("max_batch_size: 64 {\n")
    plan = plan_loading(repo, {"python"}, only=("classify_bls",))
    assert list(plan.broken) == ["resnet50_onnx"] and "classify_bls" in plan.load


def test_a_fixed_file_is_no_problem_any_more(repo):
    assert list(config_problems(repo, ("broken", "classify_bls"))) == ["broken"]
    (repo / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\nmax_batch_size: 64\n')
    assert config_problems(repo, ("broken", "classify_bls")) == {}


class _Index:
    """Triton's repository index as the admin API returns it: a broken folder has no state."""

    def __init__(self, entries):
        self.entries = entries

    def index(self):
        return self.entries


def test_a_wanted_broken_folder_shows_as_a_failed_load_until_triton_knows_better(repo, tmp_path):
    index = _Index([{"name": "broken"}, {"name": "classify_bls", "version": "1", "state": "READY"}])
    states = ModelStates(index, tmp_path / "states.json", unreadable=lambda: config_problems(repo, ("broken",)))
    states.refresh()
    assert list(states.failed()) == ["broken"] and "config.pbtxt:3:20" in states.failed()["broken"]
    assert json.loads((tmp_path / "states.json").read_text())["broken"]["state"] == "UNAVAILABLE"  # the flows see it
    (repo / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\nmax_batch_size: 64\n')
    states.refresh()
    assert states.failed() == {} and "broken" not in states.states  # fixed: not a failure, not loaded yet
    (repo / "broken" / "config.pbtxt").write_text(UNPARSABLE)
    index.entries[0] = {"name": "broken", "version": "1", "state": "READY"}  # loaded meanwhile: Triton's state wins
    states.refresh()
    assert states.states["broken"]["state"] == "READY"


def test_bls_serve_fail_fast_exits_2_naming_the_file_and_leaves_no_temporary_folder(repo, tmp_path, monkeypatch,
                                                                                    capsys):
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # bls-serve's Ctrl-C handler stays out of pytest
    assert cli.main(["--model-repository", str(repo), "--fail-fast"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("bls-serve: error: cannot read the config of broken") and "config.pbtxt:3:20: " in err
    assert list(temp.iterdir()) == []
    # Nor on a start that fails in its plan: the temporary folder goes with the error.
    assert cli.main(["--model-repository", str(repo), "--models", "nosuch"]) == 2
    assert list(temp.iterdir()) == []
