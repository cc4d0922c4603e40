"""softmax / top_k / format_label: logits in, Triton classification strings out."""

from __future__ import annotations

import re

import numpy as np
import pytest

from bls_pipeline.stages.postprocess import format_label, softmax, top_k

LABELS = [f"class_{i}" for i in range(10)]


def test_softmax_rows_sum_to_one():
    logits = np.random.default_rng(0).normal(scale=5.0, size=(4, 10)).astype(np.float32)
    probs = softmax(logits)
    assert probs.dtype == np.float32
    assert probs.shape == (4, 10)
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-6)
    assert np.array_equal(probs.argmax(axis=1), logits.argmax(axis=1))


def test_softmax_matches_the_textbook_formula():
    logits = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, -1.0]])
    expected = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert np.allclose(softmax(logits), expected, atol=1e-7)


def test_softmax_is_stable_for_large_logits():
    logits = np.array([[1e4, 1e4 - 1.0, -1e4], [-1e4, -1e4, -1e4]], dtype=np.float32)
    probs = softmax(logits)
    assert np.isfinite(probs).all()
    e = np.exp(-1.0)
    assert np.allclose(probs[0], [1 / (1 + e), e / (1 + e), 0.0], atol=1e-6)
    assert np.allclose(probs[1], 1 / 3, atol=1e-6)


def test_softmax_leaves_its_input_alone():
    logits = np.array([[3.0, 1.0]], dtype=np.float32)
    softmax(logits)
    assert logits.tolist() == [[3.0, 1.0]]


def test_top_k_orders_by_descending_score():
    probs = softmax(np.array([[0.1, 3.0, -2.0, 1.5, 2.2, 0.0, 0.0, 0.0, 0.0, 0.0]]))
    top = top_k(probs, 3, LABELS)
    assert top.class_ids.tolist() == [[1, 4, 3]]
    assert top.class_ids.dtype == np.int32
    assert top.scores.dtype == np.float32
    assert np.all(np.diff(top.scores, axis=1) <= 0)
    assert top.scores.shape == top.class_ids.shape == top.labels.shape == (1, 3)


def test_top_k_per_row():
    probs = softmax(np.eye(10)[[7, 2]] * 5.0)
    assert top_k(probs, 1, LABELS).class_ids.tolist() == [[7], [2]]


def test_ties_keep_ascending_class_index():
    probs = softmax(np.zeros((2, 10)))
    assert top_k(probs, 4, LABELS).class_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    partial = softmax(np.array([[1.0, 3.0, 3.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0]]))
    assert top_k(partial, 5, LABELS).class_ids.tolist() == [[1, 2, 4, 0, 3]]


@pytest.mark.parametrize("k", [0, -1, 11])
def test_k_out_of_bounds(k):
    with pytest.raises(ValueError, match="between 1 and 10"):
        top_k(softmax(np.zeros((1, 10))), k, LABELS)


def test_k_may_be_every_class():
    top = top_k(softmax(np.arange(10.0)[None]), 10, LABELS)
    assert top.class_ids.tolist() == [list(range(9, -1, -1))]


def test_labels_are_score_index_label_bytes():
    probs = softmax(np.array([[0.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]))
    top = top_k(probs, 2, LABELS)
    first = top.labels[0, 0]
    assert isinstance(first, bytes)
    assert re.fullmatch(rb"\d\.\d{6}:1:class_1", first)
    for (score, index, label), s, c in zip((x.decode().split(":") for x in top.labels[0]), top.scores[0],
                                           top.class_ids[0]):
        assert float(score) == pytest.approx(float(s), abs=5e-7)
        assert int(index) == c
        assert label == LABELS[c]


def test_format_label():
    assert format_label(0.5, 3, LABELS) == "0.500000:3:class_3"
    assert format_label(1.0, 0, ["tench, Tinca tinca"]) == "1.000000:0:tench, Tinca tinca"


def test_scores_are_probabilities_not_logits():
    logits = np.array([[8.0, 6.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    top = top_k(softmax(logits), 3, LABELS)
    expected = np.exp(logits[0]) / np.exp(logits[0]).sum()
    assert np.allclose(top.scores[0], expected[[0, 1, 2]], atol=1e-6)
    assert (top.scores > 0).all() and (top.scores <= 1).all()
    assert float(top.labels[0, 0].split(b":")[0]) < 1.0  # not the raw logit 8.0


def test_top_k_of_no_rows_keeps_its_shape():
    top = top_k(np.empty((0, 10), np.float32), 3, LABELS)
    assert top.labels.shape == top.scores.shape == top.class_ids.shape == (0, 3)
    assert top.labels.dtype == object
