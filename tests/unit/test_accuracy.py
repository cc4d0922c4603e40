"""`python -m engine_build accuracy`: top-1/top-5 on a labelled folder, agreement with FP32 and
the gate, on a tiny colour classifier and photos made here (no ../shared, no export)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine_build.accuracy import GATE, EngineAccuracy, LabelsError, engines_of, measure, read_labels, table

MODELS = Path(__file__).resolve().parents[2] / "models"
FAMILY = "efficientnet_lite0"
# Photo colours and their classes; the classifier below answers by mean colour.
COLOURS = {"red": ((230, 20, 20), 0), "green": ((20, 230, 20), 1), "blue": ((20, 20, 230), 2),
           "yellow": ((230, 230, 20), 3)}


def _colour_classifier(path: Path, yellow_is: int = 3) -> None:
    """input (N,3,224,224) -> mean per channel -> (N,1000) logits: red 0, green 1, blue 2, yellow `yellow_is`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.zeros((3, 1000), np.float32)
    for (r, g, b), cls in ((((1, -1, -1)), 0), ((-1, 1, -1), 1), ((-1, -1, 1), 2)):
        weights[:, cls] = (r, g, b)
    weights[:, yellow_is] += (2, 2, -1)  # beats red's (1, -1, -1) on yellow: 3 against 1
    weights[:, 10:15] = np.linspace(-0.5, -0.1, 5)  # runners-up, so top-5 is defined
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["input"], ["mean"], axes=[2, 3], keepdims=0),
         helper.make_node("MatMul", ["mean", "w"], ["output"])],
        "colours", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 1000])],
        [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


@pytest.fixture
def repo(tmp_path) -> Path:
    """efficientnet_lite0's three CPU model folders, FP32 holding the colour classifier."""
    repo = tmp_path / "models"
    for kind in ("onnx", "int8", "openvino"):
        shutil.copytree(MODELS / f"{FAMILY}_{kind}", repo / f"{FAMILY}_{kind}",
                        ignore=shutil.ignore_patterns("*.onnx*", "*.xml*", "*.json", "*.bin", "__pycache__"))
    _colour_classifier(repo / f"{FAMILY}_onnx" / "1" / "model.onnx")
    return repo


@pytest.fixture
def photos(tmp_path) -> Path:
    """Two photos of each colour (a JPEG and a PNG of another size), labelled, with a column
    the tool ignores; one yellow photo labelled green (a photo the classifier gets wrong)."""
    folder = tmp_path / "labelled"
    folder.mkdir()
    rows = ["file,class_id,name"]
    for colour, (rgb, cls) in COLOURS.items():
        for name, size in ((f"{colour}.jpg", (320, 240)), (f"{colour}_small.png", (90, 120))):
            Image.new("RGB", size, rgb).save(folder / name)
            rows.append(f"{name},{1 if name == 'yellow_small.png' else cls},{colour}")
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")
    return folder


def test_labels_are_read_and_extra_columns_ignored(photos):
    rows = read_labels(photos)
    assert len(rows) == 8 and rows[0] == (photos / "red.jpg", 0)


def test_a_labelled_folder_that_cannot_be_read_says_what_is_wrong(tmp_path):
    with pytest.raises(LabelsError, match="labels.csv is missing: .*columns file,class_id"):
        read_labels(tmp_path)
    (tmp_path / "labels.csv").write_text("image,label\na.jpg,1\n")
    with pytest.raises(LabelsError, match="it needs class_id, file"):
        read_labels(tmp_path)
    (tmp_path / "labels.csv").write_text("file,class_id\na.jpg,one\n")
    with pytest.raises(LabelsError, match="line 2: class_id 'one' is not a whole number"):
        read_labels(tmp_path)
    (tmp_path / "labels.csv").write_text("file,class_id\na.jpg,1\nb.jpg,2\n")
    with pytest.raises(LabelsError, match="names 2 photos that are not in .*: a.jpg, b.jpg"):
        read_labels(tmp_path)


def test_fp32_and_each_built_engine_are_scored_against_the_labels_and_fp32(repo, photos):
    _colour_classifier(repo / f"{FAMILY}_int8" / "1" / "model.onnx")  # an engine that answers as FP32
    wrong = photos.parent / "wrong" / "model.onnx"
    _colour_classifier(wrong, yellow_is=5)  # one that calls yellow class 5
    assert [e.name for e in engines_of(repo, FAMILY, [wrong])] == ["fp32", "int8", str(wrong)]
    fp32, same, other = measure(repo, FAMILY, photos, extra=[wrong], batch=3)
    # yellow_small is labelled green
    assert (fp32.images, fp32.top1, fp32.agreement, fp32.ratio) == (8, 7 / 8, 1.0, 1.0)
    assert fp32.top5 == 1.0  # green is among yellow's five best
    assert (same.top1, same.agreement, same.passes) == (7 / 8, 1.0, True)
    assert (other.top1, other.agreement) == (6 / 8, 6 / 8)  # both yellow photos change class; one was right
    assert other.ratio == pytest.approx(6 / 7) and not other.passes
    assert all(r.ms_per_image > 0 for r in (fp32, same, other))
    text = table([fp32, same, other])
    assert "| fp32 | - | 87.5% |" in text and "(reference)" in text and "| passes |" in text
    assert "no: top-1 75.0% is 0.857 of FP32's (needs 0.99); top-1 agreement with FP32 75.0% (needs 98%)" in text


def test_an_openvino_engine_runs_with_its_served_settings(repo, photos):
    ov = pytest.importorskip("openvino",
                             reason="the OpenVINO engine needs openvino: pip install 'bls-pipeline[openvino]'")
    ir = repo / f"{FAMILY}_openvino" / "1" / "model.xml"
    ov.save_model(ov.convert_model(str(repo / f"{FAMILY}_onnx" / "1" / "model.onnx")), str(ir), compress_to_fp16=False)
    ir.with_name("model.xml.json").write_text('{"weights": "pretrained", "precision": "fp32"}')
    fp32, openvino = measure(repo, FAMILY, photos)
    assert openvino.engine == "openvino" and openvino.built_as == "precision fp32"
    assert (openvino.top1, openvino.agreement, openvino.passes) == (fp32.top1, 1.0, True)


def test_the_gate_is_mlperfs_rule():
    def result(top1, agreement):
        return EngineAccuracy("e", "", 500, top1, 0.9, agreement, top1 / 0.874, 1.0, False)

    assert GATE.passes(result(0.866, 0.98))  # 0.991 of FP32's, 98% agreement
    assert GATE.why_not(result(0.862, 0.984)) == "top-1 86.2% is 0.986 of FP32's (needs 0.99)"
    assert GATE.why_not(result(0.874, 0.968)) == "top-1 agreement with FP32 96.8% (needs 98%)"


def test_the_command_prints_the_table_and_names_a_missing_export(repo, photos, tmp_path, capsys):
    from engine_build.cli import main

    assert main(["accuracy", "--model", FAMILY, "--images", str(photos), "--model-repository", str(repo),
                 "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "on 8 labelled photos of" in out and "| fp32 | - | 87.5% | 100.0% | 100.0% | 1.000 |" in out
    assert "no engine built beside FP32" in out
    assert '"top1": 0.875' in (tmp_path / "out.json").read_text()
    (repo / f"{FAMILY}_onnx" / "1" / "model.onnx").unlink()
    assert main(["accuracy", "--model", FAMILY, "--images", str(photos), "--model-repository", str(repo)]) == 2
    assert ("model.onnx is missing: run `python -m engine_build export --model efficientnet_lite0` "
            "first" in capsys.readouterr().err)


# ---- the main job's default engine (engine_build/defaults.py) ------------------------------------
SAMPLES = MODELS.parent / "samples"


def test_the_kernel_check_compares_the_kernels_error_with_the_quantizations():
    from engine_build.defaults import MAX_KERNEL_ERROR, kernel_check

    x = np.zeros((4, 3), np.float32)
    fp32, exact = (lambda b: np.zeros((len(b), 2))), (lambda b: np.ones((len(b), 2)))  # quantization: 1.0 away
    close, far = (lambda b: np.full((len(b), 2), 1.1)), (lambda b: np.full((len(b), 2), 3.0))
    ok, bad = kernel_check(fp32, close, exact, x, batch=3), kernel_check(fp32, far, exact, x, batch=3)
    assert (ok.images, ok.quantization_mse, ok.kernel_mse) == (4, 1.0, pytest.approx(0.01)) and ok.passes
    assert bad.ratio == pytest.approx(4.0) and bad.ratio > MAX_KERNEL_ERROR and not bad.passes


def test_the_main_job_keeps_the_engine_where_the_kernels_compute_the_judged_arithmetic(repo, monkeypatch):
    from engine_build import defaults

    # The colour classifier quantizes almost exactly, so the kernels' rounding is many times its
    # quantization error: the bound is for real networks (tested above), not for this one.
    monkeypatch.setattr(defaults, "MAX_KERNEL_ERROR", float("inf"))
    said = []
    assert defaults.choose_engine(repo, FAMILY, SAMPLES, said.append) == f"{FAMILY}_int8"
    assert (repo / f"{FAMILY}_int8" / "1" / "model.onnx").is_file()
    assert f"{FAMILY}: serving INT8 ({FAMILY}_int8): the recipe judged on 500 labelled ImageNet photos" in said[-1]
    assert "distorted sample variants" in said[-1]
    # The next run finds it, says so in one line, and does not build again.
    monkeypatch.setattr(defaults, "kernel_check", None)
    assert defaults.choose_engine(repo, FAMILY, SAMPLES, said.append) == f"{FAMILY}_int8"
    assert said[-1].startswith(f"{FAMILY}: serving INT8 ({FAMILY}_int8, onnxruntime static INT8")


def test_where_the_kernels_drift_fp32_stays_and_the_reason_is_said_once_per_run(repo, monkeypatch):
    from engine_build import defaults

    monkeypatch.setattr(defaults, "MAX_KERNEL_ERROR", -1.0)  # no kernel can pass: as on AVX2 without VNNI
    said = []
    assert defaults.choose_engine(repo, FAMILY, SAMPLES, said.append) == f"{FAMILY}_onnx"
    engine = repo / f"{FAMILY}_int8" / "1" / "model.onnx"
    assert not engine.exists() and not engine.with_name("model.onnx.json").exists()  # bls-serve loads FP32 alone
    assert said[-1].startswith(f"NOTE: {FAMILY} stays FP32 ({FAMILY}_onnx): this CPU's INT8 kernels do not compute")
    assert engine.with_name("model.unavailable.json").is_file()
    said.clear()
    assert defaults.choose_engine(repo, FAMILY, SAMPLES, said.append) == f"{FAMILY}_onnx"  # recorded: not built again
    assert len(said) == 1 and "delete" in said[0] and not engine.exists()


def test_an_engine_built_on_purpose_is_left_alone_and_named(repo):
    from engine_build import defaults

    _colour_classifier(repo / f"{FAMILY}_int8" / "1" / "model.onnx")  # engine_build int8 --method onnxruntime, by hand
    said = []
    assert defaults.choose_engine(repo, FAMILY, SAMPLES, said.append) == f"{FAMILY}_int8"
    assert "built on purpose, not by the main job" in said[0]
