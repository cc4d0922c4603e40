"""What a newcomer meets first: one-line errors that say what to do, hints that work when
copied, a port clash caught at once, a failed weights download remembered. No server needed."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from bls_pipeline.serve import cli, client
from bls_pipeline.tools import demo

REPO = Path(__file__).resolve().parents[2]


def _listening_port() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_bls_serve_refuses_a_taken_port_at_once_naming_it(tmp_path, capsys):
    taken = _listening_port()
    port = taken.getsockname()[1]
    try:
        code = cli.main(["--model-repository", str(REPO / "models"), "--http-port", str(port), "--grpc-port", "0",
                            "--metrics-port", "0", "--watchdog-interval", "0"])
    finally:
        taken.close()
    err = capsys.readouterr().err
    assert code == 2
    assert f"bls-serve: error: HTTP port {port} on 127.0.0.1 is taken" in err and "--http-port" in err
    assert "Traceback" not in err


def test_bls_serve_without_a_repository_says_what_to_pass(tmp_path, capsys):
    code = cli.main(["--model-repository", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0
    assert f"bls-serve: error: no model repository at {tmp_path / 'nowhere'}: pass --model-repository DIR" in err


def test_bls_serve_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 127.0.0.1)" in out and "(default: 8000)" in out and "(default: 2.0)" in out


@pytest.mark.parametrize("value", ["0", "-3"])
def test_bls_classify_wants_a_positive_concurrency(value, capsys):
    with pytest.raises(SystemExit) as exc:
        client.main(["samples", "--concurrency", value])
    assert exc.value.code == 2
    assert f"argument --concurrency: must be 1 or more, got {value}" in capsys.readouterr().err


def test_bls_classify_names_the_url_it_cannot_reach_and_what_it_skipped(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "mug.jpg").write_bytes((REPO / "samples" / "mug.jpg").read_bytes())
    free = _listening_port()
    port = free.getsockname()[1]
    free.close()  # nothing listens there now
    code = client.main([str(tmp_path), "--url", f"127.0.0.1:{port}"])
    err = capsys.readouterr().err
    assert code == 2
    assert "skipped 1 file(s) whose extension is not an image's" in err and "notes.txt" in err
    assert f"cannot reach a Triton server at 127.0.0.1:{port} (http)" in err and "Traceback" not in err


def test_a_failed_weights_download_is_remembered(tmp_path, monkeypatch):
    from engine_build.export_onnx import WeightsUnavailable

    repo = tmp_path / "models"
    for model in ("resnet50_onnx", "efficientnet_lite0_onnx"):
        (repo / model / "1").mkdir(parents=True)
    (repo / "efficientnet_lite0_onnx" / "1" / "model.onnx").write_bytes(b"")  # exported already
    tries = []

    def export(_repo, model, weights):
        tries.append((model, weights))
        raise WeightsUnavailable("could not download torchvision's ImageNet weights for resnet50 (URLError: offline)")

    monkeypatch.setattr(demo, "_export", export)
    said: list[str] = []
    assert (demo.ensure_classifiers(repo, said.append)
            == dict.fromkeys(("resnet50_onnx", "resnet50_torch"), "no ImageNet weights here"))
    assert tries == [("resnet50", "imagenet")]
    record = json.loads((repo / "resnet50_onnx" / "1" / "model.unavailable.json").read_text())
    assert "URLError: offline" in record["error"]
    said.clear()
    assert set(demo.ensure_classifiers(repo, said.append)) == {"resnet50_onnx", "resnet50_torch"}
    assert tries == [("resnet50", "imagenet")]  # not tried again
    assert "delete" in said[0] and "model.unavailable.json to try again" in said[0]
    assert f"{sys.executable} -m engine_build export --model resnet50 --weights /path/to/resnet50.pth" in said[0]
