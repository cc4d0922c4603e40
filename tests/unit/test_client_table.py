"""bls-classify's table: every line of it one line, whatever the flow's outputs hold."""

from bls_pipeline.serve.client import FileResult, Region, format_table


def test_a_region_flows_answer_prints_one_line_per_output_and_region():
    result = FileResult("samples/sign.png", labels=[""], route="text_detector:text",
                        outputs={"TEXT": "TRITON AVE\nFRAGILE", "NEEDS_REVIEW": True},
                        regions=[Region([92.5, 81.5, 384.4, 126.4], ["0.998:0:0"], "text_orientation:upright",
                                        {"REGION_TEXT": "TRITON AVE", "REGION_CONFIDENCE": 0.98401319}),
                                 Region([1, 2, 3, 4], [], "faint", {"REGION_TEXT": "", "REGION_CONFIDENCE": 0.0})])
    lines = format_table([result]).splitlines()
    assert lines[1].split() == ["sign.png", "-", "(no", "label)", "text_detector:text"]
    assert lines[2].strip() == 'TEXT: "TRITON AVE\\nFRAGILE"'  # line breaks shown, not printed
    assert lines[3].strip() == "NEEDS_REVIEW: True"
    assert lines[4].split("  ")[-2:] == ["REGION_TEXT: TRITON AVE", "REGION_CONFIDENCE: 0.984"]
    assert lines[4].strip().startswith("region 0 [92,82,384,126]  0 (1.00)  text_orientation:upright")
    assert lines[5].strip() == 'region 1 [1,2,3,4]  (no label)  faint  REGION_TEXT: ""  REGION_CONFIDENCE: 0.000'
    assert len(lines) == 6
