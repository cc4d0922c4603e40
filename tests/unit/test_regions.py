"""Regions, tensors between children and extra outputs, through LocalFlow: the same runtime
as inside Triton, with numpy children.

The test repository: `det` finds the red, green and blue rectangles of a white image
(UINT8 64x64 stretched, boxes normalised, padded, with a count), `colour` names a region's
colour from its 8x8 crop, `head` turns a colour's probabilities into one score (a tensor
input, no image). Images are drawn here, so every box and colour is known.
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bls_pipeline.flow import FlowError, LocalFlow, RequestFailed
from bls_pipeline.runtime.results import ImageRequest, RequestError
from bls_pipeline.base.errors import ConfigError

COLOURS = {"red": (255, 0, 0), "green": (0, 160, 0), "blue": (0, 0, 255)}

DET = """
name: "det"
max_batch_size: 8
input [ { name: "image", data_type: TYPE_UINT8, dims: [ 64, 64, 3 ] } ]
output [
  { name: "BOXES", data_type: TYPE_FP32, dims: [ -1, 4 ] },
  { name: "SCORES", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "COUNT", data_type: TYPE_INT32, dims: [ 1 ] }
]
parameters { key: "preprocess_resize_mode", value: { string_value: "stretch" } }
parameters { key: "boxes_output", value: { string_value: "BOXES" } }
parameters { key: "boxes_units", value: { string_value: "normalized" } }
parameters { key: "box_scores_output", value: { string_value: "SCORES" } }
parameters { key: "count_output", value: { string_value: "COUNT" } }
"""

COLOUR = """
name: "colour"
max_batch_size: 4
input [ { name: "crop", data_type: TYPE_UINT8, dims: [ 8, 8, 3 ] } ]
output [ { name: "probs", data_type: TYPE_FP32, dims: [ 3 ], label_filename: "labels.txt" } ]
parameters { key: "preprocess_resize_mode", value: { string_value: "stretch" } }
parameters { key: "output_scores", value: { string_value: "probabilities" } }
"""

HEAD = """
name: "head"
max_batch_size: 16
input [ { name: "features", data_type: TYPE_FP32, dims: [ 3 ] } ]
output [ { name: "score", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""

FLOW_CONFIG = """
name: "regions_flow"
backend: "python"
max_batch_size: 16
input [ { name: "IMAGE", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [
  { name: "LABELS", data_type: TYPE_STRING, dims: [ -1 ] },
  { name: "SCORES", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "CLASS_IDS", data_type: TYPE_INT32, dims: [ -1 ] },
  { name: "ROUTE", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "REGION_COUNT", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "REGION_BOXES", data_type: TYPE_FP32, dims: [ -1, 4 ] },
  { name: "REGION_LABELS", data_type: TYPE_STRING, dims: [ -1, -1 ] },
  { name: "REGION_ROUTE", data_type: TYPE_STRING, dims: [ -1 ] },
  { name: "REGION_HEAD", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "NEEDS_REVIEW", data_type: TYPE_BOOL, dims: [ 1 ] }
]
parameters { key: "default_topk", value: { string_value: "1" } }
"""

FLOW = '''
import numpy as np

from bls_pipeline.flow import Answer, Batch, Candidates, Settings


class RegionSettings(Settings):
    detector: Candidates = "det"
    colour: Candidates = "colour"
    head: Candidates = "head"
    min_size: float = 0.0
    margin: float = 0.0


def flow(batch: Batch, settings: RegionSettings) -> Answer:
    answer = batch.answer()
    found = batch.infer(settings.detector)
    regions = batch.regions(found, margin=settings.margin, min_size=settings.min_size)
    per_region = regions.answer().skip(regions.too_small, "too_small")
    colours = regions.classify(settings.colour)
    head = regions.infer(settings.head, rows=colours.covered, inputs={"features": colours.probs})
    per_region.set(colours, "colour")
    per_region.output("REGION_HEAD", np.nan_to_num(head["score"][:, 0]))
    blue = np.bincount(regions.image[colours.top1_class == 2], minlength=len(batch)) > 0
    answer.skip(~blue, "no_blue").skip(blue, "blue")
    answer.output("NEEDS_REVIEW", np.bincount(regions.image, minlength=len(batch)) == 0)
    return answer.attach(per_region)
'''


def picture(rects: list[tuple[str, tuple[int, int, int, int]]], size=(64, 48), fmt="PNG") -> bytes:
    img = Image.new("RGB", size, (255, 255, 255))
    for colour, (x0, y0, x1, y1) in rects:
        img.paste(COLOURS[colour], (x0, y0, x1, y1))
    buf = io.BytesIO()
    img.save(buf, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buf.getvalue()


def find_rectangles(batch: np.ndarray) -> dict[str, np.ndarray]:
    """det: the bounding box of each colour present, normalised; padded; scored 0.9."""
    found = []
    for image in batch.astype(np.int32):
        boxes = []
        for rgb in COLOURS.values():
            mask = (np.abs(image - np.array(rgb)).sum(axis=2) < 60)
            if mask.sum() > 2:
                ys, xs = np.nonzero(mask)
                boxes.append([xs.min() / 64, ys.min() / 64, (xs.max() + 1) / 64, (ys.max() + 1) / 64])
        found.append(boxes)
    most = max(1, max(len(b) for b in found))
    boxes = np.zeros((len(batch), most, 4), np.float32)
    for i, b in enumerate(found):
        boxes[i, :len(b)] = np.reshape(b, (-1, 4))
    return {"BOXES": boxes, "SCORES": np.full((len(batch), most), 0.9, np.float32),
            "COUNT": np.array([[len(b)] for b in found], np.int32)}


def name_colour(batch: np.ndarray) -> np.ndarray:
    mean = batch.reshape(len(batch), -1, 3).mean(axis=1)
    distance = np.stack([np.abs(mean - np.array(rgb)).sum(axis=1) for rgb in COLOURS.values()], axis=1)
    probs = np.exp(-distance / 20)
    return (probs / probs.sum(axis=1, keepdims=True)).astype(np.float32)


def head_score(features: np.ndarray) -> np.ndarray:
    return features[:, 2:3] * 10  # "blueness"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())


def make_repo(tmp_path: Path) -> Path:
    """The three children and the regions flow, in a model repository at tmp_path."""
    _write(tmp_path / "det" / "config.pbtxt", DET)
    _write(tmp_path / "colour" / "config.pbtxt", COLOUR)
    _write(tmp_path / "colour" / "labels.txt", "red\ngreen\nblue\n")
    _write(tmp_path / "head" / "config.pbtxt", HEAD)
    _write(tmp_path / "regions_flow" / "config.pbtxt", FLOW_CONFIG)
    _write(tmp_path / "regions_flow" / "1" / "flow.py", FLOW)
    return tmp_path


@pytest.fixture
def repo(tmp_path) -> Path:
    return make_repo(tmp_path)


CHILDREN = {"det": find_rectangles, "colour": name_colour, "head": head_score}


def local(repo: Path, **kwargs) -> LocalFlow:
    return LocalFlow(repo / "regions_flow", {**CHILDREN, **kwargs.pop("models", {})}, **kwargs)


def test_every_region_of_every_request_goes_in_one_call(repo):
    first = picture([("red", (4, 4, 20, 20)), ("blue", (30, 10, 60, 40))])
    second = picture([("green", (10, 20, 40, 44))])
    empty = picture([])
    with local(repo) as flow:
        results, _ = flow.run([ImageRequest([first, second]), ImageRequest([empty])])
    assert flow.calls == [("det", 3), ("colour", 3), ("head", 3)]  # 3 regions, one call each
    both, none = results
    assert both.routes[:, 0].tolist() == [b"blue", b"no_blue"]
    region = both.outputs
    assert region["REGION_COUNT"][:, 0].tolist() == [2, 1]
    assert region["REGION_BOXES"].shape == (2, 2, 4)  # padded to the most regions of the request's images
    np.testing.assert_allclose(region["REGION_BOXES"][0], [[4, 4, 20, 20], [30, 10, 60, 40]], atol=1.01)
    np.testing.assert_allclose(region["REGION_BOXES"][1, 0], [10, 20, 40, 44], atol=1.01)
    assert region["REGION_BOXES"][1, 1].tolist() == [0, 0, 0, 0]
    labels = [[label.decode().split(":")[-1] for label in row[:, 0]] for row in region["REGION_LABELS"]]
    assert labels == [["red", "blue"], ["green", ""]]
    assert region["REGION_ROUTE"].tolist() == [[b"colour:colour", b"colour:colour"], [b"colour:colour", b""]]
    assert region["REGION_HEAD"][0, 1] > 9 and region["REGION_HEAD"][0, 0] < 1
    assert region["NEEDS_REVIEW"][:, 0].tolist() == [False, False]
    # An image with no region: an ordinary answer, with no region rows.
    assert none.routes[0, 0] == b"no_blue" and none.outputs["REGION_COUNT"].tolist() == [[0]]
    assert none.outputs["REGION_BOXES"].shape == (1, 0, 4) and none.outputs["NEEDS_REVIEW"].tolist() == [[True]]


def test_regions_are_cut_from_the_image_at_full_resolution_with_a_margin(repo):
    seen = []

    def record(batch):
        seen.append(batch.copy())
        return name_colour(batch)

    image = picture([("red", (8, 8, 24, 24))], size=(320, 240))
    with local(repo, models={"colour": record}, parameters={"margin": "0.5"}) as flow:
        flow.classify([image])
    (crop,) = seen[0]
    # The box is 16x16 of the 64x64 stretched input = 80x60 of the image: with a 50% margin the
    # crop is 160x120 around it, the red box in its middle half.
    assert (crop[3:5, 3:5] == (255, 0, 0)).all() and (crop[0, 0] > 240).all()


def test_small_regions_are_never_sent_and_answered_by_the_flow(repo):
    image = picture([("red", (2, 2, 8, 8)), ("blue", (20, 10, 60, 40))])  # red: 6x6 pixels
    with local(repo, parameters={"min_size": "10"}) as flow:
        prediction = flow.classify([image])
    assert flow.calls == [("det", 1), ("colour", 1), ("head", 1)]
    assert prediction.outputs["REGION_ROUTE"].tolist() == [[b"too_small", b"colour:colour"]]
    assert prediction.outputs["REGION_LABELS"][0, 0, 0] == b""


def test_too_many_regions_fail_that_request_only(repo):
    busy = picture([("red", (2, 2, 8, 8)), ("green", (10, 10, 20, 20)), ("blue", (30, 30, 40, 40))])
    calm = picture([("blue", (30, 30, 40, 40))])
    with local(repo, parameters={"max_regions_per_image": "2"}) as flow:
        (failed, answered), _ = flow.run([ImageRequest([calm, busy]), ImageRequest([calm])])
    assert isinstance(failed, RequestError) and failed.reason == "too_many_regions"
    assert failed.message == "IMAGE[1]: det found 3 regions on it, over max_regions_per_image=2"
    assert answered.routes[0, 0] == b"blue"
    # Nothing of the failed request was sent on: neither the busy image's regions nor its calm one's.
    assert flow.calls[1] == ("colour", 1)


@pytest.mark.parametrize(("boxes", "kept"), [
    ([[0.1, 0.1, 0.5, 0.5]], [[6.4, 4.8, 32, 24]]),
    ([[np.nan, 0.1, 0.5, 0.5]], []),  # non-finite: dropped
    ([[0.5, 0.5, 0.1, 0.1]], []),  # inverted: dropped
    ([[1.5, 1.5, 2.0, 2.0]], []),  # outside: nothing left after clipping
    ([[0.2, 0.2, 0.2, 0.6]], []),  # empty
    ([[-0.5, 0.5, 0.25, 1.5]], [[0, 24, 16, 48]]),  # clipped to the image
])
def test_bad_boxes_are_clipped_or_dropped(repo, boxes, kept):
    def detector(batch):
        n = len(batch)
        return {"BOXES": np.array([boxes] * n, np.float32), "SCORES": np.ones((n, 1), np.float32),
                "COUNT": np.ones((n, 1), np.int32)}

    with local(repo, models={"det": detector}) as flow:
        prediction = flow.classify([picture([])])
    np.testing.assert_allclose(prediction.outputs["REGION_BOXES"][0], np.array(kept).reshape(-1, 4), atol=1e-4)


def test_a_detector_output_of_the_wrong_shape_fails_that_execute_naming_it(repo):
    def flat(batch):
        return {"BOXES": np.zeros((len(batch), 4, 4), np.float32), "SCORES": np.zeros((len(batch), 3), np.float32),
                "COUNT": np.zeros((len(batch), 1), np.int32)}

    with local(repo, models={"det": flat}) as flow, pytest.raises(RequestFailed) as info:
        flow.classify([picture([])])
    assert "detector det returned SCORES with shape (1, 3)" in str(info.value)


def test_a_detector_output_of_the_wrong_shape_fails_only_the_requests_it_ran_on(repo):
    (repo / "regions_flow" / "1" / "flow.py").write_text(FLOW.replace(
        "found = batch.infer(settings.detector)",
        'found = batch.infer(settings.detector, rows=batch.request_id != "no_det")'))

    def flat(batch):
        return {"BOXES": np.zeros((len(batch), 4, 4), np.float32), "SCORES": np.zeros((len(batch), 3), np.float32),
                "COUNT": np.zeros((len(batch), 1), np.int32)}

    with local(repo, models={"det": flat}) as flow:
        failed, answered = flow.run([ImageRequest([picture([])], id="det"),
                                     ImageRequest([picture([])], id="no_det")])[0]
    assert (failed.reason, failed.code) == ("det", "INTERNAL") and "detector det returned SCORES" in failed.message
    assert answered.routes[0, 0] == b"no_blue"


def test_boxes_come_back_in_the_pixels_of_the_image_as_sent_when_decoded_smaller(repo):
    image = picture([("blue", (400, 300, 800, 600))], size=(1200, 900), fmt="JPEG")
    with local(repo) as flow:  # draft_min_side 256: the JPEG is decoded at 1/2 or 1/4 scale
        prediction = flow.classify([image])
    np.testing.assert_allclose(prediction.outputs["REGION_BOXES"][0, 0], [400, 300, 800, 600], atol=20)


def test_min_score_drops_the_boxes_scored_under_it(repo):
    def detector(batch):
        n = len(batch)
        boxes = np.tile(np.array([[[0.0, 0.0, 0.25, 0.25], [0.5, 0.5, 1.0, 1.0]]], np.float32), (n, 1, 1))
        return {"BOXES": boxes, "SCORES": np.tile(np.array([[0.3, 0.9]], np.float32), (n, 1)),
                "COUNT": np.full((n, 1), 2, np.int32)}

    (repo / "regions_flow" / "1" / "flow.py").write_text(FLOW.replace("min_size=settings.min_size)",
                                                                      "min_size=settings.min_size, min_score=0.5)"))
    with local(repo, models={"det": detector}) as flow:
        prediction = flow.classify([picture([])])
    assert prediction.outputs["REGION_COUNT"].tolist() == [[1]]
    np.testing.assert_allclose(prediction.outputs["REGION_BOXES"][0], [[32, 24, 64, 48]], atol=1e-4)


def test_min_score_on_a_detector_without_scores_is_the_flows_error(repo):
    _write(repo / "det" / "config.pbtxt", DET.replace(
        'parameters { key: "box_scores_output", value: { string_value: "SCORES" } }\n', ""))
    (repo / "regions_flow" / "1" / "flow.py").write_text(FLOW.replace("min_size=settings.min_size)",
                                                                      "min_size=settings.min_size, min_score=0.5)"))
    with pytest.raises(ConfigError, match=r"regions\(min_score=0.5\) needs box scores, and det's config.pbtxt names no "
                                          r"box_scores_output"):
        local(repo)


def test_regions_of_regions(repo, tmp_path):
    text = FLOW.replace('''    colours = regions.classify(settings.colour)''',
                        '''    inner = regions.regions(regions.infer(settings.detector))
    if len(regions):  # not on the load check's probe image, which has none
        assert len(inner) == 2 and (inner.image == 0).all() and (inner.parent == [0, 1]).all(), inner
        np.testing.assert_allclose(inner.box, regions.box, atol=2.5)
    colours = regions.classify(settings.colour)''')
    (repo / "regions_flow" / "1" / "flow.py").write_text(text)
    image = picture([("red", (4, 4, 20, 20)), ("blue", (40, 4, 60, 20))])
    with local(repo) as flow:
        flow.classify([image])
    assert flow.calls[:2] == [("det", 1), ("det", 2)]  # the detector on the image, then on its two regions


def test_repeated_rows_are_an_error_naming_them(repo):
    text = FLOW.replace("    colours = regions.classify(settings.colour)",
                        "    batch.classify(settings.colour, rows=[0, 0])\n    colours = "
                        "regions.classify(settings.colour)")
    (repo / "regions_flow" / "1" / "flow.py").write_text(text)
    with pytest.raises(ConfigError, match=r"rows= repeats row\(s\) \[0\]"):
        local(repo)


def test_a_declared_output_the_flow_never_fills_fails_the_load(repo):
    text = FLOW.replace('    answer.output("NEEDS_REVIEW", np.bincount(regions.image, minlength=len(batch)) == 0)\n',
                        "")
    (repo / "regions_flow" / "1" / "flow.py").write_text(text)
    with pytest.raises(ConfigError, match=r"declares output\(s\) NEEDS_REVIEW, which the answer did not fill"):
        local(repo)


def test_declared_region_outputs_need_an_attached_answer(repo):
    (repo / "regions_flow" / "1" / "flow.py").write_text(FLOW.replace("return answer.attach(per_region)",
                                                                      "return answer"))
    with pytest.raises(ConfigError, match="declares REGION_COUNT, REGION_BOXES, REGION_LABELS, REGION_ROUTE, and the "
                                          "answer attached no regions"):
        local(repo)


def test_tensor_inputs_are_checked_against_the_childs_config(repo):
    bad = FLOW.replace('inputs={"features": colours.probs}', 'inputs={"features": colours.probs[:, :2]}')
    (repo / "regions_flow" / "1" / "flow.py").write_text(bad)
    picture_of_blue = picture([("blue", (30, 10, 60, 40))])
    with local(repo, check=False) as flow, pytest.raises(RequestFailed) as info:
        flow.classify([picture_of_blue])
    assert "inputs['features'] has dims [2] per row; model head declares [3] (TYPE_FP32)" in str(info.value)
    wrong_kind = FLOW.replace('inputs={"features": colours.probs}', 'inputs={"features": colours.probs > 0.5}')
    (repo / "regions_flow" / "1" / "flow.py").write_text(wrong_kind)
    with local(repo, check=False) as flow, pytest.raises(RequestFailed) as info:
        flow.classify([picture_of_blue])
    assert "inputs['features'] is bool; model head declares TYPE_FP32" in str(info.value)


def test_a_column_passes_outputs_on_without_reading_them(repo):
    text = FLOW.replace('    head = regions.infer(settings.head, rows=colours.covered, '
                        'inputs={"features": colours.probs})',
                        '''    raw = regions.infer(settings.colour)
    head = regions.infer(settings.head, inputs={"features": raw.tensor("probs")})''')
    (repo / "regions_flow" / "1" / "flow.py").write_text(text)
    with local(repo) as flow:
        prediction = flow.classify([picture([("blue", (30, 10, 60, 40))])])
    assert prediction.outputs["REGION_HEAD"][0, 0] > 9


def test_the_flow_may_only_fill_declared_outputs(repo):
    text = FLOW.replace('answer.output("NEEDS_REVIEW"', 'answer.output("NEEDS_REVEIW"')
    (repo / "regions_flow" / "1" / "flow.py").write_text(text)
    with pytest.raises(ConfigError, match=r"declares no output NEEDS_REVEIW in its config.pbtxt \(its own outputs: "
                                          r"REGION_HEAD, NEEDS_REVIEW\)"):
        local(repo)


def test_rotate_feeds_the_rows_upside_down(repo):
    seen = []

    def record(batch):
        seen.append(batch.copy())
        return name_colour(batch)

    text = FLOW.replace("    colours = regions.classify(settings.colour)",
                        "    regions.classify(settings.colour, rotate=180)\n    colours = "
                        "regions.classify(settings.colour)")
    (repo / "regions_flow" / "1" / "flow.py").write_text(text)
    image = picture([("red", (4, 4, 20, 12)), ("blue", (4, 12, 20, 20))])  # one region: red above blue
    with local(repo, models={"colour": record, "det": _one_box}) as flow:
        flow.classify([image])
    upright, rotated = seen[-1], seen[-2]
    np.testing.assert_array_equal(rotated, upright[:, ::-1, ::-1])


def _one_box(batch):
    n = len(batch)
    return {"BOXES": np.tile(np.array([[[4 / 64, 4 / 48, 20 / 64, 20 / 48]]], np.float32), (n, 1, 1)),
            "SCORES": np.ones((n, 1), np.float32), "COUNT": np.ones((n, 1), np.int32)}


def test_regions_without_regions_in_the_flow_api_are_a_flow_error(repo):
    text = FLOW.replace("regions = batch.regions(found,", "regions = batch.regions(batch.infer(settings.colour),")
    (repo / "regions_flow" / "1" / "flow.py").write_text(text)
    with pytest.raises(ConfigError,
                       match="regions\\(\\) needs a detector, and colour's config.pbtxt names no boxes_output"):
        local(repo)
    assert issubclass(FlowError, RuntimeError)


@pytest.mark.parametrize(("pad", "box_in", "units"), [
    ("bottom_right", [0, 0, 32, 16], "pixels"),
    ("centre", [0, 16, 32, 32], "pixels"),
    ("centre", [0, 0.25, 0.5, 0.5], "normalized"),
])
def test_boxes_go_back_through_the_detectors_letterbox(pad, box_in, units):
    from bls_pipeline.runtime.decode.boxes import found_boxes
    from bls_pipeline.runtime.load.children import ChildModel, Detector
    from bls_pipeline.base.tensors import TensorInfo
    from bls_pipeline.stages.preprocess import PreprocessSpec

    spec = PreprocessSpec(mode="keep_aspect", crop=64, pad=pad)
    child = ChildModel("letterboxed", 4, TensorInfo("image", "FP32", (3, 64, 64)),
                       (TensorInfo("BOXES", "FP32", (-1, 4)),), spec, detector=Detector("BOXES", units))
    # A 200x100 image fills 64x32 of the input: at the top, or centred (16 rows of padding above).
    found = found_boxes(child, {"BOXES": np.array([[box_in]], np.float32)}, np.array([0]),
                        np.array([[0.0, 0.0, 200.0, 100.0]]), np.ones(1))
    np.testing.assert_allclose(found.boxes, [[0, 0, 100, 50]], atol=1e-6)
    # Found in a region (the source box 300..500 x 40..140 of its image): offset by it.
    found = found_boxes(child, {"BOXES": np.array([[box_in]], np.float32)}, np.array([0]),
                        np.array([[300.0, 40.0, 500.0, 140.0]]), np.ones(1))
    np.testing.assert_allclose(found.boxes, [[300, 40, 400, 90]], atol=1e-6)


@pytest.mark.parametrize("count", [np.zeros((2, 2), np.int32), np.zeros(0, np.int32)])
def test_a_count_output_of_the_wrong_shape_fails_naming_the_detector(count):
    from bls_pipeline.runtime.decode.boxes import found_boxes
    from bls_pipeline.runtime.load.children import ChildModel, Detector
    from bls_pipeline.base.tensors import TensorInfo
    from bls_pipeline.runtime.errors import ChildCallError
    from bls_pipeline.stages.preprocess import PreprocessSpec

    child = ChildModel("det", 4, TensorInfo("image", "FP32", (3, 64, 64)),
                       (TensorInfo("BOXES", "FP32", (-1, 4)), TensorInfo("COUNT", "INT32", (1,))),
                       PreprocessSpec(crop=64), detector=Detector("BOXES", "pixels", count="COUNT"))
    boxes = np.zeros((2, 3, 4), np.float32)
    sources, scales = np.array([[0.0, 0.0, 64.0, 64.0]] * 2), np.ones(2)
    with pytest.raises(ChildCallError) as info:
        found_boxes(child, {"BOXES": boxes, "COUNT": count}, np.arange(2), sources, scales)
    assert f"detector det returned COUNT with shape {count.shape}" in str(info.value)
    assert "(2, 1), one count per row" in str(info.value)
