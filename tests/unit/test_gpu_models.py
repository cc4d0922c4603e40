"""resnet50_torch without a GPU: its config, its place in the flows' candidate order, the
launcher's reason to skip it here, its settings, engine_build's `torch` command, and the
classifier itself run in FP32 on the CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2

from bls_pipeline import contract
from bls_pipeline.runtime.load.children import load_child
from bls_pipeline.base.modelconfig import parse_config, string_parameters
from bls_pipeline.base.modelconfig import RELOAD_KEY
from bls_pipeline.base.errors import ConfigError
from bls_pipeline.engines.torch_classifier import TorchSettings
from bls_pipeline.serve.repository import plan_loading

MODELS = Path(__file__).resolve().parents[2] / "models"
ORDER = ("resnet50_trt", "resnet50_torch", "resnet50_openvino", "resnet50_int8", "resnet50_onnx")


def test_resnet50_torch_has_the_classifier_contract_on_a_gpu_instance():
    cfg = parse_config(MODELS / "resnet50_torch")
    assert ([(t.name, tuple(t.dims)) for t in cfg.input]
            == [(contract.CLASSIFIER_INPUT.name, contract.CLASSIFIER_INPUT.dims)])
    assert ([(t.name, tuple(t.dims)) for t in cfg.output]
            == [(contract.CLASSIFIER_OUTPUT.name, contract.CLASSIFIER_OUTPUT.dims)])
    assert (cfg.backend == "python"
            and [g.kind for g in cfg.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_GPU])
    params = string_parameters(cfg)
    assert params["FORCE_CPU_ONLY_INPUT_TENSORS"] == "no"  # CUDA inputs are taken where they are
    # the defaults, with CUDA graphs on (measured faster)
    assert TorchSettings.parse(params, "resnet50_torch") == TorchSettings(cuda_graphs=True)
    torch_child, onnx_child = load_child(MODELS, "resnet50_torch"), load_child(MODELS, "resnet50_onnx")
    assert torch_child.preprocess == onnx_child.preprocess and torch_child.labels == onnx_child.labels


@pytest.mark.parametrize("model,key", [("classify_bls", "classifiers"), ("triage_bls", "second_voter")])
def test_the_flows_try_the_torch_model_between_tensorrt_and_onnx(model, key):
    from bls_pipeline.runtime.load.loader import flow_settings

    assert tuple(getattr(flow_settings(MODELS / model)[1], key)) == ORDER  # as the flow loads it


def test_the_launcher_skips_gpu_instances_where_no_gpu_is_visible(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # every GPU hidden: the same answer on any machine
    plan = plan_loading(MODELS, {"python"}, only=("resnet50_torch",))
    assert plan.load == ()
    assert plan.skipped == {"resnet50_torch": "its instance_group is KIND_GPU and CUDA_VISIBLE_DEVICES hides every GPU"}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    gpu = Path("/dev/nvidiactl").exists() or any(Path("/dev").glob("nvidia[0-9]*"))
    plan = plan_loading(MODELS, {"python"}, only=("resnet50_torch",))
    if not gpu:
        assert plan.skipped["resnet50_torch"] == "its instance_group is KIND_GPU and this machine has no GPU"
    elif not (MODELS / "resnet50_torch" / "1" / "model.pt").exists():
        why = plan.skipped["resnet50_torch"]
        assert why.startswith("resnet50_torch/1/model.pt is missing: export it with ")
        assert f"{sys.executable} -m engine_build torch --model resnet50 --weights imagenet" in why


def test_torch_settings_refuse_what_they_do_not_know():
    assert TorchSettings.parse({RELOAD_KEY: "1"}, "m") == TorchSettings()  # the launcher's reload mark
    with pytest.raises(ConfigError, match="unknown parameter\\(s\\) cuda_graph for model m; known: artifact"):
        TorchSettings.parse({"cuda_graph": "1"}, "m")
    with pytest.raises(ConfigError, match="precision='bf16': write fp16 or fp32"):
        TorchSettings.parse({"precision": "bf16"}, "m")
    with pytest.raises(ConfigError, match="cuda_graphs='on': write 1 or 0"):
        TorchSettings.parse({"cuda_graphs": "on"}, "m")
    assert TorchSettings.parse({"cuda_graphs": "1", "preprocess_crop": "224"}, "m").cuda_graphs is True


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """resnet50 with random weights, written by engine_build's `torch` command."""
    pytest.importorskip("torchvision")
    from engine_build import cli

    out = tmp_path_factory.mktemp("torch") / "model.pt"
    assert cli.main(["torch", "--model", "resnet50", "--weights", "random", "--output", str(out),
                     "--onnx", str(out.parent / "absent.onnx")]) == 0
    return out


def test_the_torch_command_writes_the_state_dict_and_its_weights(exported, capsys):
    assert json.loads(exported.with_suffix(".pt.json").read_text()) == {"weights": "random"}
    assert not list(exported.parent.glob("*.tmp*"))
    from engine_build.export_onnx import EXPORTS

    assert EXPORTS["resnet50"].torch_path == MODELS / "resnet50_torch" / "1" / "model.pt"
    assert EXPORTS["efficientnet_lite0"].torch_path is None


def test_the_torch_command_needs_weights_for_resnet50(capsys):
    from engine_build import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["torch"])
    assert exit_.value.code == 2 and "--weights is required for resnet50" in capsys.readouterr().err


def test_the_classifier_runs_the_exported_weights_on_the_cpu(exported, caplog):
    torch = pytest.importorskip("torch")
    from engine_build.export_onnx import build_torch_model
    from bls_pipeline.engines.torch_classifier import TorchClassifier

    model = TorchClassifier(exported, TorchSettings(), "cpu", max_batch_size=2)
    assert "fp16 needs CUDA: running resnet50 in fp32 on cpu" in caplog.text
    x = np.random.default_rng(0).standard_normal((5, 3, 224, 224), dtype=np.float32)  # over max_batch_size: chunks
    got = model(model.as_input(x))
    with torch.no_grad():
        want = build_torch_model("random")(torch.from_numpy(x)).numpy()
    assert got.dtype == torch.float32 and got.shape == (5, 1000)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-3 * max(1.0, float(np.abs(want).max())))
