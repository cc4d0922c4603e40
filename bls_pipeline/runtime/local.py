"""A flow model run in this process, without a server: for unit tests and notebooks.

The same flow.py, the same settings from its config.pbtxt (overridable), the same child
configs from the sibling folders and the same runtime as inside Triton. Only the child
calls differ: a child runs as the Python function you pass for it, else as the numpy
function its `function` parameter names, else by onnxruntime or OpenVINO on the engine
file its folder holds (its `artifact` parameter: an ONNX file or an OpenVINO IR, checked
against its config.pbtxt when the LocalFlow is made), else it is not READY.

    flow = LocalFlow("models/classify_bls", models={"resnet50_onnx": my_fake_resnet})
    prediction = flow.classify([jpeg_bytes])
    assert prediction.routes[0, 0] == b"resnet50_onnx:direct"
    flow.classify([jpeg_bytes], parameters={"skip_cascade": True}, timeout_s=0.5)  # what a client may send

`run([ImageRequest(images, topk, parameters=..., timeout_s=..., cancelled=...)])` sends
several at once; `cancelled` (a function) says when a request's client has gone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from .call.calls import ChildRequest
from .errors import ChildCallError
from .engine import FlowRuntime
from .results import ImageRequest, Prediction, RequestError, Timings
from ..engines.functions import FUNCTION_PARAMETER, load_function
from ..base.modelconfig import parse_config, string_parameters
from ..engines.onnx import ENGINE_SUFFIXES

__all__ = ["LocalFlow", "RequestFailed"]

# A child as a function: its input batch (or {input name: batch}, for a child with several
# inputs) -> its output (one output) or {output name: array}.
ChildFunction = Callable[[np.ndarray], "np.ndarray | Mapping[str, np.ndarray]"]


class RequestFailed(RuntimeError):
    """LocalFlow.classify's request failed; `error` is what a client would have received."""

    def __init__(self, error: RequestError):
        super().__init__(f"{error.message} (reason: {error.reason}; a client would get {error.code})")
        self.error = error


