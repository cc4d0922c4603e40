"""The flow runtime on a TorchDevice (the GPU path's code, run here with torch on the CPU)
against the same runtime on the numpy HostDevice: the shipped flows answer alike, top-k
and its ties come out the same, a bad image fails its own request alike."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

torch = pytest.importorskip("torch")

from bls_pipeline.flow import LocalFlow  # noqa: E402
from bls_pipeline.runtime.call.scores import Scores  # noqa: E402
from bls_pipeline.runtime.decode.device import HostDevice  # noqa: E402
from bls_pipeline.runtime.engine import FlowRuntime  # noqa: E402
from bls_pipeline.base.modelconfig import parse_config, string_parameters  # noqa: E402
from bls_pipeline.runtime.results import ImageRequest, Prediction, RequestError  # noqa: E402
from bls_pipeline.runtime.decode.torch_device import TorchDevice  # noqa: E402

MODELS = Path(__file__).resolve().parents[2] / "models"
SAMPLES = Path(__file__).resolve().parents[2] / "samples"
LABELS = tuple((MODELS / "resnet50_onnx" / "labels.txt").read_text().splitlines())


def coarse_classifier(batch) -> np.ndarray:
    """A fake classifier that one pixel step cannot change: the class is the coarse mean
    colour of the image's quadrants, its logits far apart from the next ones."""
    x = np.asarray(batch, dtype=np.float32)
    quadrants = x.reshape(len(x), 3, 2, 112, 2, 112).mean(axis=(3, 5)).reshape(len(x), -1)  # 12 numbers
    classes = (np.floor((quadrants + 3.0) * 2.0).astype(np.int64) * np.arange(1, 13)).sum(axis=1) % 1000
    logits = np.tile(-np.arange(1000, dtype=np.float32) * 0.01, (len(x), 1))
    logits[np.arange(len(x)), classes] = 6.0
    return logits


def _host_send(flow: LocalFlow):
    """The children run as numpy functions, so tensors cross to numpy here, as they cross
    to the child's stub in Triton."""
    def send(requests):
        plain = [type(r)(r.model, {k: np.asarray(v.cpu()) if hasattr(v, "cpu") else v for k, v in r.inputs.items()},
                         r.outputs)
                 for r in requests]
        return flow._send(plain)
    return send


def _flows(model: str, params: dict[str, str] | None = None):
    children = {"resnet50_onnx": coarse_classifier, "efficientnet_lite0_onnx": coarse_classifier}
    # READY: the stand-ins and image_quality alone (an engine built in models/ must not answer instead)
    local = LocalFlow(MODELS / model, children, parameters=params, ready={*children, "image_quality"})
    config = {**string_parameters(parse_config(MODELS / model)), **(params or {})}
    on_torch = FlowRuntime.load(MODELS / model, config, local.is_ready, device="cpu")
    return local, on_torch


def _requests() -> list[ImageRequest]:
    photos = [p.read_bytes() for p in sorted(SAMPLES.glob("*.*g"))]
    return [ImageRequest([photos[0], photos[1]], 3), ImageRequest([photos[2]]), ImageRequest(photos[3:], 2),
            ImageRequest([photos[4], b"not an image"])]


@pytest.mark.parametrize("model,params", [
    ("classify_bls", None),  # the cascade: top-1 under the threshold escalates
    ("classify_bls", {"cascade_classifiers": "none", "tta_threshold": "1.0"}),  # every image gets the flipped pass
    ("triage_bls", None),  # image_quality (a grey 64x64 thumbnail) first, then two voters together
])
def test_a_flow_answers_alike_on_both_devices(model, params):
    local, on_torch = _flows(model, params)
    want, _ = local.run(_requests())
    got, _ = on_torch.run(_requests(), _host_send(local))
    for a, b in zip(want, got):
        assert type(a) is type(b)
        if isinstance(a, RequestError):
            assert (a.message, a.reason) == (b.message, b.reason)
            continue
        assert np.array_equal(a.routes, b.routes)
        assert np.array_equal(a.class_ids[:, 0], b.class_ids[:, 0])
        np.testing.assert_allclose(a.scores[:, 0], b.scores[:, 0], atol=1e-4)
        assert a.labels.shape == b.labels.shape
    on_torch.close()
    local.close()


