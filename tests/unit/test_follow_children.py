"""Flows follow their children (issue 42), the pure parts: a flow calls a child as it is served
now (FlowRuntime.follow_children, from bls-serve's model states), splits its calls at the max
batch the server names when it refuses one, and bls-serve loads again a flow that failed its
load once one of its children changes (serve/flow_retries.py). The served whole:
tests/integration/test_flows_follow_children.py."""

from __future__ import annotations

import io
import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bls_pipeline.flow import LocalFlow
from bls_pipeline.runtime.call.batch import ChildCallError
from bls_pipeline.runtime.load.states_file import ServedConfigs, served_configs
from bls_pipeline.base.modelconfig import parse_config
from bls_pipeline.runtime.results import ImageRequest, Prediction
from bls_pipeline.serve.flow_retries import FlowRetries
from google.protobuf import json_format

MODELS = Path(__file__).resolve().parents[2] / "models"
CHILD = "cls"


def _config(side: int, max_batch: int) -> str:
    return textwrap.dedent(f"""\
        name: "{CHILD}"
        backend: "python"
        max_batch_size: {max_batch}
        input [ {{ name: "input", data_type: TYPE_FP32, dims: [ 3, {side}, {side} ] }} ]
        output [ {{ name: "output", data_type: TYPE_FP32, dims: [ 1000 ], label_filename: "labels.txt" }} ]
        """)


def _served(repo: Path) -> dict:
    """The child's config as Triton serves it (its JSON), from its folder."""
    return json_format.MessageToDict(parse_config(repo / CHILD), preserving_proto_field_name=True)


def _png(colour) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), colour).save(buf, "PNG")
    return buf.getvalue()


class Child:
    """The child as the server runs it: it takes the side and the batch it is served with now."""

    def __init__(self, side: int, max_batch: int):
        self.side, self.max_batch, self.batches = side, max_batch, []

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        if len(batch) > self.max_batch:
            raise ChildCallError(f"inference request batch-size must be <= {self.max_batch} for '{CHILD}'")
        if batch.shape[1:] != (3, self.side, self.side):
            raise ChildCallError(f"unexpected shape for input 'input' for model '{CHILD}'. Expected "
                                 f"[-1,3,{self.side},{self.side}], got {[len(batch), *batch.shape[1:]]}")
        self.batches.append(len(batch))
        return np.tile(np.arange(1000, dtype=np.float32), (len(batch), 1))


@pytest.fixture
def repo(tmp_path) -> Path:
    repo = tmp_path / "models"
    shutil.copytree(MODELS / "classify_bls", repo / "classify_bls", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / CHILD).mkdir()
    (repo / CHILD / "config.pbtxt").write_text(_config(200, 8))
    shutil.copy(MODELS / "resnet50_onnx" / "labels.txt", repo / CHILD / "labels.txt")
    return repo


def _flow(repo: Path, child: Child) -> LocalFlow:
    return LocalFlow(repo / "classify_bls", {CHILD: child}, ready={CHILD}, parameters={
        "cascade_classifiers": "none", "classifiers": CHILD, "tta_threshold": "0", "run_in_process": "none"})


def test_a_child_served_with_another_config_is_called_as_served_now(repo):
    child = Child(224, 8)  # fixed and loaded: 224x224 now, where the flow loaded with 200
    flow = _flow(repo, child)
    try:
        (result,), _ = flow.run([ImageRequest([_png((200, 30, 30))])])
        assert "Expected [-1,3,224,224]" in result.message  # what main answered until the flow was loaded again
        (repo / CHILD / "config.pbtxt").write_text(_config(224, 8))
        served = served_configs(json.dumps({CHILD: {"state": "READY", "reason": "", "config": _served(repo)}}))
        assert flow.runtime.follow_children(served) == (CHILD,)
        assert flow.runtime.follow_children(served) == ()  # the same config again: nothing to do
        (result,), _ = flow.run([ImageRequest([_png((200, 30, 30))])])
        assert isinstance(result, Prediction), result
    finally:
        flow.close()


