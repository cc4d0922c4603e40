"""The JSON output: each image's answer as one document, built from the tensors of a response
(runtime/answer/answer_json.py), and written by the runtime for a flow model that declares it."""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bls_pipeline.flow import LocalFlow
from bls_pipeline.runtime.answer.answer_json import documents, encode
from bls_pipeline.runtime.results import ImageRequest
from bls_pipeline.base.errors import ConfigError


def _no_nan(text: str):
    raise AssertionError(f"not JSON: {text}")


def strict(data: bytes) -> dict:
    """What a strict JSON reader (jq, a browser) makes of it: no NaN, no Infinity."""
    return json.loads(data.decode("utf-8"), parse_constant=_no_nan)


def region_response() -> dict[str, np.ndarray]:
    """A region flow's answer to one request of two images, as a client reads it: the first
    image has two regions, the second none, so its region rows are all padding."""
    return {
        "LABELS": np.array([[b""], [b""]], dtype=object),
        "SCORES": np.zeros((2, 1), np.float32),
        "CLASS_IDS": np.full((2, 1), -1, np.int32),
        "ROUTE": np.array([[b"det:text"], [b"det:no_text"]], dtype=object),
        "TEXT": np.array([["Straße\n東京".encode()], [b""]], dtype=object),
        "REGION_COUNT": np.array([[2], [0]], np.int32),
        "REGION_BOXES": np.array([[[1.5, 2, 30, 40], [5, 6, 7, 8]], [[0, 0, 0, 0], [0, 0, 0, 0]]], np.float32),
        "REGION_LABELS": np.array([[[b"0.930000:0:0"], [b""]], [[b""], [b""]]], dtype=object),
        "REGION_SCORES": np.array([[[0.93], [0]], [[0], [0]]], np.float32),
        "REGION_CLASS_IDS": np.array([[[0], [-1]], [[-1], [-1]]], np.int32),
        "REGION_ROUTE": np.array([[b"orient:upright", b"too_small"], [b"", b""]], dtype=object),
        "REGION_TEXT": np.array([["Straße".encode(), b""], [b"", b""]], dtype=object),
        "REGION_CONFIDENCE": np.array([[0.25, np.nan], [0, 0]], np.float32),
    }


DIMS = {"LABELS": (-1,), "SCORES": (-1,), "CLASS_IDS": (-1,), "ROUTE": (1,), "TEXT": (1,), "REGION_COUNT": (1,),
        "REGION_BOXES": (-1, 4), "REGION_LABELS": (-1, -1), "REGION_SCORES": (-1, -1), "REGION_CLASS_IDS": (-1, -1),
        "REGION_ROUTE": (-1,), "REGION_TEXT": (-1,), "REGION_CONFIDENCE": (-1,)}


def test_each_image_gets_its_own_regions_not_the_requests_padding():
    first, second = documents(region_response(), DIMS)
    assert first == {
        "route": "det:text", "labels": [], "scores": [], "class_ids": [],
        "outputs": {"TEXT": "Straße\n東京"},
        "regions": [
            {"box": [1.5, 2.0, 30.0, 40.0], "route": "orient:upright", "labels": ["0"], "scores": [0.93],
             "class_ids": [0], "outputs": {"REGION_TEXT": "Straße", "REGION_CONFIDENCE": 0.25}},
            {"box": [5.0, 6.0, 7.0, 8.0], "route": "too_small", "labels": [], "scores": [], "class_ids": [],
             "outputs": {"REGION_TEXT": "", "REGION_CONFIDENCE": None}},  # NaN: null
        ]}
    assert second == {"route": "det:no_text", "labels": [], "scores": [], "class_ids": [], "outputs": {"TEXT": ""},
                      "regions": []}


def test_the_document_is_strict_utf8_json_with_float32_scores_as_printed():
    tensors = {"LABELS": np.array([[b"0.930000:504:coffee mug", b"0.012000:968:cup"]], dtype=object),
               "SCORES": np.array([[0.93, 0.012]], np.float32), "CLASS_IDS": np.array([[504, 968]], np.int32),
               "ROUTE": np.array([[b"effnet:confident"]], dtype=object),
               "SHARPNESS": np.array([[np.inf]], np.float32), "FLAGS": np.array([[True, False, True]])}
    (doc,) = documents(tensors, {"ROUTE": (1,), "SHARPNESS": (1,), "FLAGS": (3,)})
    data = encode(doc)
    assert b'"scores":[0.93,0.012]' in data  # not 0.9300000071525879
    assert strict(data) == {"route": "effnet:confident", "labels": ["coffee mug", "cup"], "scores": [0.93, 0.012],
                            "class_ids": [504, 968], "outputs": {"SHARPNESS": None, "FLAGS": [True, False, True]}}
    text = encode(documents(region_response(), DIMS)[0])
    # UTF-8, not \\u escapes
    assert "Straße\\n東京".encode() in text and strict(text)["outputs"]["TEXT"] == "Straße\n東京"
    with pytest.raises(ValueError):
        encode({"score": float("nan")})


