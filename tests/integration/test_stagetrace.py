"""bls-trace stamps the real models: every stage of both paths, in the order it runs."""

import re
import shutil
from pathlib import Path

import pytest

from bls_pipeline.tools import stagetrace

pytestmark = pytest.mark.integration

BLS_ORDER = [
    "client send",
    "classify_bls execute start",
    "classify_bls decode_preprocess start", "classify_bls decode_preprocess end",
    "classify_bls flow start", "classify_bls child_calls start",
    "classify_bls child_inputs start", "classify_bls child_inputs end",
    "classify_bls child_exec start",
    "resnet50_onnx execute start",
    "resnet50_onnx onnxruntime start", "resnet50_onnx onnxruntime end",
    "resnet50_onnx execute end",
    "classify_bls child_exec end",
    "classify_bls child_outputs start", "classify_bls child_outputs end",
    "classify_bls child_calls end", "classify_bls flow end",
    "classify_bls top_k start", "classify_bls top_k end",
    "classify_bls execute end",
    "client receipt",
]


@pytest.fixture
def shipped_models(model_repo, tmp_path) -> Path:
    """The test repository without its classify_bls variants (bls-trace adds bls-bench's own,
    whose names one of them shares), artifacts linked."""
    repo = tmp_path / "models"
    shutil.copytree(model_repo, repo, ignore=shutil.ignore_patterns("classify_bls_*", "*.onnx", "*.onnx.data"))
    for onnx in [*model_repo.glob("*/1/*.onnx"), *model_repo.glob("*/1/*.onnx.data")]:
        (repo / onnx.relative_to(model_repo)).symlink_to(onnx)
    return repo


def test_command_line_stamps_both_paths_in_order(shipped_models, monkeypatch, capsys):
    """bls-trace as a user runs it (one server of its own); the traces its report is made of
    are kept on the way through."""
    kept = []

    def trace_and_keep(*args, **kwargs):
        kept.append(real_trace(*args, **kwargs))
        return kept[-1]

    real_trace = stagetrace.trace
    monkeypatch.setattr(stagetrace, "trace", trace_and_keep)
    assert stagetrace.main(["--requests", "8", "--warmup", "2", "--model-repository", str(shipped_models)]) == 0
    (traces,) = kept
    assert {path: len(reqs) for path, reqs in traces.items()} == {"direct": 8, "classify_bls": 8}
    for request in traces["classify_bls"]:
        assert [request[name] for name in BLS_ORDER] == sorted(request[name] for name in BLS_ORDER)
    for request in traces["direct"]:  # the classifier alone: no classify_bls stage in its window
        assert not [name for name in request if name.startswith("classify_bls")]
        assert request["client send"] < request["resnet50_onnx onnxruntime start"] < request["client receipt"]
    bls = stagetrace.segments(traces["classify_bls"])
    assert [a for a, _, _ in bls][0] == "client send" and bls[-1][1] == "client receipt"
    assert all(ms >= 0 for _, _, ms in bls)

    out = capsys.readouterr().out
    assert stagetrace.report(traces) in out
    assert "| classify_bls decode_preprocess start | classify_bls decode_preprocess end |" in out
    assert re.search(r"^\| client send \| client receipt \(total\) \| \d+\.\d{3} \|$", out, re.M)
    assert re.search(r"^classify_bls - direct, p50 totals: -?\d+\.\d{3} ms$", out, re.M)


def test_command_line_names_a_missing_classifier(tmp_path, repo_root, capsys):
    repo = tmp_path / "models"
    shutil.copytree(repo_root / "models", repo,
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.onnx.json", "__pycache__"))
    with pytest.raises(SystemExit) as exc:
        stagetrace.main(["--requests", "1", "--model-repository", str(repo)])
    assert exc.value.code == 2
    assert "cannot trace without resnet50_onnx" in capsys.readouterr().err
