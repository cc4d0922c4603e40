"""classify_bls parameters and per-classifier preprocessing, parsed from config.pbtxt strings."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest

from bls_pipeline.config import (
    ClassifierInfo,
    ConfigError,
    PipelineConfig,
    classifier_info,
    load_classifier_info,
    parse_pipeline_config,
)
from bls_pipeline.decode import DEFAULT_FORMATS, DecodePolicy
from bls_pipeline.preprocess import PreprocessSpec

KNOWN_KEYS = [
    "allowed_formats", "classifiers", "decode_threads", "default_topk", "draft_min_side",
    "max_image_bytes", "max_pixels", "max_request_bytes", "route_recheck_s", "tta_threshold",
]


def test_no_parameters_gives_the_defaults():
    config = parse_pipeline_config({})
    assert config == PipelineConfig()
    assert config.classifiers == ("resnet50_trt", "resnet50_onnx")
    assert config.decode == DecodePolicy()


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        parse_pipeline_config({}).default_topk = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("key", "raw", "read", "expected"),
    [
        ("classifiers", "a", lambda c: c.classifiers, ("a",)),
        ("classifiers", " resnet50_onnx , resnet50_trt ,", lambda c: c.classifiers, ("resnet50_onnx", "resnet50_trt")),
        ("default_topk", "3", lambda c: c.default_topk, 3),
        ("tta_threshold", "0.4", lambda c: c.tta_threshold, 0.4),
        ("tta_threshold", "0", lambda c: c.tta_threshold, 0.0),
        ("route_recheck_s", "0.5", lambda c: c.route_recheck_s, 0.5),
        ("decode_threads", "8", lambda c: c.decode_threads, 8),
        ("max_request_bytes", "1024", lambda c: c.max_request_bytes, 1024),
        ("max_pixels", "1000000", lambda c: c.decode.max_pixels, 1_000_000),
        ("max_image_bytes", "2048", lambda c: c.decode.max_bytes, 2048),
        ("draft_min_side", "0", lambda c: c.decode.draft_min_side, 0),
        ("draft_min_side", "320", lambda c: c.decode.draft_min_side, 320),
        ("allowed_formats", "png, jpeg", lambda c: c.decode.formats, ("PNG", "JPEG")),
    ],
)
def test_each_key_parses(key, raw, read, expected):
    config = parse_pipeline_config({key: raw})
    assert read(config) == expected
    # ...and only that key: everything else keeps its default.
    default = PipelineConfig()
    changed = {f.name for f in dataclasses.fields(PipelineConfig) if getattr(config, f.name) != getattr(default, f.name)}
    assert changed <= {key, "decode"}


def test_all_keys_together():
    config = parse_pipeline_config({
        "classifiers": "x,y", "default_topk": "1", "tta_threshold": "1", "route_recheck_s": "3600",
        "decode_threads": "1", "max_request_bytes": "1", "max_pixels": "1", "max_image_bytes": "1",
        "allowed_formats": "webp", "draft_min_side": "0",
    })
    assert config == PipelineConfig(
        classifiers=("x", "y"), default_topk=1, tta_threshold=1.0, route_recheck_s=3600.0, decode_threads=1,
        max_request_bytes=1, decode=DecodePolicy(max_pixels=1, max_bytes=1, formats=("WEBP",), draft_min_side=0),
    )


def test_unknown_key_lists_the_known_ones():
    with pytest.raises(ConfigError) as info:
        parse_pipeline_config({"tta_treshold": "0.3", "classifiers": "a"})
    message = str(info.value)
    assert "tta_treshold" in message
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
        parse_pipeline_config({key: raw})
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
        parse_pipeline_config({key: raw})
    assert key in str(info.value)


@pytest.mark.parametrize("raw", ["", " , ,"])
def test_empty_name_lists(raw):
    for key in ("classifiers", "allowed_formats"):
        with pytest.raises(ConfigError, match=f"parameter {key} is empty"):
            parse_pipeline_config({key: raw})


def test_allowed_formats_outside_the_supported_set():
    with pytest.raises(ConfigError) as info:
        parse_pipeline_config({"allowed_formats": "PNG,eps,psd"})
    message = str(info.value)
    assert "EPS, PSD" in message
    assert all(fmt in message for fmt in DEFAULT_FORMATS)  # what to choose instead


# ---- per-classifier info -------------------------------------------------------------

def test_classifier_info_defaults_to_imagenet():
    info = classifier_info("resnet50_onnx", 32, {})
    assert info == ClassifierInfo(name="resnet50_onnx", max_batch_size=32, preprocess=PreprocessSpec())


def test_classifier_info_reads_preprocess_parameters_and_ignores_others():
    info = classifier_info("vit", 4, {
        "preprocess_resize": "248", "preprocess_crop": "224",
        "preprocess_mean": "0.5,0.5,0.5", "preprocess_std": " 0.5, 0.25 ,0.125",
        "artifact": "model.onnx", "intra_op_threads": "0",
    })
    assert info.preprocess == PreprocessSpec(resize=248, crop=224, mean=(0.5, 0.5, 0.5), std=(0.5, 0.25, 0.125))


@pytest.mark.parametrize("max_batch", [0, -1])
def test_classifier_needs_batching(max_batch):
    with pytest.raises(ConfigError, match="max_batch_size >= 1"):
        classifier_info("m", max_batch, {})


@pytest.mark.parametrize(
    ("key", "raw"),
    [("preprocess_mean", "0.5,0.5"), ("preprocess_std", "a,b,c"), ("preprocess_mean", "0.1,0.2,0.3,0.4")],
)
def test_bad_mean_std_triples(key, raw):
    with pytest.raises(ConfigError, match="three comma-separated numbers") as info:
        classifier_info("m", 1, {key: raw})
    assert key in str(info.value)


def test_bad_resize_value():
    with pytest.raises(ConfigError, match="preprocess_resize"):
        classifier_info("m", 1, {"preprocess_resize": "big"})


@pytest.mark.parametrize(
    "params",
    [{"preprocess_resize": "200", "preprocess_crop": "224"}, {"preprocess_std": "0.2,0,0.2"}],
    ids=["crop-over-resize", "zero-std"],
)
def test_inconsistent_preprocessing_is_a_config_error(params):
    # config.py promises ConfigError for bad values, so the model's load error names the setting.
    with pytest.raises(ConfigError):
        classifier_info("m", 1, params)


def _write_model(repo, name: str, body: str) -> None:
    (repo / name).mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(body))


def test_load_classifier_info_from_config_pbtxt(tmp_path):
    _write_model(tmp_path, "small_net", """
        name: "small_net"
        backend: "python"
        max_batch_size: 12
        input [ { name: "input", data_type: TYPE_FP32, dims: [ 3, 192, 192 ] } ]
        output [ { name: "output", data_type: TYPE_FP32, dims: [ 1000 ] } ]
        parameters { key: "artifact", value: { string_value: "model.onnx" } }
        parameters { key: "preprocess_resize", value: { string_value: "220" } }
        parameters { key: "preprocess_crop", value: { string_value: "192" } }
        parameters { key: "preprocess_mean", value: { string_value: "0.5,0.5,0.5" } }
        parameters { key: "preprocess_std", value: { string_value: "0.5,0.5,0.5" } }
    """)
    info = load_classifier_info(tmp_path, "small_net")
    assert info.name == "small_net"
    assert info.max_batch_size == 12
    assert info.preprocess == PreprocessSpec(resize=220, crop=192, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    assert info.preprocess.input_shape == (3, 192, 192)


def test_load_classifier_info_without_batching(tmp_path):
    _write_model(tmp_path, "unbatched", """
        name: "unbatched"
        backend: "python"
        max_batch_size: 0
    """)
    with pytest.raises(ConfigError, match="unbatched needs max_batch_size >= 1"):
        load_classifier_info(tmp_path, "unbatched")


def test_load_classifier_info_missing_config(tmp_path):
    (tmp_path / "ghost").mkdir()
    with pytest.raises(ConfigError, match="classifier ghost has no") as info:
        load_classifier_info(tmp_path, "ghost")
    assert "classifiers parameter" in str(info.value)
    with pytest.raises(ConfigError, match="classifier absent has no"):
        load_classifier_info(tmp_path, "absent")


def test_cascade_settings_parse_and_none_turns_it_off():
    from bls_pipeline.config import parse_pipeline_config

    on = parse_pipeline_config({"cascade_classifiers": "cheap_a, cheap_b", "cascade_threshold": "0.7"})
    assert on.cascade_classifiers == ("cheap_a", "cheap_b") and on.cascade_threshold == 0.7
    assert parse_pipeline_config({"cascade_classifiers": "none"}).cascade_classifiers == ()
    with pytest.raises(ConfigError, match="cascade_threshold"):
        parse_pipeline_config({"cascade_threshold": "1.5"})