def test_without_dims_a_single_value_is_a_value_and_region_outputs_go_by_name():
    """What bls-classify builds for a model with no JSON output and no dims to hand."""
    tensors = region_response()
    (first, _) = documents(tensors)
    assert first["outputs"] == {"TEXT": "Straße\n東京"}
    assert first["regions"][0]["outputs"] == {"REGION_TEXT": "Straße", "REGION_CONFIDENCE": 0.25}
    # A per-region output not named REGION_*, told by the runtime: read per region all the same.
    tensors["LINE_TEXT"] = tensors.pop("REGION_TEXT")
    first, second = documents(tensors, DIMS, per_region={"LINE_TEXT", "REGION_CONFIDENCE"})
    assert first["regions"][0]["outputs"] == {"LINE_TEXT": "Straße", "REGION_CONFIDENCE": 0.25}
    assert "LINE_TEXT" not in first["outputs"] and second["regions"] == []


# ---- written by the runtime: a region flow in process (LocalFlow) --------------------------
DETECTOR = """
name: "det"
max_batch_size: 8
input [ { name: "image", data_type: TYPE_UINT8, dims: [ 32, 32, 3 ] } ]
output [
  { name: "BOXES", data_type: TYPE_FP32, dims: [ -1, 4 ] },
  { name: "COUNT", data_type: TYPE_INT32, dims: [ 1 ] }
]
parameters { key: "preprocess_resize_mode", value: { string_value: "stretch" } }
parameters { key: "boxes_output", value: { string_value: "BOXES" } }
parameters { key: "boxes_units", value: { string_value: "normalized" } }
parameters { key: "count_output", value: { string_value: "COUNT" } }
"""

SHADE = """
name: "shade"
max_batch_size: 8
input [ { name: "crop", data_type: TYPE_UINT8, dims: [ 4, 4, 3 ] } ]
output [ { name: "probs", data_type: TYPE_FP32, dims: [ 2 ], label_filename: "labels.txt" } ]
parameters { key: "preprocess_resize_mode", value: { string_value: "stretch" } }
parameters { key: "output_scores", value: { string_value: "probabilities" } }
"""

FLOW_CONFIG = """
name: "dark_spots"
backend: "python"
max_batch_size: 8
input [ { name: "IMAGE", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [
  { name: "LABELS", data_type: TYPE_STRING, dims: [ -1 ] },
  { name: "SCORES", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "CLASS_IDS", data_type: TYPE_INT32, dims: [ -1 ] },
  { name: "ROUTE", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "SPOTS", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "REGION_COUNT", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "REGION_BOXES", data_type: TYPE_FP32, dims: [ -1, 4 ] },
  { name: "REGION_LABELS", data_type: TYPE_STRING, dims: [ -1, -1 ] },
  { name: "REGION_ROUTE", data_type: TYPE_STRING, dims: [ -1 ] },
  { name: "SPOT_SIZE", data_type: TYPE_INT32, dims: [ -1 ] },
  { name: "SPOT_NOTE", data_type: TYPE_STRING, dims: [ -1 ] },
  { name: "JSON", data_type: TYPE_STRING, dims: [ 1 ] }
]
parameters { key: "default_topk", value: { string_value: "1" } }
"""

FLOW = '''
import numpy as np

from bls_pipeline.flow import Answer, Batch, Candidates, Settings


class SpotSettings(Settings):
    detector: Candidates = "det"
    shade: Candidates = "shade"


def flow(batch: Batch, settings: SpotSettings) -> Answer:
    spots = batch.regions(batch.infer(settings.detector))
    shades = spots.classify(settings.shade)
    per_spot = spots.answer().set(shades, "looked")
    per_spot.output("SPOT_NOTE", np.array(["tache sombre \\u00e0 " + str(i) for i in range(len(spots))], dtype=object))
    per_spot.output("SPOT_SIZE", (spots.width * spots.height).astype(np.int32))
    count = np.bincount(spots.image, minlength=len(batch)).astype(np.int32)
    answer = batch.answer().skip(count > 0, "det:spots").skip(count == 0, "det:clean")
    return answer.output("SPOTS", count).attach(per_spot)
'''


def find_dark(batch: np.ndarray) -> dict[str, np.ndarray]:
    """det: the bounding box of the dark pixels of each 32x32 image (normalised), if any."""
    boxes = np.zeros((len(batch), 1, 4), np.float32)
    count = np.zeros((len(batch), 1), np.int32)
    for i, image in enumerate(batch):
        ys, xs = np.nonzero(image.max(axis=2) < 100)
        if len(xs):
            boxes[i, 0] = [xs.min() / 32, ys.min() / 32, (xs.max() + 1) / 32, (ys.max() + 1) / 32]
            count[i, 0] = 1
    return {"BOXES": boxes, "COUNT": count}


