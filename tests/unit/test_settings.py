"""Settings from config.pbtxt strings: the runtime's keys, a flow's declared keys, and each
child model's input, preprocessing and labels read from its own config."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from typing import Optional

import pytest

from bls_pipeline.stages.decode import DEFAULT_FORMATS, DecodePolicy
from bls_pipeline.stages.preprocess import PreprocessSpec
from bls_pipeline.runtime.load.children import Detector, child_model, load_child
from bls_pipeline.base.modelconfig import RELOAD_KEY
from bls_pipeline.runtime.load.fields import Candidates, Probability
from bls_pipeline.runtime.load.settings import RuntimeSettings, Settings, parse_settings
from bls_pipeline.base.errors import ConfigError

MODELS = Path(__file__).resolve().parents[2] / "models"


class ClassifySettings(Settings):  # classify_bls's, as its flow.py declares them
    cascade_classifiers: Optional[Candidates] = "efficientnet_lite0_trt,efficientnet_lite0_onnx"
    cascade_threshold: Probability = 0.5
    classifiers: Candidates = "resnet50_trt,resnet50_onnx"
    tta_threshold: Probability = 0.25


KNOWN_KEYS = [
    "allowed_formats", "classifiers", "decode_threads", "default_topk", "draft_min_side",
    "max_image_bytes", "max_pixels", "max_request_bytes", "route_recheck_s", "tta_threshold",
]


def parse(params: dict[str, str]):
    runtime, flow = parse_settings(params, ClassifySettings, "classify_bls")
    return runtime, flow


def test_no_parameters_gives_the_defaults():
    runtime, flow = parse({})
    assert runtime == RuntimeSettings() and flow == ClassifySettings()
    assert flow.classifiers == ("resnet50_trt", "resnet50_onnx")
    assert runtime.decode == DecodePolicy()


def test_settings_are_frozen():
    runtime, flow = parse({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        runtime.default_topk = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        flow.tta_threshold = 0.3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("key", "raw", "read", "expected"),
    [
        ("classifiers", "a", lambda r, f: f.classifiers, ("a",)),
        ("classifiers", " resnet50_onnx , resnet50_trt ,", lambda r, f: f.classifiers,
         ("resnet50_onnx", "resnet50_trt")),
        ("default_topk", "3", lambda r, f: r.default_topk, 3),
        ("tta_threshold", "0.4", lambda r, f: f.tta_threshold, 0.4),
        ("tta_threshold", "0", lambda r, f: f.tta_threshold, 0.0),
        ("route_recheck_s", "0.5", lambda r, f: r.route_recheck_s, 0.5),
        ("decode_threads", "8", lambda r, f: r.decode_threads, 8),
        ("max_request_bytes", "1024", lambda r, f: r.max_request_bytes, 1024),
        ("max_pixels", "1000000", lambda r, f: r.decode.max_pixels, 1_000_000),
        ("max_image_bytes", "2048", lambda r, f: r.decode.max_bytes, 2048),
        ("draft_min_side", "0", lambda r, f: r.decode.draft_min_side, 0),
        ("draft_min_side", "320", lambda r, f: r.decode.draft_min_side, 320),
        ("allowed_formats", "png, jpeg", lambda r, f: r.decode.formats, ("PNG", "JPEG")),
    ],
)
def test_each_key_parses(key, raw, read, expected):
    runtime, flow = parse({key: raw})
    assert read(runtime, flow) == expected
    # ...and only that key: everything else keeps its default.
    changed = {f.name for f in dataclasses.fields(RuntimeSettings)
               if getattr(runtime, f.name) != getattr(RuntimeSettings(), f.name)}
    changed |= {f.name for f in dataclasses.fields(ClassifySettings)
                if getattr(flow, f.name) != getattr(ClassifySettings(), f.name)}
    assert changed <= {key, "decode"}


def test_the_launchers_reload_mark_is_accepted_and_ignored():
    plain = parse_settings({"classifiers": "a"}, ClassifySettings, "my_flow")
    assert parse_settings({"classifiers": "a", RELOAD_KEY: "3"}, ClassifySettings, "my_flow") == plain


def test_unknown_key_lists_the_known_ones_and_names_the_model():
    with pytest.raises(ConfigError) as info:
        parse_settings({"tta_treshold": "0.3", "classifiers": "a"}, ClassifySettings, "my_flow")
    message = str(info.value)
    assert "tta_treshold" in message and "model my_flow" in message and "classify_bls" not in message
    for key in KNOWN_KEYS:
        assert key in message.split("known:")[1]


@pytest.mark.parametrize(
    ("key", "raw", "message"),
    [
        ("default_topk", "five", "write a whole number"),
        ("default_topk", "2.5", "write a whole number"),
        ("default_topk", "0", "must be >= 1"),
        ("decode_threads", "-2", "must be >= 0"),
        ("max_pixels", "0", "must be >= 1"),
        ("max_image_bytes", "lots", "write a whole number"),
        ("max_request_bytes", "0", "must be >= 1"),
        ("draft_min_side", "-1", "must be >= 0"),
    ],
)
def test_bad_whole_numbers(key, raw, message):
    with pytest.raises(ConfigError, match=message) as info:
        parse({key: raw})
    assert key in str(info.value)


@pytest.mark.parametrize(
    ("key", "raw", "message"),
    [
        ("tta_threshold", "high", "write a number between 0.0 and 1.0"),
        ("tta_threshold", "1.5", "must be between 0.0 and 1.0"),
        ("tta_threshold", "-0.1", "must be between 0.0 and 1.0"),
        ("tta_threshold", "nan", "must be between"),
        ("route_recheck_s", "-1", "must be between 0.0 and 3600.0"),
        ("route_recheck_s", "inf", "must be between"),
    ],
)
def test_bad_numbers_and_ranges(key, raw, message):
    with pytest.raises(ConfigError, match=message) as info:
        parse({key: raw})
    assert key in str(info.value)


@pytest.mark.parametrize("raw", ["", " , ,"])
def test_empty_name_lists(raw):
    for key in ("classifiers", "allowed_formats"):
        with pytest.raises(ConfigError, match=f"parameter {key} is empty"):
            parse({key: raw})


def test_allowed_formats_outside_the_supported_set():
    with pytest.raises(ConfigError) as info:
        parse({"allowed_formats": "PNG,eps,psd"})
    message = str(info.value)
    assert "EPS, PSD" in message
    assert all(fmt in message for fmt in DEFAULT_FORMATS)  # what to choose instead


def test_optional_candidates_none_turns_a_role_off():
    _, on = parse({"cascade_classifiers": "cheap_a, cheap_b", "cascade_threshold": "0.7"})
    assert on.cascade_classifiers == ("cheap_a", "cheap_b") and on.cascade_threshold == 0.7
    assert parse({"cascade_classifiers": " None "})[1].cascade_classifiers is None
    with pytest.raises(ConfigError, match="cascade_threshold"):
        parse({"cascade_threshold": "1.5"})


def test_declared_models_in_declaration_order_once_each():
    _, flow = parse({"classifiers": "resnet50_onnx,efficientnet_lite0_onnx"})
    assert flow.models() == ("efficientnet_lite0_trt", "efficientnet_lite0_onnx", "resnet50_onnx")
    assert parse({"cascade_classifiers": "none"})[1].models() == ("resnet50_trt", "resnet50_onnx")


def test_every_setting_type_parses_and_defaults_are_parsed_too():
    class All(Settings):
        whole: int = 3
        number: float = "2.5"
        flag: bool = "yes"
        name: str = "x"
        share: Probability = 0.1
        models: Candidates = "a,b"

    assert All() == All(whole=3, number=2.5, flag=True, name="x", share=0.1, models=Candidates(("a", "b")))
    parsed = All.parse({"whole": "-4", "number": "1e3", "flag": "false", "name": " y ", "share": "1", "models": "c"})
    assert ((parsed.whole, parsed.number, parsed.flag, parsed.name, parsed.share, parsed.models)
            == (-4, 1000.0, False, " y ", 1.0, ("c",)))
    with pytest.raises(ConfigError, match="write true or false"):
        All.parse({"flag": "maybe"})


def test_a_setting_needs_a_supported_type_and_a_default():
    with pytest.raises(TypeError, match="not supported"):
        class BadType(Settings):
            sizes: list = []
    with pytest.raises(TypeError, match="needs a default"):
        class NoDefault(Settings):
            threshold: float


# ---- a child model's config: input, preprocessing, labels ---------------------------------
def _config(body: str):
    from google.protobuf import text_format
    from bls_pipeline.base.modelconfig import ModelConfig

    return text_format.Parse(textwrap.dedent(body), ModelConfig())


def _pixels_model(dims: str, params: dict[str, str], dtype: str = "TYPE_FP32", batch: int = 8):
    lines = "\n".join(f'parameters {{ key: "{k}", value: {{ string_value: "{v}" }} }}' for k, v in params.items())
    return _config(f"""
        name: "m"
        max_batch_size: {batch}
        input [ {{ name: "pixels", data_type: {dtype}, dims: [ {dims} ] }} ]
        output [ {{ name: "out", data_type: TYPE_FP32, dims: [ 2 ] }} ]
        {lines}
    """)


def test_default_child_preprocessing_is_imagenet():
    child = child_model("m", _pixels_model("3, 224, 224", {}))
    assert child.preprocess == PreprocessSpec() and child.input.name == "pixels" and child.max_batch_size == 8
    assert not child.is_classifier


def test_child_reads_its_preprocess_parameters():
    child = child_model("vit", _pixels_model("3, 224, 224", {
        "preprocess_resize": "248", "preprocess_crop": "224",
        "preprocess_mean": "0.5,0.5,0.5", "preprocess_std": " 0.5, 0.25 ,0.125",
        "artifact": "model.onnx", "intra_op_threads": "0",
    }))
    assert child.preprocess == PreprocessSpec(resize=248, crop=224, mean=(0.5, 0.5, 0.5), std=(0.5, 0.25, 0.125))


def test_gray_uint8_nhwc_stretched_from_the_dims():
    child = child_model("q", _pixels_model("64, 64, 1", {"preprocess_resize_mode": "stretch"}, dtype="TYPE_UINT8"))
    spec = child.preprocess
    assert (spec.layout, spec.colour, spec.dtype, spec.mode, spec.crop) == ("NHWC", "GRAY", "UINT8", "stretch", 64)
    assert spec.input_shape == (64, 64, 1)


def test_encoded_bytes_child_has_no_preprocessing():
    child = child_model("raw", _config("""
        name: "raw"
        max_batch_size: 4
        input [ { name: "IMAGE", data_type: TYPE_STRING, dims: [ 1 ] } ]
        output [ { name: "SCORE", data_type: TYPE_FP32, dims: [ 1 ] } ]
    """))
    assert child.preprocess is None and child.input.dtype == "STRING"


@pytest.mark.parametrize(
    ("dims", "params", "dtype", "message"),
    [
        ("3, 224, 224", {"preprocess_crop": "192"}, "TYPE_FP32", "preprocess_crop=192 but input pixels is 224x224"),
        ("3, 48, 320", {"preprocess_crop": "320", "preprocess_resize_mode": "keep_aspect"}, "TYPE_FP32",
         "preprocess_crop=320 but input pixels is 48x320"),
        ("3, 224, 160", {}, "TYPE_FP32", "make its dims square, or set preprocess_resize_mode"),
        ("3, 224, 224", {"preprocess_colour": "GRAY"}, "TYPE_FP32", "preprocess_colour='GRAY' does not fit"),
        ("3, 224, 224", {"preprocess_mean": "0.5,0.5"}, "TYPE_FP32", "three comma-separated numbers"),
        ("3, 224, 224", {"preprocess_std": "a,b,c"}, "TYPE_FP32", "preprocess_std"),
        ("3, 224, 224", {"preprocess_resize": "big"}, "TYPE_FP32", "preprocess_resize"),
        ("3, 224, 224", {"preprocess_resize": "200"}, "TYPE_FP32", "crop <= resize"),
        ("3, 224, 224", {"preprocess_std": "0.2,0,0.2"}, "TYPE_FP32", "std > 0"),
        ("3, 224, 224", {"preprocess_resize_mode": "squash"}, "TYPE_FP32", "shorter_side, stretch"),
        ("3, 224, 224", {"preprocess_mean": "0.5,0.5,0.5"}, "TYPE_UINT8", "remove preprocess_mean"),
        ("224, 224", {"preprocess_resize": "256"}, "TYPE_FP32", "an image input needs 3"),
        ("3, 224, 224", {"preprocess_resize_mode": "keep_aspect", "preprocess_pad": "left"}, "TYPE_FP32",
         "preprocess_pad='left'"),
        ("3, 224, 224", {"preprocess_resize_mode": "keep_aspect", "preprocess_pad_value": "300"}, "TYPE_FP32",
         "preprocess_pad_value=300"),
        ("3, 224, 224", {"boxes_units": "pixels"}, "TYPE_FP32", "add boxes_output"),
        ("3, 224, 224", {"boxes_output": "logits", "boxes_units": "pixels"}, "TYPE_FP32", "names no output"),
    ],
)
def test_bad_child_configs_name_the_model_and_the_setting(dims, params, dtype, message):
    with pytest.raises(ConfigError, match="model m") as info:
        child_model("m", _pixels_model(dims, params, dtype))
    assert message in str(info.value)


def test_child_needs_batching():
    with pytest.raises(ConfigError, match="m needs max_batch_size >= 1"):
        child_model("m", _pixels_model("3, 224, 224", {}, batch=0))


def test_shipped_classifier_labels_come_from_its_folder():
    child = load_child(MODELS, "resnet50_onnx")
    assert child.is_classifier and len(child.labels) == 1000 and child.labels[504] == "coffee mug"
    assert load_child(MODELS, "efficientnet_lite0_trt").labels == child.labels


def test_label_file_must_match_the_output(tmp_path):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "labels.txt").write_text("cat\ndog\nbird\n")
    (model / "config.pbtxt").write_text(textwrap.dedent("""
        name: "tiny"
        max_batch_size: 2
        input [ { name: "x", data_type: TYPE_FP32, dims: [ 3, 32, 32 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ 2 ], label_filename: "labels.txt" } ]
    """))
    with pytest.raises(ConfigError, match="labels.txt has 3 labels but output y has dims \\[2\\]"):
        load_child(tmp_path, "tiny")
    (model / "config.pbtxt").write_text((model / "config.pbtxt").read_text().replace("dims: [ 2 ]", "dims: [ 3 ]"))
    assert load_child(tmp_path, "tiny").labels == ("cat", "dog", "bird")


def test_missing_child_folder_names_the_model(tmp_path):
    (tmp_path / "ghost").mkdir()
    with pytest.raises(ConfigError, match="model ghost has no") as info:
        load_child(tmp_path, "ghost")
    assert "setting that names it" in str(info.value)
    with pytest.raises(ConfigError, match="model absent has no"):
        load_child(tmp_path, "absent")


def test_a_child_with_tensor_inputs_has_no_image_input():
    child = child_model("head", _config("""
        name: "head"
        max_batch_size: 16
        input [ { name: "features", data_type: TYPE_FP32, dims: [ 1000 ] },
                { name: "bias", data_type: TYPE_INT64, dims: [ 2 ] } ]
        output [ { name: "out", data_type: TYPE_FP32, dims: [ 2 ] } ]
    """))
    assert child.image is None and child.preprocess is None
    assert [(t.name, t.dtype, t.dims) for t in child.inputs] == [("features", "FP32", (1000,)), ("bias", "INT64", (2,))]


def test_image_input_picks_the_pixels_among_several_inputs():
    child = child_model("m", _config("""
        name: "m"
        max_batch_size: 4
        input [ { name: "pixels", data_type: TYPE_FP32, dims: [ 3, 32, 32 ] },
                { name: "threshold", data_type: TYPE_FP32, dims: [ 1 ] } ]
        output [ { name: "out", data_type: TYPE_FP32, dims: [ 2 ] } ]
        parameters { key: "image_input", value: { string_value: "pixels" } }
    """))
    assert child.image.name == "pixels" and child.preprocess.crop == 32


def test_keep_aspect_takes_a_non_square_input():
    child = child_model("rec", _pixels_model("3, 48, 320", {"preprocess_resize_mode": "keep_aspect",
                                                           "preprocess_pad_value": "127.5"}))
    spec = child.preprocess
    assert ((spec.mode, spec.crop, spec.input_width, spec.pad, spec.pad_value)
            == ("keep_aspect", 48, 320, "bottom_right", 127.5))
    assert spec.input_shape == (3, 48, 320)


def test_a_detector_names_its_box_outputs():
    child = child_model("det", _config("""
        name: "det"
        max_batch_size: 4
        input [ { name: "image", data_type: TYPE_FP32, dims: [ 3, 64, 64 ] } ]
        output [ { name: "BOXES", data_type: TYPE_FP32, dims: [ -1, 4 ] },
                 { name: "SCORES", data_type: TYPE_FP32, dims: [ -1 ] },
                 { name: "COUNT", data_type: TYPE_INT32, dims: [ 1 ] } ]
        parameters { key: "preprocess_resize_mode", value: { string_value: "stretch" } }
        parameters { key: "boxes_output", value: { string_value: "BOXES" } }
        parameters { key: "boxes_units", value: { string_value: "normalized" } }
        parameters { key: "box_scores_output", value: { string_value: "SCORES" } }
        parameters { key: "count_output", value: { string_value: "COUNT" } }
    """))
    assert child.detector == Detector("BOXES", "normalized", "xyxy", "SCORES", None, "COUNT")
    bad = _pixels_model("3, 64, 64", {"boxes_output": "out", "boxes_units": "pixels"})
    with pytest.raises(ConfigError, match=r"output out \(boxes_output\) has dims \[2\]; it needs \[-1, 4\]"):
        child_model("m", bad)
