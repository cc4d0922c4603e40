"""What the launcher reads from a model repository: who calls whom (ensemble steps and the
models a flow declares), what loads with what, and the order in which to drain."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from bls_pipeline.serve.repository import Repository, drain_stages, export_hint, plan_loading
from bls_pipeline.base.modelconfig import config_variant

MODELS = Path(__file__).resolve().parents[2] / "models"


def _listed(model: str, *keys: str) -> tuple[str, ...]:
    """The model names these settings list, as the flow loads them (its defaults, its config.pbtxt)."""
    from bls_pipeline.runtime.load.loader import flow_settings

    settings = flow_settings(MODELS / model)[1]
    return tuple(name for key in keys for name in getattr(settings, key))


CLASSIFIERS = _listed("classify_bls", "cascade_classifiers", "classifiers")  # efficientnet_lite0_*, then resnet50_*


@pytest.fixture
def repo(tmp_path) -> Path:
    """models/ as shipped, with a (fake) ONNX file for every *_onnx model."""
    dst = tmp_path / "models"
    shutil.copytree(MODELS, dst, symlinks=True,
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.onnx.json", "*.plan", "*.xml", "*.bin",
                                                  "*.xml.json", "__pycache__"))
    for onnx in dst.glob("*_onnx"):
        (onnx / "1" / "model.onnx").write_bytes(b"")
    return dst


def test_a_flow_calls_what_its_settings_declare():
    repo = Repository.read(MODELS)
    assert repo.callees["classify_bls"] == CLASSIFIERS
    assert repo.callees["ensemble_resnet50"] == ("ensemble_preprocess", "resnet50_onnx", "ensemble_postprocess")
    assert repo.callees["resnet50_onnx"] == ()


def test_the_flows_settings_change_what_it_calls(repo):
    (repo / "classify_bls" / "config.pbtxt").write_text(
        config_variant(repo / "classify_bls", "classify_bls",
                       {"cascade_classifiers": "none", "classifiers": "resnet50_onnx"}))
    assert Repository.read(repo).callees["classify_bls"] == ("resnet50_onnx",)


def test_loading_a_flow_loads_what_it_calls(repo):
    plan = plan_loading(repo, {"python"}, only=("classify_bls",))
    assert plan.load == ("classify_bls", "efficientnet_lite0_onnx", "resnet50_onnx")
    # each declared model: loaded or why not
    assert set(plan.load) | set(plan.skipped) == {"classify_bls", *CLASSIFIERS}
    assert "no TensorRT backend" in plan.skipped["resnet50_trt"]


def test_excluded_models_stay_out_with_the_reason(repo):
    plan = plan_loading(repo, {"python"}, only=("classify_bls",), exclude={"resnet50_onnx": "random weights"})
    assert "resnet50_onnx" not in plan.load and plan.skipped["resnet50_onnx"] == "random weights"


def test_no_helper_models_for_an_ensemble_that_cannot_load(repo):
    (repo / "resnet50_onnx" / "1" / "model.onnx").unlink()
    plan = plan_loading(repo, {"python"})
    assert "resnet50_onnx/1/model.onnx is missing" in plan.skipped["resnet50_onnx"]
    assert plan.skipped["ensemble_resnet50"] == "its steps cannot load: resnet50_onnx"
    for helper in ("ensemble_preprocess", "ensemble_postprocess"):
        assert plan.skipped[helper] == "only ensemble_resnet50 uses it, and it cannot load"
    # ...unless asked for by name.
    assert "ensemble_preprocess" in plan_loading(repo, {"python"}, only=("ensemble_preprocess",)).load


def test_the_missing_onnx_hint_works_when_copied(repo):
    (repo / "resnet50_onnx" / "1" / "model.onnx").unlink()
    hint = plan_loading(repo, {"python"}).skipped["resnet50_onnx"]
    assert f"{sys.executable} -m engine_build export --model resnet50 --weights imagenet" in hint
    assert export_hint("efficientnet_lite0_onnx").endswith("-m engine_build export --model efficientnet_lite0")


def test_unknown_model_names_the_ones_there(repo):
    with pytest.raises(ValueError, match="no such model .*: nope \\(models there: .*classify_bls"):
        plan_loading(repo, {"python"}, only=("nope",))


def test_bls_serve_leaves_the_baselines_out_unless_asked(repo):
    baselines = Repository.read(repo).baselines()
    assert set(baselines) == {"ensemble_resnet50", "ensemble_preprocess", "ensemble_postprocess"}
    assert all("--with-baselines" in why for why in baselines.values())
    assert Repository.read(repo).baselines(("ensemble_resnet50",)) == {}  # asked for: it and its steps load
    assert set(Repository.read(repo).baselines(("classify_bls",))) == set(baselines)
    plan = plan_loading(repo, {"python"}, exclude=baselines)
    assert "classify_bls" in plan.load and not set(baselines) & set(plan.load)


def test_drain_unloads_callers_before_what_they_call(repo):
    loaded = ("classify_bls", "efficientnet_lite0_onnx", "ensemble_postprocess", "ensemble_preprocess",
              "ensemble_resnet50", "resnet50_onnx")
    stages = drain_stages(repo, loaded)
    assert stages == [("classify_bls", "ensemble_resnet50"),
                      ("efficientnet_lite0_onnx", "ensemble_postprocess", "ensemble_preprocess", "resnet50_onnx")]


def test_drain_orders_a_flow_that_calls_a_flow(repo):
    shutil.copytree(repo / "classify_bls", repo / "outer")
    (repo / "outer" / "config.pbtxt").write_text(config_variant(repo / "classify_bls", "outer", {
        "cascade_classifiers": "none", "classifiers": "classify_bls"}))
    stages = drain_stages(repo, ("classify_bls", "outer", "resnet50_onnx", "efficientnet_lite0_onnx"))
    assert stages == [("outer",), ("classify_bls",), ("resnet50_onnx", "efficientnet_lite0_onnx")]


def test_the_ocr_models_wait_for_their_weights(repo):
    """A function model (text_detector, text_recognizer) and an ONNX one (text_orientation)
    whose artifact is absent are left out, with the command that writes it."""
    ocr = ("text_detector", "text_orientation", "text_recognizer")
    plan = plan_loading(repo, {"python"}, only=ocr)
    assert plan.load == ()
    assert plan.skipped == {name: f"{name}/1/model.onnx is missing: export it with {sys.executable} -m engine_build ocr"
                            for name in ocr}
    for name in ocr:
        (repo / name / "1" / "model.onnx").write_bytes(b"")
    assert plan_loading(repo, {"python"}, only=ocr).load == ocr