def shade(batch: np.ndarray) -> np.ndarray:
    dark = (batch.reshape(len(batch), -1).mean(axis=1) < 100).astype(np.float32)
    return np.stack([1 - dark, dark], axis=1)


def png(spot: tuple[int, int, int, int] | None) -> bytes:
    img = Image.new("RGB", (64, 64), (250, 250, 250))
    if spot:
        img.paste((10, 10, 10), spot)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture
def repo(tmp_path) -> Path:
    for path, text in {"det/config.pbtxt": DETECTOR, "shade/config.pbtxt": SHADE, "shade/labels.txt": "light\ndark\n",
                       "dark_spots/config.pbtxt": FLOW_CONFIG, "dark_spots/1/flow.py": FLOW}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(text).lstrip())
    return tmp_path


def test_the_runtime_writes_each_images_document_from_its_answer(repo):
    with LocalFlow(repo / "dark_spots", {"det": find_dark, "shade": shade}) as flow:  # the load check runs it too
        (both, alone), _ = flow.run([ImageRequest([png((8, 16, 24, 40)), png(None)]),
                                     ImageRequest([png((0, 0, 64, 8))])])
    assert both.outputs["JSON"].shape == (2, 1) and both.outputs["JSON"].dtype == object
    spotted, clean = (strict(row) for row in both.outputs["JSON"][:, 0])
    assert spotted == {"route": "det:spots", "labels": [], "scores": [], "class_ids": [], "outputs": {"SPOTS": 1},
                       "regions": [{"box": [8.0, 16.0, 24.0, 40.0], "route": "shade:looked", "labels": ["dark"],
                                    "scores": [1.0], "class_ids": [1],
                                    "outputs": {"SPOT_SIZE": 384, "SPOT_NOTE": "tache sombre à 0"}}]}
    # Keys in the schema's order; a region's outputs in the config's, whatever order the flow filled them in.
    assert list(spotted) == ["route", "labels", "scores", "class_ids", "outputs", "regions"]
    assert list(spotted["regions"][0]) == ["box", "route", "labels", "scores", "class_ids", "outputs"]
    assert list(spotted["regions"][0]["outputs"]) == ["SPOT_SIZE", "SPOT_NOTE"]
    # The second image of the request: its region rows are padding in the tensors, none in its document.
    assert both.outputs["REGION_BOXES"].shape == (2, 1, 4)
    assert (clean
            == {"route": "det:clean", "labels": [], "scores": [], "class_ids": [], "outputs": {"SPOTS": 0},
                "regions": []})
    # The other request's image: its own region (the run's second: the clean image has none), noted as such.
    (region,) = strict(alone.outputs["JSON"][0, 0])["regions"]
    assert (region["box"] == [0.0, 0.0, 64.0, 8.0]
            and region["outputs"] == {"SPOT_SIZE": 512, "SPOT_NOTE": "tache sombre à 1"})


def test_only_the_requests_asking_for_it_get_their_documents_made(repo):
    """The server passes the outputs each client asked for: JSON is made for those that did."""
    with LocalFlow(repo / "dark_spots", {"det": find_dark, "shade": shade}) as flow:
        (labels_only, with_json), _ = flow.run([ImageRequest([png((8, 16, 24, 40))],
                                                             outputs=frozenset({"LABELS", "SPOTS"})),
                                                ImageRequest([png((8, 16, 24, 40))], outputs=frozenset({"JSON"}))])
    assert "JSON" not in labels_only.outputs and labels_only.outputs["SPOTS"].tolist() == [[1]]
    assert strict(with_json.outputs["JSON"][0, 0])["outputs"] == {"SPOTS": 1}


def test_a_flow_that_does_not_declare_it_gets_none_and_cannot_fill_it(repo):
    config = repo / "dark_spots" / "config.pbtxt"
    config.write_text(config.read_text().replace(',\n  { name: "JSON", data_type: TYPE_STRING, dims: [ 1 ] }', ""))
    with LocalFlow(repo / "dark_spots", {"det": find_dark, "shade": shade}) as flow:
        prediction = flow.classify([png((8, 16, 24, 40))])
    assert "JSON" not in prediction.outputs and prediction.outputs["SPOTS"].tolist() == [[1]]
    flow_file = repo / "dark_spots" / "1" / "flow.py"
    flow_file.write_text(flow_file.read_text().replace('return answer.output("SPOTS", count)',
                                                       'return answer.output("JSON", count).output("SPOTS", count)'))
    with pytest.raises(ConfigError,
                       match=r"answer.output\('JSON'\): the runtime writes JSON from the rest of the answer"):
        LocalFlow(repo / "dark_spots", {"det": find_dark, "shade": shade})