def test_top_k_on_the_device_is_the_cpu_paths_ties_and_all():
    rng = np.random.default_rng(0)
    probs = rng.random((6, 1000)).astype(np.float32)
    probs[:, 10:20] = 0.999  # ten equal scores: ascending class order wins
    probs /= probs.sum(axis=1, keepdims=True)
    device = TorchDevice("cpu")
    a = Scores("m", LABELS, 6, np.arange(6), probs)
    b = Scores("m", LABELS, 6, np.arange(6), torch.from_numpy(probs), device)
    asks = [(0, np.array([0, 2]), 5), (1, np.array([1]), 12), (0, np.array([3, 4, 5]), 1)]
    want = HostDevice().top_k([(a, rows, k) for _, rows, k in asks])
    got = device.top_k([(b, rows, k) for _, rows, k in asks])
    for w, g in zip(want, got):
        assert np.array_equal(w.class_ids, g.class_ids) and np.array_equal(w.labels, g.labels)
        np.testing.assert_array_equal(w.scores, g.scores)
    assert list(got[1].class_ids[0, :10]) == list(range(10, 20))


def test_scores_give_the_flow_host_arrays_from_the_device():
    device = TorchDevice("cpu")
    probs = np.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]], np.float32)
    labels = ("a", "b", "c")
    s = Scores("m", labels, 4, np.array([1, 3]), torch.from_numpy(probs), device)
    assert isinstance(s.top1, np.ndarray) and np.allclose(s.top1, [np.nan, 0.7, np.nan, 0.5], equal_nan=True)
    assert list(s.top1_class) == [-1, 1, -1, 0]
    assert isinstance(s.probs, np.ndarray) and np.allclose(s.probs[3], probs[1])
    half = s[np.array([False, False, False, True])]
    assert list(half.rows) == [3] and np.allclose(device.to_host(half.probs_for(np.array([3]))), probs[1:])
    mean = s.mean(Scores("n", labels, 4, np.array([3]), torch.tensor([[0.1, 0.0, 0.9]]), device))
    assert mean.model == "m+n" and np.allclose(mean.probs[3], [0.3, 0.1, 0.6])


def test_child_requests_ask_for_outputs_on_the_flows_gpu():
    """On a CUDA device every pixel child's outputs are asked for in that GPU's memory; on
    the host, and for string outputs, nowhere in particular."""
    local, on_torch = _flows("classify_bls")
    sent = []

    def send(requests):
        sent.extend(requests)
        return _host_send(local)(requests)

    on_torch.run(_requests(), send)
    assert sent and all(r.output_gpu is None for r in sent)  # torch on the CPU: no GPU to ask for
    on_torch.device.gpu = 0  # what a cuda:0 device says
    sent.clear()
    on_torch.run(_requests(), send)
    assert sent and all(r.output_gpu == 0 for r in sent)
    local.close()
    on_torch.close()


def test_a_png_request_goes_through_the_torch_path_too(encode):
    local, on_torch = _flows("classify_bls", {"cascade_classifiers": "none", "tta_threshold": "0"})
    buf = io.BytesIO()
    Image.new("RGB", (300, 200), (30, 120, 200)).save(buf, "PNG")
    (got,), _ = on_torch.run([ImageRequest([buf.getvalue()])], _host_send(local))
    assert isinstance(got, Prediction) and got.routes[0, 0] == b"resnet50_onnx:direct"
    local.close()
    on_torch.close()


