"""engine_build pieces that run without TensorRT."""

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
    proc = subprocess.run([sys.executable, "-m", "engine_build", "trt", "--onnx", str(onnx), "--output", str(tmp_path / "m.plan"),
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
