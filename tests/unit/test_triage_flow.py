"""triage_bls's flow (models/triage_bls/1/flow.py) in process: image_quality's real numpy
function, plain-Python voters. Each test says which models are READY: an engine built in
models/ (the main job builds some) must not take a voter's place."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bls_pipeline.flow import LocalFlow
from bls_pipeline.stages.postprocess import softmax

MODELS = Path(__file__).resolve().parents[2] / "models"
SAMPLES = Path(__file__).resolve().parents[2] / "samples"
FIRST, SECOND = "efficientnet_lite0_onnx", "resnet50_onnx"


def voter(seed: int, calls: list):
    """Fixed random logits per image (by its mean pixel), so two voters may agree or not."""
    projection = np.random.default_rng(seed).normal(scale=4.0, size=(3, 1000)).astype(np.float32)

    def fn(batch: np.ndarray) -> np.ndarray:
        calls.append(batch.copy())
        return batch.mean(axis=(2, 3)) @ projection
    return fn


@pytest.fixture
def images():
    photos = [SAMPLES / f"{n}.jpg" for n in ("mug", "chelsea", "coffee")]
    return ([p.read_bytes() for p in photos]
            + [(SAMPLES / "night.png").read_bytes(), (SAMPLES / "blank.png").read_bytes()])


def test_unusable_images_end_early_and_the_rest_get_both_votes(images):
    first_calls, second_calls = [], []
    voters = {FIRST: voter(1, first_calls), SECOND: voter(2, second_calls)}
    with LocalFlow(MODELS / "triage_bls", voters, ready={"image_quality", FIRST, SECOND}) as flow:
        prediction = flow.classify(images, topk=3)
        assert flow.calls == [("image_quality", 5), (FIRST, 3), (SECOND, 3)]  # no classifier call for the last two
    routes = prediction.routes[:, 0].tolist()
    assert routes[3:] == [b"image_quality:too_dark", b"image_quality:blank"]
    assert prediction.labels[3:].tolist() == [[b""] * 3] * 2 and (prediction.class_ids[3:] == -1).all()
    vote = (softmax(voters[FIRST](first_calls[0])) + softmax(voters[SECOND](second_calls[0]))) / 2
    np.testing.assert_allclose(prediction.scores[:3], -np.sort(-vote, axis=1)[:, :3], atol=1e-5)
    agree = softmax(voters[FIRST](first_calls[0])).argmax(1) == softmax(voters[SECOND](second_calls[0])).argmax(1)
    assert routes[:3] == [f"{FIRST}+{SECOND}:{'agree' if a else 'disagree'}".encode() for a in agree]


def test_one_voter_ready_answers_alone(images):
    calls = []
    with LocalFlow(MODELS / "triage_bls", {FIRST: voter(1, calls)}, ready={"image_quality", FIRST}) as flow:
        prediction = flow.classify(images[:1] + images[3:])
    assert (prediction.routes[:, 0].tolist()
            == [f"{FIRST}:alone".encode(), b"image_quality:too_dark", b"image_quality:blank"])


def test_without_image_quality_every_image_is_classified(images):
    with LocalFlow(MODELS / "triage_bls", {FIRST: voter(1, []), SECOND: voter(2, [])},
                   ready={FIRST, SECOND}) as flow:
        prediction = flow.classify(images)
        assert [m for m, _ in flow.calls] == [FIRST, SECOND]
    assert all(r.endswith((b":agree", b":disagree")) for r in prediction.routes[:, 0])


def test_thresholds_come_from_the_config(images):
    lenient = {"min_brightness": "0", "min_contrast": "0.01"}  # night.png: brightness 0.03, contrast 0.017
    with LocalFlow(MODELS / "triage_bls", {FIRST: voter(1, [])}, parameters=lenient,
                   ready={"image_quality", FIRST}) as flow:
        routes = flow.classify(images[3:]).routes[:, 0].tolist()
    assert routes == [f"{FIRST}:alone".encode(), b"image_quality:blank"]  # dark is fine now; blank still ends early
