"""What the launcher skips, and why, on a machine with and without TensorRT: both answers
are checked on every machine (no server starts; the backends are given)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bls_pipeline.base.modelconfig import config_variant
from bls_pipeline.serve.repository import export_hint, plan_loading, standby_models

MODELS = Path(__file__).resolve().parents[2] / "models"
TRT = ("efficientnet_lite0_trt", "resnet50_trt")


@pytest.fixture
def repo(tmp_path) -> Path:
    """models/ as shipped with a (fake) ONNX for every *_onnx model, and no TensorRT plan."""
    dst = tmp_path / "models"
    shutil.copytree(MODELS, dst,
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.onnx.json", "*.plan", "*.xml", "*.bin",
                                                  "*.xml.json", "__pycache__"))
    for onnx in dst.glob("*_onnx"):
        (onnx / "1" / "model.onnx").write_bytes(b"")
    return dst


def test_without_a_tensorrt_backend_the_plans_are_skipped_for_that(repo):
    plan = plan_loading(repo, {"python"}, only=TRT)
    assert plan.load == ()
    assert plan.skipped == {name: "this tritonserver has no TensorRT backend" for name in TRT}


def test_with_tensorrt_a_missing_plan_says_how_to_build_it(repo):
    plan = plan_loading(repo, {"python", "tensorrt"}, only=TRT)
    assert plan.load == ()
    assert plan.skipped == {name: f"{name}/1/model.plan is missing: build it with {export_hint(name)}" for name in TRT}
    assert (export_hint("resnet50_trt").endswith(" -m engine_build trt --model resnet50 --fp16 (needs TensorRT and a "
                                                 "GPU)"))


def test_with_tensorrt_and_a_plan_the_model_loads(repo):
    (repo / "resnet50_trt" / "1" / "model.plan").write_bytes(b"")
    plan = plan_loading(repo, {"python", "tensorrt"}, only=TRT)
    assert plan.load == ("resnet50_trt",) and set(plan.skipped) == {"efficientnet_lite0_trt"}


def test_the_shipped_flows_load_the_same_cpu_models_either_way(repo):
    """Whatever else classify_bls may call (TensorRT plans, GPU-only models), its CPU
    classifiers load with or without TensorRT, and only the others are skipped."""
    cpu = ("classify_bls", "efficientnet_lite0_onnx", "resnet50_onnx")
    for backends in ({"python"}, {"python", "tensorrt"}):
        plan = plan_loading(repo, backends, only=("classify_bls",))
        assert plan.load == cpu and set(TRT) <= set(plan.skipped), backends


def test_a_native_gpu_model_on_a_server_without_its_backend_names_the_backend(repo, monkeypatch):
    """A GPU-only onnxruntime child on the embedded server (python backend only): the missing
    backend is the reason given, whether or not this machine has a GPU."""
    (repo / "colour_net" / "1").mkdir(parents=True)
    (repo / "colour_net" / "1" / "model.onnx").write_bytes(b"")
    (repo / "colour_net" / "config.pbtxt").write_text(
        'name: "colour_net"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "image", data_type: TYPE_UINT8, dims: [ 96, 96, 3 ] } ]\n'
        'output [ { name: "logits", data_type: TYPE_FP32, dims: [ 3 ] } ]\n'
        'instance_group [ { count: 1, kind: KIND_GPU } ]\n')
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    plan = plan_loading(repo, {"python"}, only=("colour_net",))
    assert plan.skipped == {"colour_net": "this tritonserver has no onnxruntime backend"}


# ---- standby: fallbacks a flow calls only once the candidate before them is gone ---------------
SHIPPED_IN_PROCESS = "efficientnet_lite0_openvino,efficientnet_lite0_int8,efficientnet_lite0_onnx"


def _run_in_process(repo: Path, flow: str, models: str) -> None:
    """Set the flow's run_in_process (classify_bls ships the cascade's CPU engines in it)."""
    config = (repo / flow / "config.pbtxt").read_text()
    assert f'"{SHIPPED_IN_PROCESS}"' in config
    (repo / flow / "config.pbtxt").write_text(config.replace(f'"{SHIPPED_IN_PROCESS}"', f'"{models}"'))


GRAPH_ONLY = b"\x3a\x00"  # a ModelProto with an empty graph: whole enough for the plan


def test_a_fallback_behind_a_loaded_engine_is_on_standby_and_names_it(repo):
    for family in ("efficientnet_lite0", "resnet50"):
        (repo / f"{family}_int8" / "1" / "model.onnx").write_bytes(GRAPH_ONLY)
    plan = plan_loading(repo, {"python"}, only=("classify_bls",))
    assert plan.standby == {"efficientnet_lite0_int8": "run in process by classify_bls",  # as shipped
                            "efficientnet_lite0_onnx": "a fallback behind efficientnet_lite0_int8",
                            "resnet50_onnx": "a fallback behind resnet50_int8"}


def test_without_an_engine_before_it_the_fallback_answers(repo):
    _run_in_process(repo, "classify_bls", "none")
    assert plan_loading(repo, {"python"}, only=("classify_bls",)).standby == {}


def test_an_ensemble_step_or_a_model_first_in_any_list_is_not_on_standby(repo):
    """resnet50_onnx is the ensemble's classifier; a flow listing efficientnet_lite0_onnx first
    calls it whatever else is loaded."""
    for family in ("efficientnet_lite0", "resnet50"):
        (repo / f"{family}_int8" / "1" / "model.onnx").write_bytes(GRAPH_ONLY)
    _run_in_process(repo, "classify_bls", "none")  # every call through Triton
    shutil.copytree(repo / "classify_bls", repo / "onnx_first")
    (repo / "onnx_first" / "config.pbtxt").write_text(config_variant(repo / "classify_bls", "onnx_first", {
        "cascade_classifiers": "efficientnet_lite0_onnx,efficientnet_lite0_int8"}))
    plan = plan_loading(repo, {"python"}, only=("classify_bls", "ensemble_resnet50", "onnx_first"))
    assert {"efficientnet_lite0_onnx", "resnet50_onnx", "resnet50_int8"} <= set(plan.load)
    assert plan.standby == {}




def test_a_child_every_loaded_caller_runs_in_process_is_on_standby_and_says_why(repo):
    plan = plan_loading(repo, {"python"}, only=("classify_bls",))
    assert plan.standby == {"efficientnet_lite0_onnx": "run in process by classify_bls"}


def test_a_child_another_flow_calls_through_triton_is_not_on_standby(repo):
    """triage_bls calls efficientnet_lite0_onnx through Triton: its model answers there."""
    _run_in_process(repo, "classify_bls", "efficientnet_lite0_onnx")
    plan = plan_loading(repo, {"python"}, only=("classify_bls", "triage_bls"))
    assert "efficientnet_lite0_onnx" in plan.load and plan.standby == {}


def test_a_gpu_flow_runs_nothing_in_process_so_its_children_answer(repo):
    """A KIND_GPU classify_bls sends every call through Triton (its pixels are on the GPU)."""
    config = (repo / "classify_bls" / "config.pbtxt").read_text().replace("kind: KIND_CPU", "kind: KIND_GPU")
    (repo / "classify_bls" / "config.pbtxt").write_text(config)
    assert standby_models(repo, ("classify_bls", "efficientnet_lite0_onnx", "resnet50_onnx")) == {}
