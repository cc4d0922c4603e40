"""Shadow and canary (runtime/call/trials.py) in process: what the shadow compares and counts,
that neither it nor a failing canary changes an answer, and the settings' errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bls_pipeline.flow import LocalFlow
from bls_pipeline.runtime.engine import FlowRuntime
from bls_pipeline.base.modelconfig import parse_config, string_parameters
from bls_pipeline.runtime.results import ImageRequest, RequestError
from bls_pipeline.base.errors import ConfigError
from bls_pipeline.runtime.call.trials import SCORE_DIFF_BOUNDS, Shadow, Trial, compare

MODELS = Path(__file__).resolve().parents[2] / "models"
RESNET_ONLY = {"cascade_classifiers": "none", "tta_threshold": "0", "classifiers": "resnet50_onnx"}
SHADOW = {**RESNET_ONLY, "shadow": "resnet50_onnx=resnet50_onnx@2"}


def stable(batch: np.ndarray) -> np.ndarray:
    """Class = the image's mean brightness in steps, far ahead of the rest (ranked 0, 1, 2, ...)."""
    x = np.asarray(batch, np.float32)
    classes = 100 + (np.clip(x.mean(axis=(1, 2, 3)), -2, 2) * 100).astype(np.int64) % 800
    logits = np.tile(-np.arange(1000, dtype=np.float32) * 0.001, (len(x), 1))
    logits[np.arange(len(x)), classes] = 8.0
    return logits


def candidate(batch: np.ndarray) -> np.ndarray:
    """The same, except that the first image of every call gets another class."""
    logits = stable(batch)
    logits[0] = np.roll(logits[0], 1)
    return logits


def broken(batch: np.ndarray) -> np.ndarray:
    raise RuntimeError("candidate crashed")


def images(encode, n: int) -> list[bytes]:
    return [encode(Image.new("RGB", (50, 40), (30 * i + 10,) * 3), "PNG") for i in range(n)]


def test_compare_counts_agreement_overlap_and_score_moves():
    a = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]], np.float32)
    b = np.array([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1]], np.float32)
    agree, overlap, within = compare(a, b)
    assert agree == 1  # row 0: both say class 0; row 1: 1 against 0
    assert overlap == 2.0  # three classes: the top-3s overlap fully on both rows
    # stable top-1 probability moved by 0.1 (row 0) and 0.4 (row 1)
    assert within == [0, 0, 0, 1, 1, 2, 2] and len(within) == len(SCORE_DIFF_BOUNDS)


def test_the_shadow_is_compared_and_never_answers(encode):
    sent = images(encode, 5)
    with LocalFlow(MODELS / "classify_bls", {"resnet50_onnx": stable, "resnet50_onnx@2": candidate},
                   parameters=SHADOW) as flow:
        (with_shadow,), timings = flow.run([ImageRequest(sent)])
        assert flow.calls == [("resnet50_onnx", 5), ("resnet50_onnx@2", 5)]
    with LocalFlow(MODELS / "classify_bls", {"resnet50_onnx": stable}, parameters=RESNET_ONLY) as flow:
        without = flow.classify(sent)
    np.testing.assert_array_equal(with_shadow.labels, without.labels)
    np.testing.assert_array_equal(with_shadow.routes, without.routes)
    (pair, stats), = timings.trials.items()
    assert pair == ("resnet50_onnx", "resnet50_onnx@2")
    assert (stats.compared, stats.failed, stats.rows, stats.top1_agree) == (1, 0, 5, 4)
    assert stats.top5_overlap == pytest.approx(4.6)  # four rows 5/5; the rolled one 3/5 (classes 1-3 shared)


def test_a_failing_shadow_changes_nothing_and_is_counted(encode):
    with LocalFlow(MODELS / "classify_bls", {"resnet50_onnx": stable, "resnet50_onnx@2": broken},
                   parameters=SHADOW) as flow:
        (answer,), timings = flow.run([ImageRequest(images(encode, 3))])
    assert not isinstance(answer, RequestError)
    assert set(answer.routes[:, 0]) == {b"resnet50_onnx:direct"}
    (stats,) = timings.trials.values()
    assert (stats.compared, stats.failed, stats.rows) == (0, 1, 0)


def test_a_shadow_the_call_cannot_be_mirrored_to_is_counted_with_the_reason(encode, tmp_path, caplog):
    """The candidate takes an input the call does not give: the mirror fails before it is
    sent, is counted failed, and the log says why."""
    repo = tmp_path / "models"
    for model in ("classify_bls", "resnet50_onnx"):
        shutil.copytree(MODELS / model, repo / model, ignore=shutil.ignore_patterns("*.onnx*", "__pycache__"))
    shutil.copytree(repo / "resnet50_onnx", repo / "resnet50_twin")
    config = (repo / "resnet50_twin" / "config.pbtxt").read_text()
    config = config.replace('name: "resnet50_onnx"', 'name: "resnet50_twin"')
    config = config.replace('input [ { name: "input"',
                            'input [ { name: "SCALE", data_type: TYPE_FP32, dims: [ 1 ] }, { name: "input"')
    (repo / "resnet50_twin" / "config.pbtxt").write_text(config)
    with caplog.at_level("INFO", logger="bls_pipeline.runtime.call.trials"):
        with LocalFlow(repo / "classify_bls", {"resnet50_onnx": stable, "resnet50_twin": stable},
                       parameters={**RESNET_ONLY, "shadow": "resnet50_onnx=resnet50_twin"}) as flow:
            (answer,), timings = flow.run([ImageRequest(images(encode, 2))])
    assert set(answer.routes[:, 0]) == {b"resnet50_onnx:direct"}
    (stats,) = timings.trials.values()
    assert (stats.compared, stats.failed) == (0, 1)
    assert "model resnet50_twin needs input(s) SCALE" in caplog.text


