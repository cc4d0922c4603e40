"""A standby engine (engines/standby.py): checked at load, held only while calls come."""

from __future__ import annotations

import numpy as np
import pytest

from bls_pipeline.engines.standby import StandbyEngine


class Engine:
    opened = 0

    def __init__(self):
        type(self).opened += 1
        self.inputs, self.outputs = ("input",), ("output",)

    def run(self, feeds, outputs=None):
        return {"output": feeds["input"] * 2}


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def standby():
    Engine.opened = 0
    clock = Clock()
    return StandbyEngine("fallback", Engine, release_after_s=30, clock=clock), clock


def test_it_opens_once_at_load_for_the_check_and_releases_at_once(standby):
    engine, _ = standby
    assert Engine.opened == 1 and not engine.is_open and engine.outputs == ("output",)


def test_a_broken_file_still_fails_the_load():
    def broken():
        raise ValueError("model.onnx has inputs ['x']")

    with pytest.raises(ValueError, match="inputs"):
        StandbyEngine("fallback", broken, release_after_s=30)


def test_the_first_call_opens_it_and_it_answers_as_the_engine(standby):
    engine, _ = standby
    out = engine.run({"input": np.ones(3)})
    assert out["output"].tolist() == [2, 2, 2] and engine.is_open and engine.opened == 1
    engine.run({"input": np.ones(1)})
    assert Engine.opened == 2  # the load's and the first call's


def test_it_is_released_only_after_release_after_s_without_a_call(standby):
    engine, clock = standby
    engine.run({"input": np.ones(1)})
    clock.now += 29.9
    assert not engine.release_if_idle() and engine.is_open
    engine.run({"input": np.ones(1)})  # a call starts the wait again
    clock.now += 29.9
    assert not engine.release_if_idle()
    clock.now += 0.2
    assert engine.release_if_idle() and not engine.is_open
    assert not engine.release_if_idle()  # nothing left to release
    engine.run({"input": np.ones(1)})
    assert engine.is_open and engine.opened == 2
