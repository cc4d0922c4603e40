"""Children a flow runs in its own process (runtime/call/in_process.py): which calls run here, the
engine each version opens, what fails the load, and the answers against LocalFlow's."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from bls_pipeline.runtime.call.calls import ChildRequest
from bls_pipeline.runtime.engine import FlowRuntime
from bls_pipeline.runtime.errors import ChildCallError
from bls_pipeline.runtime.call.in_process import InProcessChildren
from bls_pipeline.runtime.local import LocalFlow
from bls_pipeline.base.errors import ConfigError
from bls_pipeline.runtime.results import ImageRequest

MODELS = Path(__file__).resolve().parents[2] / "models"
SAMPLES = Path(__file__).resolve().parents[2] / "samples"
CHILD = "efficientnet_lite0_onnx"
LISTS = [("efficientnet_lite0_int8", CHILD), ("resnet50_onnx",)]  # the flow's candidate lists


def _tiny_classifier(path: Path, seed: int) -> None:
    """input (N,3,224,224) -> mean per channel -> (N,1000) logits, seeded weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(seed).normal(size=(3, 1000)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["input"], ["mean"], axes=[2, 3], keepdims=0),
         helper.make_node("MatMul", ["mean", "w"], ["output"])],
        "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 1000])],
        [numpy_helper.from_array(weights, "w")])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))


@pytest.fixture
def repo(tmp_path) -> Path:
    """classify_bls and efficientnet_lite0_onnx (a tiny seeded classifier in version 1, another in 2),
    resnet50_onnx's folder with no file."""
    repo = tmp_path / "models"
    ignore = shutil.ignore_patterns("*.onnx*", "*.json", "__pycache__")
    for model in ("classify_bls", CHILD, "resnet50_onnx"):
        shutil.copytree(MODELS / model, repo / model, ignore=ignore)
    _tiny_classifier(repo / CHILD / "1" / "model.onnx", seed=1)
    _tiny_classifier(repo / CHILD / "2" / "model.onnx", seed=2)
    return repo


def _request(model: str = CHILD, version: str = "", rows: int = 2, **kw) -> ChildRequest:
    pixels = np.random.default_rng(rows).random((rows, 3, 224, 224), dtype=np.float32)
    return ChildRequest(model, {"input": pixels}, ("output",), version=version, **kw)


def test_its_calls_run_here_and_the_others_go_to_triton_in_order(repo):
    children = InProcessChildren("classify_bls", repo, [CHILD], LISTS)
    sent = []

    def triton(requests):
        sent.extend(r.model for r in requests)
        return [{"output": np.full((len(r.inputs["input"]), 1000), 7.0, np.float32)} for r in requests]

    mine, other = _request(rows=3), _request("resnet50_onnx", rows=2)
    out = children.send(triton)([other, mine, other])
    assert sent == ["resnet50_onnx", "resnet50_onnx"]  # only the others, as one send
    assert out[0]["output"].shape == out[2]["output"].shape == (2, 1000) and np.all(out[0]["output"] == 7.0)
    expected = mine.inputs["input"].mean(axis=(2, 3)) @ _weights(repo, "2")  # unpinned: the newest version
    assert out[1]["output"].shape == (3, 1000) and np.allclose(out[1]["output"], expected, atol=1e-4)


def _weights(repo: Path, version: str) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(repo / CHILD / version / "model.onnx"))
    return numpy_helper.to_array(model.graph.initializer[0])


def test_each_version_opens_its_own_engine_on_its_first_call(repo):
    opened = []

    def opener(path, inputs, outputs, params, declared):
        opened.append(path.relative_to(repo).as_posix())
        return type("Engine", (), {"run": lambda self, feeds, names: {"output": np.zeros((2, 1000), np.float32)}})()

    children = InProcessChildren("classify_bls", repo, [CHILD], LISTS, opener=opener)
    assert opened == [f"{CHILD}/2/model.onnx"]  # the newest, at load: its file is checked there
    children.call(_request(version="1"))
    children.call(_request(version="1"))
    children.call(_request(version="2"))
    children.call(_request())  # unpinned: the newest
    assert opened == [f"{CHILD}/2/model.onnx", f"{CHILD}/1/model.onnx"]
    # A third version (a rollout): two stay held, the one opened first is let go.
    shutil.copytree(repo / CHILD / "2", repo / CHILD / "3")
    children.call(_request(version="3"))
    children.call(_request(version="1"))
    children.call(_request(version="2"))
    assert opened == [f"{CHILD}/{v}/model.onnx" for v in ("2", "1", "3", "2")]