def test_a_share_mirrors_that_share_of_calls(encode):
    params = {**SHADOW, "shadow_share": "0.25"}
    with LocalFlow(MODELS / "classify_bls", {"resnet50_onnx": stable, "resnet50_onnx@2": candidate},
                   parameters=params) as flow:
        flow.runtime.router.rng.seed(0)
        flow.runtime.shadow._rng.seed(1)
        for _ in range(200):
            flow.run([ImageRequest(images(encode, 1))])
        mirrored = sum(1 for model, _ in flow.calls if model == "resnet50_onnx@2")
    assert 30 <= mirrored <= 70  # 200 calls at 0.25: 50 expected


def test_the_canary_answers_its_share_and_route_names_it(encode):
    params = {**RESNET_ONLY, "canary": "resnet50_onnx=resnet50_onnx@2", "canary_share": "1"}
    with LocalFlow(MODELS / "classify_bls", {"resnet50_onnx": stable, "resnet50_onnx@2": candidate},
                   parameters=params) as flow:
        answer = flow.classify(images(encode, 2))
        assert flow.calls == [("resnet50_onnx@2", 2)]
    assert set(answer.routes[:, 0]) == {b"resnet50_onnx@2:direct"}


def test_a_failing_canary_is_answered_by_the_stable_model(encode):
    params = {**RESNET_ONLY, "canary": "resnet50_onnx=resnet50_onnx@2", "canary_share": "1"}
    with LocalFlow(MODELS / "classify_bls", {"resnet50_onnx": stable, "resnet50_onnx@2": broken},
                   parameters=params) as flow:
        answer = flow.classify(images(encode, 2))
        assert flow.calls == [("resnet50_onnx@2", 2), ("resnet50_onnx", 2)]
    assert set(answer.routes[:, 0]) == {b"resnet50_onnx:direct"}


def test_a_canary_not_ready_is_not_sent_to(encode):
    params = {**RESNET_ONLY, "canary": "resnet50_onnx=resnet50_onnx@2", "canary_share": "1"}
    with LocalFlow(MODELS / "classify_bls", {"resnet50_onnx": stable, "resnet50_onnx@2": candidate},
                   parameters=params, ready={"resnet50_onnx"}) as flow:
        answer = flow.classify(images(encode, 2))
        assert flow.calls == [("resnet50_onnx", 2)]
    assert set(answer.routes[:, 0]) == {b"resnet50_onnx:direct"}


def test_a_version_on_trial_is_the_stable_one_only_when_no_other_is_ready(tmp_path):
    repo = tmp_path / "models"
    for name in ("classify_bls", "resnet50_onnx", "efficientnet_lite0_onnx"):
        shutil.copytree(MODELS / name, repo / name, ignore=shutil.ignore_patterns("*.onnx*", "__pycache__"))
    (repo / "resnet50_onnx" / "2").mkdir()
    params = {**string_parameters(parse_config(repo / "classify_bls")), **SHADOW}
    on_trial = FlowRuntime.load(repo / "classify_bls", params, lambda *_: True, check=False, pin_versions=True)
    plain = FlowRuntime.load(repo / "classify_bls", {**params, "shadow": "none"}, lambda *_: True, check=False,
                             pin_versions=True)
    trial, stable = on_trial.router, plain.router
    assert trial.ready("resnet50_onnx") and trial.serving_version("resnet50_onnx") == "1"
    trial._is_ready = lambda model, version=None: version != "1"  # version 1 retired: the trial version answers
    assert trial.ready("resnet50_onnx") and trial.serving_version("resnet50_onnx") == "2"
    assert stable.ready("resnet50_onnx") and stable.serving_version("resnet50_onnx") == "2"
    on_trial.close()
    plain.close()


def test_a_full_or_unready_shadow_skips_the_call():
    shadow = Shadow(Trial("a", "b", "", 1.0), max_in_flight=1)
    assert shadow.wanted(lambda: True) and not shadow.wanted(lambda: True)  # the first still in flight
    assert not shadow.wanted(lambda: False)
    (stats,) = shadow.drain().values()
    assert (stats.skipped, stats.unready) == (1, 1)


@pytest.mark.parametrize("params,message", [
    ({"shadow": "resnet50_onnx=resnet50_onnx@2", "shadow_share": "1.5"},
     "shadow_share=1.5: must be between 0.0 and 1.0"),
    ({"canary": "resnet50_onnx=resnet50_onnx@2", "canary_share": "-0.1"}, "canary_share=-0.1: must be between"),
    ({"shadow": "resnet50_onnx"}, "parameter shadow='resnet50_onnx': write stable=candidate"),
    ({"shadow": "resnet50_onnx=resnet50_onnx"}, "the candidate is the stable model itself"),
    ({"shadow": "resnet50_onnx=no_such_model"}, "parameter shadow: candidate 'no_such_model' cannot be used"),
    ({"canary": "resnet50_trt_x=resnet50_onnx@2"}, "parameter canary: the flow calls no model 'resnet50_trt_x'"),
    ({"shadow": "resnet50_onnx=image_quality"},
     "parameter shadow: image_quality does not answer with resnet50_onnx's labels"),
])
def test_bad_trial_settings_fail_the_load_naming_the_setting(params, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        LocalFlow(MODELS / "classify_bls", {"resnet50_onnx": stable}, parameters={**RESNET_ONLY, **params})
