"""bls-classify --draw: boxes and captions drawn where the answer's document puts them."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from bls_pipeline.serve.client import FileResult, draw_results
from bls_pipeline.serve.draw import draw_answer, image_caption, region_caption

WHITE = (255, 255, 255)


def white_png(size=(320, 240), exif_orientation: int | None = None) -> bytes:
    img = Image.new("RGB", size, WHITE)
    buf = io.BytesIO()
    exif = Image.Exif()
    if exif_orientation:
        exif[0x0112] = exif_orientation
    img.save(buf, "PNG", exif=exif)
    return buf.getvalue()


SIGN = {"route": "text_detector:text", "labels": [], "scores": [], "class_ids": [], "outputs": {"TEXT": "TRITON AVE"},
        "regions": [{"box": [100, 120, 300, 200], "route": "text_orientation:upright", "labels": ["0"],
                     "scores": [0.99],
                     "class_ids": [0], "outputs": {"REGION_TEXT": "TRITON AVE", "REGION_CONFIDENCE": 0.98}},
                    {"box": [10, 220, 40, 230], "route": "too_small", "labels": [], "scores": [], "class_ids": [],
                     "outputs": {"REGION_TEXT": "", "REGION_CONFIDENCE": 0.0}}]}


def test_each_region_is_boxed_with_its_caption_above_and_the_rest_left_alone():
    pixels = np.asarray(draw_answer(white_png(), SIGN))
    assert pixels.shape == (240, 320, 3)
    red = (230, 25, 75)  # the first region's colour
    # The box's four sides, in the region's colour.
    for y, x in ((120, 200), (199, 200), (160, 100), (160, 299)):
        assert tuple(pixels[y, x]) == red, (y, x)
    # Inside the box and well away from every caption: untouched.
    assert (pixels[140:195, 110:290] == WHITE).all()
    assert (pixels[60:100, 200:318] == WHITE).all()
    # The caption: a band of the region's colour above the box, white text in it.
    ys, xs = np.nonzero((pixels[:120] == red).all(axis=2))
    # on the box's top left, as wide as its text
    assert ys.min() > 90 and xs.min() == 100 and 40 < xs.max() - xs.min() < 200
    band = pixels[ys.min():120, xs.min():xs.max() + 1]
    assert (band.min(axis=2) > 120).mean() > 0.05  # the text: light strokes on the band (antialiased)
    # The image's own caption in the top left corner: its route (read_text answers with no label).
    assert (pixels[0:5, 0:20] == (0, 0, 0)).all(axis=2).any()


def test_captions_say_the_text_else_the_top_label_else_the_route():
    assert region_caption(SIGN["regions"][0]) == "TRITON AVE"
    assert region_caption(SIGN["regions"][1]) == "too_small"
    assert region_caption({"route": "orient:judged", "labels": ["180"], "scores": [0.97]}) == "180 0.97"
    assert image_caption(SIGN) == "text_detector:text"
    mug = {"route": "efficientnet_lite0_onnx:confident", "labels": ["coffee mug", "cup"], "scores": [0.925, 0.07]}
    assert image_caption(mug) == "coffee mug 0.93"


def test_a_flow_without_regions_gets_its_top_label_and_nothing_else():
    mug = {"route": "efficientnet_lite0_onnx:confident", "labels": ["coffee mug"], "scores": [0.925],
           "class_ids": [504]}
    pixels = np.asarray(draw_answer(white_png(), mug))
    drawn = (pixels != WHITE).any(axis=2)
    ys, xs = np.nonzero(drawn)
    assert drawn.any() and ys.min() == 0 and xs.min() == 0  # the label's band, in the corner
    assert ys.max() < 40 and xs.max() < 240  # and nowhere else


def test_boxes_land_on_the_image_turned_upright_as_the_server_decodes_it():
    # Stored 320x240, EXIF "rotate 90 clockwise": the server (and its boxes) see it 240x320.
    drawn = draw_answer(white_png(exif_orientation=6), {"route": "r", "regions": [{"box": [20, 260, 200, 300]}]})
    assert drawn.size == (240, 320)
    assert tuple(np.asarray(drawn)[299, 100]) == (230, 25, 75)


def test_draw_writes_one_png_per_answered_file_and_keeps_same_named_ones_apart(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "sign.png").write_bytes(white_png())
    results = [FileResult(str(tmp_path / "a" / "sign.png"), document=SIGN),
               FileResult(str(tmp_path / "b" / "sign.png"), document=SIGN),
               FileResult(str(tmp_path / "broken.jpg"), error="IMAGE[0]: not an image")]
    written = draw_results(results, tmp_path / "drawn")
    assert [p.name for p in written] == ["sign.png", "sign-2.png"]
    assert sorted(p.name for p in (tmp_path / "drawn").iterdir()) == ["sign-2.png", "sign.png"]
    assert Image.open(written[0]).size == (320, 240)