def test_an_engine_that_raises_fails_its_call_as_broken_naming_the_model(repo):
    def opener(path, inputs, outputs, params, declared):
        class Engine:
            def run(self, feeds, names):
                raise RuntimeError("Got invalid dimensions for input: input")
        return Engine()

    error = InProcessChildren("classify_bls", repo, [CHILD], LISTS, opener=opener).call(_request())
    assert isinstance(error, ChildCallError) and not error.temporary and error.model == CHILD
    assert str(error) == f"{CHILD} (in process): Got invalid dimensions for input: input"


def test_a_call_wanting_gpu_outputs_goes_to_triton(repo):
    children = InProcessChildren("classify_bls", repo, [CHILD], LISTS)
    assert children.runs(_request()) and not children.runs(_request(output_gpu=0))
    assert not children.runs(_request("resnet50_onnx"))


def test_a_named_model_that_is_no_cpu_engine_fails_the_load_saying_so(repo):
    (repo / "resnet50_torch").mkdir()
    shutil.copy(MODELS / "resnet50_torch" / "config.pbtxt", repo / "resnet50_torch")
    with pytest.raises(ConfigError, match="names resnet50_torch, which is no CPU engine model"):
        InProcessChildren("classify_bls", repo, ["resnet50_torch"], [("resnet50_torch",)])
    (repo / CHILD / "2" / "model.onnx").write_bytes(b"not onnx")  # the engine that opens at load
    with pytest.raises(Exception, match="model.onnx"):
        InProcessChildren("classify_bls", repo, [CHILD], LISTS)


def test_models_it_does_not_call_or_cannot_reach_are_left_to_triton_and_logged(repo, caplog):
    """A name the flow does not call (a config copied from another flow), and one whose
    folder is not beside it (a remote repository): both logged, their calls go to Triton."""
    shutil.rmtree(repo / "resnet50_onnx")
    with caplog.at_level("INFO"):
        children = InProcessChildren("classify_bls", repo, [CHILD, "resnet50_onnx", "efficientnet_lite0_openvino"],
                                     LISTS)
    assert children.models == (CHILD,)
    assert not children.runs(_request("resnet50_onnx"))
    assert "classify_bls: run_in_process names efficientnet_lite0_openvino, which it does not call" in caplog.text
    assert "classify_bls calls resnet50_onnx through Triton: its folder is not beside classify_bls" in caplog.text


def test_only_the_first_engine_of_each_list_opens_at_load_the_fallbacks_on_their_first_call(repo):
    shutil.copytree(repo / CHILD, repo / "efficientnet_lite0_int8")
    opened = []

    def opener(path, inputs, outputs, params, declared):
        opened.append(path.relative_to(repo).as_posix())
        return type("Engine", (), {"run": lambda self, feeds, names: {"output": np.zeros((2, 1000), np.float32)}})()

    children = InProcessChildren("classify_bls", repo, [CHILD, "efficientnet_lite0_int8"], LISTS, opener=opener)
    assert opened == ["efficientnet_lite0_int8/2/model.onnx"]
    children.call(_request(CHILD))
    assert opened == ["efficientnet_lite0_int8/2/model.onnx", f"{CHILD}/2/model.onnx"]


def test_the_flow_answers_in_process_as_localflow_does(repo):
    """The flow runtime with the in-process send, Triton left out (every call runs here),
    answers each image as LocalFlow, which runs its children in process too."""
    shutil.rmtree(repo / CHILD / "2")  # LocalFlow runs version 1
    params = {"cascade_classifiers": "none", "classifiers": CHILD, "tta_threshold": "0", "run_in_process": CHILD}
    runtime = FlowRuntime.load(repo / "classify_bls", params, lambda *_: True)
    children = InProcessChildren("classify_bls", repo, runtime.options.run_in_process,
                                 runtime.settings.candidate_lists())

    def no_triton(requests):
        raise AssertionError(f"sent to Triton: {[r.model for r in requests]}")

    images = [(SAMPLES / f"{name}.jpg").read_bytes() for name in ("mug", "chelsea")]
    (answer,), _ = runtime.run([ImageRequest(images, (5,))], children.send(no_triton))
    local = LocalFlow(repo / "classify_bls", parameters=params, ready={CHILD}).classify(images, topk=5)
    assert np.array_equal(answer.labels, local.labels) and np.allclose(answer.scores, local.scores, atol=1e-5)
