"""A function child's outputs against its config (engines/functions.py `check_outputs`): what
the function model refuses as broken before any caller sees it."""

from __future__ import annotations

import numpy as np

from bls_pipeline.base.tensors import TensorInfo
from bls_pipeline.engines.functions import check_outputs

DECLARED = [TensorInfo("BRIGHTNESS", "FP32", (1,)), TensorInfo("NAMES", "STRING", (-1,))]


def _outputs(rows: int, **changes):
    out = {"BRIGHTNESS": np.zeros((rows, 1), np.float32), "NAMES": np.array([[b"a", b"b"]] * rows, dtype=object)}
    out.update(changes)
    return out


def test_outputs_that_keep_the_contract_pass():
    assert check_outputs(_outputs(3), DECLARED, 3) is None


def test_a_wrong_shape_names_the_output_the_shape_and_the_declared_dims():
    problem = check_outputs(_outputs(2, BRIGHTNESS=np.zeros((2, 10), np.float32)), DECLARED, 2)
    assert problem == ("returned BRIGHTNESS with shape (2, 10) for a batch of 2; its config.pbtxt declares dims [1], "
                       "so expected (2, 1)")


def test_a_row_short_is_refused():
    assert "for a batch of 3" in check_outputs(_outputs(2), DECLARED, 3)


def test_a_wrong_data_type_is_refused():
    problem = check_outputs(_outputs(1, BRIGHTNESS=np.zeros((1, 1), np.float64)), DECLARED, 1)
    assert problem == "returned BRIGHTNESS as FP64; its config.pbtxt declares TYPE_FP32"
    assert "as INT64" in check_outputs(_outputs(1, NAMES=np.zeros((1, 2), np.int64)), DECLARED, 1)


def test_a_missing_output_or_no_dict_is_refused():
    out = _outputs(1)
    del out["NAMES"]
    assert check_outputs(out, DECLARED, 1) == "returned no NAMES (it returned BRIGHTNESS)"
    assert check_outputs([1, 2], DECLARED, 1) == "returned list, not a dict of outputs"
