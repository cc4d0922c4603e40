"""bls-trace stamps the real models: every stage of both paths, in the order it runs."""

import re
import shutil

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


def test_both_paths_are_stamped_in_order(model_repo, tmp_path, server_factory):
    repo, stamps = stagetrace.traced_repository(model_repo, tmp_path / "trace")
    server = server_factory(repo, tmp_path, models=stagetrace.TRACED_MODELS)
    try:
        traces = stagetrace.trace(server.grpc_url, stamps, requests=8, warmup=2)
    finally:
        server.stop()
    assert {path: len(reqs) for path, reqs in traces.items()} == {"direct": 8, "classify_bls": 8}
    for request in traces["classify_bls"]:
        assert [request[name] for name in BLS_ORDER] == sorted(request[name] for name in BLS_ORDER)
    for request in traces["direct"]:  # the classifier alone: no classify_bls stage in its window
        assert not [name for name in request if name.startswith("classify_bls")]
        assert request["client send"] < request["resnet50_onnx onnxruntime start"] < request["client receipt"]
    bls = stagetrace.segments(traces["classify_bls"])
    assert [a for a, _, _ in bls][0] == "client send" and bls[-1][1] == "client receipt"
    assert all(ms >= 0 for _, _, ms in bls)
    table = stagetrace.report(traces)
    assert "| classify_bls decode_preprocess start | classify_bls decode_preprocess end |" in table
    assert "classify_bls - direct, p50 totals:" in table


def test_command_line_prints_the_split(model_repo, capsys):
    assert stagetrace.main(["--requests", "3", "--warmup", "1", "--model-repository", str(model_repo)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\| client send \| client receipt \(total\) \| \d+\.\d{3} \|$", out, re.M)
    assert re.search(r"^classify_bls - direct, p50 totals: -?\d+\.\d{3} ms$", out, re.M)


def test_command_line_names_a_missing_classifier(tmp_path, repo_root, capsys):
    repo = tmp_path / "models"
    shutil.copytree(repo_root / "models", repo, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.json", "__pycache__"))
    with pytest.raises(SystemExit) as exc:
        stagetrace.main(["--requests", "1", "--model-repository", str(repo)])
    assert exc.value.code == 2
    assert "cannot trace without resnet50_onnx" in capsys.readouterr().err
