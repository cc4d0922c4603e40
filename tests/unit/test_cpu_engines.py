"""The CPU engines' models: Triton-native configs against Triton's schema and against the
python-backend config the flows read, the candidate order, the calibration folder's
errors and bls-serve's check of an engine file."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from PIL import Image
from tritonclient.grpc import model_config_pb2

from bls_pipeline.runtime.load.children import child_model, load_child
from bls_pipeline.base.modelconfig import parse_config, string_parameters
from bls_pipeline.serve.repository import artifact_problem, plan_loading
from engine_build.build_cpu import CalibrationError, calibration_images, calibration_tensors

MODELS = Path(__file__).resolve().parents[2] / "models"
ENGINES = ("int8", "openvino")
FAMILIES = ("resnet50", "efficientnet_lite0")
NATIVE = {"onnx": "onnxruntime", "int8": "onnxruntime", "openvino": "openvino"}
MODEL_FILE = {"onnxruntime": "model.onnx", "openvino": "model.xml"}


def _native(name: str) -> model_config_pb2.ModelConfig:
    # Strict parse: a field Triton's schema lacks fails here, as it would fail the load.
    return text_format.Parse((MODELS / name / "configs" / "native.pbtxt").read_text(), model_config_pb2.ModelConfig())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", sorted(NATIVE))
def test_native_config_is_the_python_config_on_tritons_own_backend(family, kind):
    name = f"{family}_{kind}"
    native, python = _native(name), parse_config(MODELS / name)
    assert native.name == python.name == name
    assert native.backend == NATIVE[kind] and python.backend == "python"
    assert native.default_model_filename == MODEL_FILE[NATIVE[kind]] == string_parameters(python)["artifact"]
    for field in ("max_batch_size", "input", "output", "instance_group", "dynamic_batching"):
        assert getattr(native, field) == getattr(python, field), field
    # The flows read config.pbtxt whichever config Triton loaded: it must describe the same model.
    assert child_model(name, native, MODELS / name) == load_child(MODELS, name)
    preprocess = {k: v for k, v in string_parameters(python).items() if k.startswith("preprocess_")}
    assert (preprocess
            and {k: v for k, v in string_parameters(native).items() if k.startswith("preprocess_")} == preprocess)
    assert preprocess == {k: v for k, v in string_parameters(parse_config(MODELS / f"{family}_onnx")).items()
                          if k.startswith("preprocess_")}


@pytest.mark.parametrize("flow, keys", [("classify_bls", ("cascade_classifiers", "classifiers")),
                                        ("triage_bls", ("first_voter", "second_voter"))])
def test_engines_come_before_fp32_onnx_in_every_candidate_list(flow, keys):
    from bls_pipeline.runtime.load.loader import flow_settings

    settings = flow_settings(MODELS / flow)[1]
    for key in keys:
        candidates = list(getattr(settings, key))
        family = candidates[-1].rsplit("_", 1)[0]
        assert candidates[-1] == f"{family}_onnx"  # FP32 onnxruntime: the fallback of last resort
        assert all(f"{family}_{engine}" in candidates[:-1] for engine in ENGINES), candidates


def test_a_folder_with_no_readable_image_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff nothing after")
    with pytest.raises(CalibrationError, match=f"calibration folder {tmp_path} has no readable image.*broken.jpg"):
        calibration_images(tmp_path)
    with pytest.raises(CalibrationError, match="does not exist"):
        calibration_images(tmp_path / "absent")


def test_files_not_named_as_images_are_passed_over_and_broken_images_named(tmp_path, caplog):
    Image.new("RGB", (32, 24), (200, 10, 10)).save(tmp_path / "red.png")
    (tmp_path / "README.md").write_text("calibration photos")
    with caplog.at_level(logging.WARNING):
        assert [p.name for p, _ in calibration_images(tmp_path)] == ["red.png"]
    assert not caplog.records
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff nothing after")
    with caplog.at_level(logging.WARNING):
        assert [p.name for p, _ in calibration_images(tmp_path)] == ["red.png"]
    assert "skipped 1 unreadable files in" in caplog.text and "broken.jpg" in caplog.text


def test_calibration_tensors_are_preprocessed_as_the_served_model_wants():
    spec = load_child(MODELS, "efficientnet_lite0_onnx").preprocess
    tensors = calibration_tensors(MODELS.parent / "samples", spec, limit=2)
    assert tensors.shape == (4, *spec.input_shape)  # two images and their mirror images
    assert -1.01 <= tensors.min() and tensors.max() <= 1.01  # (x - 127) / 128, not ImageNet's mean/std


def _onnx_bytes() -> bytes:
    # ir_version 8, then a graph (field 7) of 3 bytes: the smallest shape the check accepts.
    return b"\x08\x08" + b"\x3a\x03" + b"\x0a\x01x"


def test_artifact_problem_finds_truncated_and_foreign_engines(tmp_path):
    good = tmp_path / "good.onnx"
    good.write_bytes(_onnx_bytes())
    assert artifact_problem(good) is None
    (tmp_path / "cut.onnx").write_bytes(_onnx_bytes()[:-1])
    assert "truncated" in artifact_problem(tmp_path / "cut.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert artifact_problem(tmp_path / "empty.onnx") == "the file is empty"
    (tmp_path / "html.onnx").write_bytes(b"<html>404 Not Found</html>")
    assert "not an ONNX model" in artifact_problem(tmp_path / "html.onnx")
    ir = tmp_path / "model.xml"
    ir.write_text('<?xml version="1.0"?><net name="m"><layers><layer><data offset="0" '
                  'size="64"/></layer></layers></net>')
    assert "model.bin (its weights) is missing" == artifact_problem(ir)
    ir.with_suffix(".bin").write_bytes(bytes(10))
    assert "shorter (10 bytes) than the IR needs (64)" in artifact_problem(ir)
    ir.with_suffix(".bin").write_bytes(bytes(64))
    assert artifact_problem(ir) is None
    (tmp_path / "cut.xml").write_text('<?xml version="1.0"?><net name="m"><layers>')
    assert "not an OpenVINO IR" in artifact_problem(tmp_path / "cut.xml")


def test_bls_serve_skips_a_missing_or_corrupt_engine_and_says_why(tmp_path):
    repo = tmp_path / "models"
    shutil.copytree(MODELS, repo,
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.json", "*.xml", "*.bin", "*.plan",
                                                                 "__pycache__"))
    for name in ("resnet50_onnx", "efficientnet_lite0_onnx"):
        (repo / name / "1" / "model.onnx").write_bytes(b"")  # exported (the ONNX is not checked: onnx.checker did)
    (repo / "resnet50_int8" / "1" / "model.onnx").write_bytes(_onnx_bytes()[:-1])  # a build cut short
    (repo / "efficientnet_lite0_int8" / "1" / "model.onnx").write_bytes(_onnx_bytes())
    plan = plan_loading(repo, {"python"}, only=("classify_bls",))
    assert "efficientnet_lite0_int8" in plan.load and "resnet50_onnx" in plan.load and "classify_bls" in plan.load
    assert plan.skipped["resnet50_int8"].startswith("resnet50_int8/1/model.onnx is unusable (truncated")
    assert "engine_build int8 --model resnet50 --method onnxruntime" in plan.skipped["resnet50_int8"]
    assert plan.skipped["resnet50_openvino"].startswith("resnet50_openvino/1/model.xml is missing")
    assert "engine_build int8 --model resnet50 (NNCF's INT8" in plan.skipped["resnet50_openvino"]


def test_bls_bench_runs_an_engine_behind_classify_bls_and_alone(tmp_path):
    from bls_pipeline.tools.bench_sweep import Point, ratios
    from bls_pipeline.tools.bench_targets import served_model, bench_repository, build_request
    from bls_pipeline.serve.client import tritonclient_module

    src = tmp_path / "models"
    shutil.copytree(MODELS, src,
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.json", "*.xml", "*.bin", "*.plan",
                                                                "__pycache__"))
    bench_repository(src, tmp_path / "bench", keep_branches=False, engines=("resnet50_int8",))
    variant = string_parameters(parse_config(tmp_path / "bench" / served_model("classify_bls@resnet50_int8")))
    assert ((variant["classifiers"], variant["cascade_classifiers"], variant["tta_threshold"])
            == ("resnet50_int8", "none", "0"))
    # The FP32 baseline stays FP32 onnxruntime whatever engine comes first in the shipped list.
    assert string_parameters(parse_config(tmp_path / "bench" / "classify_bls"))["classifiers"] == "resnet50_onnx"
    tc = tritonclient_module("http")
    model, inputs, _ = build_request(tc, "classifier@resnet50_int8", np.zeros((1, 3, 224, 224), np.float32))
    assert model == "resnet50_int8" and inputs[0].name() == "input"

    def point(target, c, ips, p50):
        return Point(target, c, ips, p50, p50, p50, 100, 0, 0.0, 0.0)

    runs = {(t, c): [point(t, c, ips * (1 if c == 1 else 2), p50)]
            for t, ips, p50 in (("classify_bls", 20, 50), ("classifier", 22, 45),
                                ("classify_bls@resnet50_int8", 60, 30),
                                ("classifier@resnet50_int8", 70, 20)) for c in (1, 8)}
    median, _ = ratios(runs, [])
    assert median["classify_bls@resnet50_int8 / classify_bls images/s at c=8"] == 3.0
    assert median["classify_bls@resnet50_int8 p50 / classify_bls p50 at c=1"] == 0.6
    assert median["classifier@resnet50_int8 / classifier images/s at c=8"] == 70 / 22


def test_engine_build_int8_stops_on_a_folder_with_no_image_and_names_it(tmp_path, capsys):
    from engine_build.cli import main

    (tmp_path / "readme.txt").write_text("no photos here")
    assert main(["int8", "--calibration", str(tmp_path), "--output", str(tmp_path / "out.xml")]) == 2
    assert f"error: calibration folder {tmp_path} has no readable image" in capsys.readouterr().err
    assert not (tmp_path / "out.xml").exists()