def test_a_served_config_a_flow_cannot_call_keeps_the_old_one(repo, caplog):
    flow = _flow(repo, Child(200, 8))
    try:
        (repo / CHILD / "config.pbtxt").write_text(_config(200, 8).replace("dims: [ 1000 ]", "dims: [ 999 ]"))
        assert flow.runtime.follow_children({CHILD: parse_config(repo / CHILD)}) == ()
        assert "cannot be called" in caplog.text and "labels" in caplog.text
        (result,), _ = flow.run([ImageRequest([_png((10, 10, 10))])])
        assert isinstance(result, Prediction), result
    finally:
        flow.close()


def test_a_call_refused_for_its_batch_size_is_split_at_the_limit_the_server_names(repo):
    child = Child(200, 1)  # loaded again with max_batch_size 1 (Model Analyzer's search)
    flow = _flow(repo, child)
    try:
        results, _ = flow.run([ImageRequest([_png((200, 30, 30)), _png((30, 200, 30))]),
                               ImageRequest([_png((0, 0, 90))])])
        assert all(isinstance(r, Prediction) for r in results), results
        assert child.batches == [1, 1, 1]
        assert flow.runtime.children[CHILD].max_batch_size == 1  # and so from now on, without a refusal
        flow.run([ImageRequest([_png((200, 30, 30)), _png((30, 200, 30))])])
        assert child.batches == [1, 1, 1, 1, 1]
    finally:
        flow.close()


def test_a_refusal_at_the_limit_already_used_fails_as_before(repo):
    child = Child(200, 8)
    flow = _flow(repo, child)
    try:
        child.max_batch = 0  # refuses every batch, naming no limit a flow can send
        (result,), _ = flow.run([ImageRequest([_png((200, 30, 30))])])
        assert "batch-size must be <= 0" in result.message and result.code == "INTERNAL"
        assert flow.runtime.children[CHILD].max_batch_size == 8
    finally:
        flow.close()


def test_served_configs_reads_the_file_only_when_it_changed(tmp_path, repo):
    path = tmp_path / "states.json"
    now = [0.0]
    watch = ServedConfigs(path, every_s=1.0, clock=lambda: now[0])
    assert watch.changed() is None  # no file yet
    now[0] = 1.0
    path.write_text(json.dumps({CHILD: {"state": "READY", "reason": "", "config": _served(repo)},
                                "gone": {"state": "UNAVAILABLE", "reason": "unloaded"}}))
    assert list(watch.changed()) == [CHILD]
    now[0] = 2.0
    assert watch.changed() is None  # unchanged
    path.write_text(json.dumps({CHILD: {"state": "READY", "reason": "",
                                        "config": {**_served(repo), "max_batch_size": 2}}}))
    now[0] = 2.5
    assert watch.changed() is None  # looked a moment ago
    now[0] = 3.0
    assert watch.changed()[CHILD].max_batch_size == 2
    assert ServedConfigs(None).changed() is None  # no bls-serve: nothing follows


def test_a_failed_flow_is_loaded_again_once_a_child_changes_and_only_once():
    retries = FlowRetries({"flow": ("a", "b"), "plain": ()})
    failed = {"state": "UNAVAILABLE", "reason": "ConfigError: model a: ..."}
    states = {"flow": failed, "a": {"state": "UNAVAILABLE", "reason": "bad"},
              "b": {"state": "UNAVAILABLE", "reason": "bad"}}
    assert retries.due(states) == {}  # as it failed: nothing new
    assert retries.due(states) == {}
    states["a"] = {"state": "READY", "reason": "", "config": {"max_batch_size": 8}}
    assert retries.due(states) == {"flow": ("a",)}
    assert retries.due(states) == {}  # tried: again only after another change
    states["a"] = {"state": "READY", "reason": "", "config": {"max_batch_size": 4}}
    assert retries.due(states) == {"flow": ("a",)}
    states["b"] = {"state": "UNAVAILABLE", "reason": "unloaded"}
    states["a"] = {"state": "UNAVAILABLE", "reason": "unloaded"}
    assert retries.due(states) == {}  # nothing READY to call
    states["flow"] = {"state": "UNAVAILABLE", "reason": "unloaded"}  # unloaded by someone: not ours to load
    states["a"] = {"state": "READY", "reason": ""}
    assert retries.due(states) == {}