class LocalFlow:
    """The flow model in `model_dir`, run here.

    models: child functions by model name (they win over an ONNX file); "model@version" for
        a version a shadow or canary names.
    ready: which models are READY, a set or a function of the name (it may change between
        calls, to test rerouting); default: those with a function or an engine file (ONNX, OpenVINO IR).
    parameters: config.pbtxt parameters to set or override, as strings.
    """

    def __init__(self, model_dir: Path | str, models: Mapping[str, ChildFunction] | None = None, *,
                 ready: set[str] | Callable[[str], bool] | None = None, parameters: Mapping[str, str] | None = None,
                 check: bool = True):
        model_dir = Path(model_dir)
        self._repo = model_dir.parent
        self._functions = dict(models or {})
        self._ready = ready
        self._sessions: dict[str, object] = {}
        self.calls: list[tuple[str, int]] = []  # (model, images) of every child request, in order
        params = {**string_parameters(parse_config(model_dir)), **(parameters or {})}
        self.runtime = FlowRuntime.load(model_dir, params, self.is_ready, check=check)
        self.runtime.details = "LocalFlow: the exception is the RequestError's cause, and RequestFailed's __cause__"
        # Each READY child run from its engine file opens it now, as Triton would load it: a
        # file whose inputs or outputs differ from its config.pbtxt fails here, naming both sides.
        for model in self.runtime.children:
            if model not in self._functions and self.is_ready(model) and (runner := self._runner(model)) is not None \
                    and runner[1] != "function":
                self._session(model)

    def __enter__(self) -> "LocalFlow":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.runtime.close()

    def is_ready(self, model: str, version: str = "") -> bool:
        """Whether `model` is READY here; with a version (a shadow's or canary's candidate),
        whether "model@version" is."""
        if version:
            model = f"{model}@{version}"
        if self._ready is not None:
            return self._ready(model) if callable(self._ready) else model in self._ready
        return model in self._functions or (not version and self._runner(model) is not None)

    def run(self, requests: Sequence[ImageRequest]) -> tuple[list[Prediction | RequestError], Timings]:
        """Every request through the flow at once, as one execute() would."""
        return self.runtime.run(requests, self._send)

    def classify(self, images: Sequence[bytes], topk: int | None = None, *,
                 parameters: Mapping[str, object] | None = None,
                 timeout_s: float | None = None, request_id: str = "") -> Prediction:
        """One request; its Prediction, or RequestFailed with what the client would read.
        parameters: the request's own (the flow's Parameters, as a client sends them);
        timeout_s: its deadline, seconds from now (Triton's `timeout` request parameter)."""
        request = ImageRequest(list(images), topk, id=request_id, parameters=dict(parameters or {}),
                               timeout_s=timeout_s)
        (result,), _ = self.run([request])
        if isinstance(result, RequestError):
            raise RequestFailed(result) from result.cause
        return result

    # ---- the children ---------------------------------------------------------------------
    def _runner(self, model: str):
        """How this process runs `model` by itself: (its config, "function"/"onnx", what), or None."""
        model_dir = self._repo / model
        if not (model_dir / "config.pbtxt").is_file():
            return None
        config = parse_config(model_dir)
        params = string_parameters(config)
        if FUNCTION_PARAMETER in params:
            return config, "function", params[FUNCTION_PARAMETER]
        path = model_dir / "1" / params.get("artifact", "")
        if not path.is_file():
            return None
        return (config, path.suffix[1:], path) if path.suffix in ENGINE_SUFFIXES else None

    def _run_child(self, req: ChildRequest) -> Mapping[str, np.ndarray] | ChildCallError:
        data = next(iter(req.inputs.values()))
        name = f"{req.model}@{req.version}" if req.version else req.model  # a version only a trial names
        self.calls.append((name, len(data)))
        try:
            if name in self._functions:
                out = self._functions[name](data if len(req.inputs) == 1 else dict(req.inputs))
                return out if isinstance(out, Mapping) else {req.outputs[0]: np.asarray(out)}
            if req.version:
                raise ChildCallError(f"no function for {name} here: give LocalFlow models={{{name!r}: ...}}")
            return self._session(req.model)(req.inputs, req.outputs)
        except Exception as exc:  # noqa: BLE001 - a failed child call, as the server would report it
            # Fresh (no traceback keeping the batch alive); a stand-in raising ChildCallError
            # itself may mark the call unavailable or busy, as the server would.
            flags = {"unavailable": exc.unavailable, "busy": exc.busy} if isinstance(exc, ChildCallError) else {}
            return ChildCallError(str(exc) or type(exc).__name__, model=req.model, **flags)

    def _session(self, model: str):
        """A callable (inputs, outputs) -> {output: array} for `model`, made once."""
        if model not in self._sessions:
            runner = self._runner(model)
            if runner is None:
                raise ChildCallError(f"{model} has no function and no ONNX or OpenVINO file here: give LocalFlow "
                                     f"models={{{model!r}: ...}}", model=model)
            config, kind, what = runner
            if kind == "function":
                fn = load_function(self._repo / model / "1", what)
                self._sessions[model] = lambda inputs, outputs: {k: v for k, v in fn(inputs).items() if k in outputs}
            else:
                from ..engines.artifact_io import Declared
                from ..engines.onnx import OnnxModel, OpenVinoModel

                declared = Declared.from_config(model, config)  # a file unlike its config fails here, as in Triton
                engine = OnnxModel if kind == "onnx" else OpenVinoModel
                self._sessions[model] = engine(what, *declared.names, declared=declared).run
        return self._sessions[model]

    def _send(self, requests: Sequence[ChildRequest]) -> list:
        # One after another, in order (inside Triton, several go out together): what a
        # test records does not depend on thread timing.
        return [self._run_child(r) for r in requests]
