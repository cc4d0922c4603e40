"""LocalFlow as a user meets it from `bls_pipeline.flow` alone: several requests as one
execute() (ImageRequest), a stand-in for a child with several outputs (a dict), stand-ins
that fail the ways a server's children do, and errors that speak of LocalFlow."""

from __future__ import annotations

import numpy as np
import pytest

from bls_pipeline.flow import ChildCallError, ImageRequest, LocalFlow, Prediction, RequestError, RequestFailed
from test_regions import CHILDREN, FLOW, make_repo, picture  # the regions tests' detector, classifier and flow


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path)


def test_run_answers_several_requests_as_one_execute(repo):
    blue = picture([("blue", (30, 10, 60, 40))])
    with LocalFlow(repo / "regions_flow", CHILDREN) as flow:  # det, a stand-in with three outputs, returns a dict
        results, timings = flow.run([ImageRequest([blue, blue], topk=1), ImageRequest([b"not an image"])])
        assert flow.calls[0] == ("det", 2)  # both good images in one call
    assert isinstance(results[0], Prediction) and results[0].routes[:, 0].tolist() == [b"blue", b"blue"]
    assert (isinstance(results[1], RequestError)
            and (results[1].code, results[1].reason) == ("INVALID_ARGUMENT", "unsupported_format"))
    assert timings.rejected == {("unsupported_format", "INVALID_ARGUMENT"): 1}


def test_a_flow_that_raises_is_reported_with_its_exception(repo):
    (repo / "regions_flow" / "1" / "flow.py").write_text(FLOW.replace("    return answer.attach(per_region)",
                                                                      "    raise KeyError('typo')"))
    with LocalFlow(repo / "regions_flow", CHILDREN, check=False) as flow:
        with pytest.raises(RequestFailed) as caught:
            flow.classify([picture([("red", (2, 2, 12, 12))])])
    message = str(caught.value)
    assert "flow regions_flow raised KeyError (LocalFlow: the exception is" in message and "server" not in message
    assert "a client would get INTERNAL" in message
    assert isinstance(caught.value.__cause__, KeyError) and caught.value.error.cause is caught.value.__cause__


@pytest.mark.parametrize("error,code", [(ChildCallError("queue full", busy=True), "UNAVAILABLE"),
                                        (ValueError("bad weights"), "INTERNAL")])
def test_a_stand_in_fails_the_way_a_served_child_would(repo, error, code):
    def colour(batch):
        raise error

    with LocalFlow(repo / "regions_flow", {**CHILDREN, "colour": colour}) as flow:
        with pytest.raises(RequestFailed) as caught:
            flow.classify([picture([("red", (2, 2, 12, 12))])])
    assert caught.value.error.code == code
    assert str(error) in caught.value.error.message


def test_a_stand_in_returning_another_dtype_than_its_config_is_a_broken_child(repo):
    with LocalFlow(repo / "regions_flow",
                   {**CHILDREN, "colour": lambda b: CHILDREN["colour"](b).astype(np.float64)}) as flow:
        with pytest.raises(RequestFailed, match=r"colour returned probs as FP64; its config\.pbtxt declares TYPE_FP32"):
            flow.classify([picture([("red", (2, 2, 12, 12))])])