def test_the_cpu_path_never_imports_torch():
    """A CPU stub's imports and a run on the HostDevice leave torch out of the process (it
    costs every python stub memory); the GPU path imports it when built."""
    import subprocess
    import sys

    script = f"""
import sys
import bls_pipeline.adapter, bls_pipeline.flow
from bls_pipeline.runtime.engine import FlowRuntime
from bls_pipeline.base.modelconfig import parse_config, string_parameters
from bls_pipeline.runtime.results import ImageRequest
import numpy as np
models = {str(MODELS)!r}
params = string_parameters(parse_config(models + "/classify_bls"))
runtime = FlowRuntime.load(models + "/classify_bls", params, lambda m: True)
def send(requests):
    return [{{r.outputs[0]: np.zeros((len(next(iter(r.inputs.values()))), 1000), np.float32)}} for r in requests]
(result,), _ = runtime.run([ImageRequest([open({str(SAMPLES / 'mug.jpg')!r}, 'rb').read()])], send)
assert result.routes[0, 0], result
print("torch" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def _column_run(tmp_path, as_dtype=None):
    """The regions tests' flow with the head fed colour's raw output as a Column, on the
    torch runtime, the transport handing outputs over as torch tensors (as_dtype: colour's
    probs handed over as that dtype). (its result, what head was fed, what colour handed over)"""
    from test_regions import CHILDREN, FLOW, make_repo, picture  # the regions tests' repository

    repo = make_repo(tmp_path)
    text = FLOW.replace('    head = regions.infer(settings.head, rows=colours.covered, '
                        'inputs={"features": colours.probs})',
                        '''    raw = regions.infer(settings.colour)
    head = regions.infer(settings.head, inputs={"features": raw.tensor("probs")})''')
    (repo / "regions_flow" / "1" / "flow.py").write_text(text)
    local = LocalFlow(repo / "regions_flow", CHILDREN)
    on_torch = FlowRuntime.load(repo / "regions_flow", string_parameters(parse_config(repo / "regions_flow")),
                                local.is_ready, device="cpu")
    handed_over, fed = {}, {}

    def send(requests):
        answers = _host_send(local)(requests)
        out = []
        for request, answer in zip(requests, answers):
            if request.model == "head":
                fed["features"] = request.inputs["features"]
            as_device = {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) and v.dtype != object
                         else v for k, v in answer.items()}
            if request.model == "colour":
                if as_dtype is not None:
                    as_device["probs"] = as_device["probs"].to(as_dtype)
                handed_over.setdefault("probs", []).append(as_device["probs"])
            out.append(as_device)
        return out

    try:
        (result,), _ = on_torch.run([ImageRequest([picture([("blue", (30, 10, 60, 40)), ("red", (2, 2, 12, 12))])])],
                                    send)
    finally:
        local.close()
        on_torch.close()
    return result, fed, handed_over


def test_a_column_goes_to_the_next_child_as_the_device_tensor_it_came_as(tmp_path):
    """outputs.tensor(name) on a torch flow instance: the child's output tensor (DLPack from
    the stub, here a torch tensor as the transport hands it over) is the next child's input
    as it is, never copied to the host."""
    result, fed, handed_over = _column_run(tmp_path)
    assert not isinstance(result, RequestError), result
    assert isinstance(fed["features"], torch.Tensor)
    assert fed["features"].data_ptr() == handed_over["probs"][-1].data_ptr()  # the same memory: no copy


def test_a_device_output_of_another_dtype_than_its_config_fails_as_a_broken_child(tmp_path):
    """A device tensor is not cast behind the flow's back: colour handing over float64 for
    its TYPE_FP32 output is a broken child (INTERNAL, naming it and both types), and the
    next child is never fed it."""
    result, fed, _ = _column_run(tmp_path, as_dtype=torch.float64)
    assert isinstance(result, RequestError)
    assert (result.code, result.reason) == ("INTERNAL", "colour")
    assert "colour returned probs as FP64; its config.pbtxt declares TYPE_FP32" in result.message
    assert "features" not in fed  # head was never called
