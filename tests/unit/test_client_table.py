"""bls-classify's table and --json lines: every line of the table one line, whatever the
flow's outputs hold; --json one object per image."""

import json

from bls_pipeline.serve.client import FileResult, format_table

SIGN = {"route": "text_detector:text", "labels": [], "scores": [], "class_ids": [],
        "outputs": {"TEXT": "TRITON AVE\nFRAGILE", "NEEDS_REVIEW": True},
        "regions": [{"box": [92.5, 81.5, 384.4, 126.4], "route": "text_orientation:upright", "labels": ["0"],
                     "scores": [0.998], "class_ids": [0],
                     "outputs": {"REGION_TEXT": "TRITON AVE", "REGION_CONFIDENCE": 0.98401319}},
                    {"box": [1, 2, 3, 4], "route": "faint", "labels": [], "scores": [], "class_ids": [],
                     "outputs": {"REGION_TEXT": "", "REGION_CONFIDENCE": None}}]}


def test_a_region_flows_answer_prints_one_line_per_output_and_region():
    lines = format_table([FileResult("samples/sign.png", document=SIGN)]).splitlines()
    assert lines[1].split() == ["sign.png", "-", "(no", "label)", "text_detector:text"]
    assert lines[2].strip() == 'TEXT: "TRITON AVE\\nFRAGILE"'  # line breaks shown, not printed
    assert lines[3].strip() == "NEEDS_REVIEW: True"
    assert lines[4].split("  ")[-2:] == ["REGION_TEXT: TRITON AVE", "REGION_CONFIDENCE: 0.984"]
    assert lines[4].strip().startswith("region 0 [92,82,384,126]  0 (1.00)  text_orientation:upright")
    assert lines[5].strip() == 'region 1 [1,2,3,4]  (no label)  faint  REGION_TEXT: ""  REGION_CONFIDENCE: None'
    assert len(lines) == 6


def test_labels_print_one_row_each_with_the_route_on_the_first():
    mug = {"route": "efficientnet_lite0_onnx:confident", "labels": ["coffee mug", "cup"], "scores": [0.925, 0.07],
           "class_ids": [504, 968]}
    lines = format_table([FileResult("samples/mug.jpg", document=mug),
                          FileResult("samples/x.jpg", error="IMAGE[0]: bad")])
    assert lines.splitlines()[1:] == ["mug.jpg   0.925  coffee mug (504)              "
                                      "efficientnet_lite0_onnx:confident", "          0.070  cup (968)",
                                      "x.jpg         -  error: IMAGE[0]: bad"]


def test_json_lines_name_the_file_and_hold_the_document_or_the_error():
    good, bad = FileResult("samples/sign.png", document=SIGN), FileResult("samples/x.jpg",
                                                                          error="IMAGE[0]: not an image")
    assert json.loads(good.json_line()) == {"file": "samples/sign.png", **SIGN}
    assert json.loads(bad.json_line()) == {"file": "samples/x.jpg", "error": "IMAGE[0]: not an image"}
    assert "\n" not in good.json_line()  # one line per image, even with a line break in TEXT
    # as text, not \\u escapes
    assert "Straße" in FileResult("s.png", document={"outputs": {"TEXT": "Straße"}}).json_line()
