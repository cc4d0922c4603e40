"""bls-perf's perf_analyzer input file and request parameters: the encodings perf_analyzer 2.51
reads (tests/integration/test_perf_analyzer.py runs it on them)."""

from __future__ import annotations

import argparse
import base64
import struct

import pytest

from bls_pipeline.tools.perf import flow_counts, input_data, request_parameter, with_routes


def test_a_bytes_element_is_its_length_then_its_bytes(sample_images):
    images = [sample_images["mug"], b"x"]
    document = input_data(images)
    assert "validation_data" not in document
    for entry, image in zip(document["data"], images):
        raw = base64.b64decode(entry["IMAGE"]["b64"])
        (length,) = struct.unpack("<I", raw[:4])
        assert length == len(image) and raw[4:] == image


def test_validation_data_goes_one_entry_per_image():
    expected = [{"ROUTE": ["a:confident"]}, {"ROUTE": ["b:escalated"]}]
    assert input_data([b"1", b"2"], expected)["validation_data"] == expected
    with pytest.raises(ValueError, match="1 expected answers for 2 images"):
        input_data([b"1", b"2"], expected[:1])


def test_request_parameters_read_as_perf_analyzer_sends_them():
    assert request_parameter("skip_cascade:true:bool") == ("skip_cascade", True)
    assert request_parameter("Skip_Cascade:FALSE:bool") == ("skip_cascade", False)  # lowercased, as perf_analyzer does
    assert request_parameter("timeout:500000:int") == ("timeout", 500000)
    assert request_parameter("note:Hello:string") == ("note", "hello")
    for bad in ("timeout:500000", "skip_cascade:yes:bool", "timeout:soon:int", "x:1:float"):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME:VALUE:TYPE"):
            request_parameter(bad)


def test_only_the_images_of_the_routes_asked_stay_with_their_answers():
    expected = [{"ROUTE": ["cheap:confident"]}, {"ROUTE": ["main:escalated"]}, {"ROUTE": ["cheap:degraded"]},
                {"ROUTE": ["cheap:confident"]}]
    images, kept = with_routes([b"1", b"2", b"3", b"4"], expected, {"confident"})
    assert images == [b"1", b"4"] and kept == [expected[0], expected[3]]
    assert with_routes([b"1", b"2"], expected[:2], {"direct"}) == ([], [])
    with pytest.raises(ValueError, match="needs ROUTE among the expected outputs"):
        with_routes([b"1"], [{"TEXT": ["a"]}], {"confident"})


def test_a_flows_own_counts_are_read_by_code_over_its_instances():
    page = """# HELP bls_requests_total Users' requests the flow model finished
bls_requests_total{code="OK",instance="classify_bls_0_0",model="classify_bls"} 10
bls_requests_total{code="OK",instance="classify_bls_0_1",model="classify_bls"} 5
bls_requests_total{code="UNAVAILABLE",instance="classify_bls_0_1",model="classify_bls"} 2
bls_requests_total{code="OK",instance="classify_bls_tta_0_0",model="classify_bls_tta"} 7
nv_inference_request_success{model="classify_bls",version="1"} 17
"""
    assert flow_counts(page, "classify_bls") == {"OK": 15.0, "UNAVAILABLE": 2.0}
    assert flow_counts(page, "read_text") == {}
