"""Children a flow runs in its own process: a CPU engine called without the BLS hop.

A flow lists them in its `run_in_process` parameter (child model names, comma-separated):
CPU engine models (their `artifact` an ONNX file or an OpenVINO IR, as models/*_onnx,
*_int8, *_openvino; a model of another kind fails the load). Each flow instance opens the
engine itself, set up by the child's own config.pbtxt (engines.onnx.open_engine, as the
child's adapter opens it), and a call to it runs here instead of going through
pb_utils.InferenceRequest: no request to Triton, no stub-to-stub hop, no copy of the inputs
into shared memory. A listed model the flow does not call, or whose folder is not beside
it (a remote repository), is logged and left to Triton.

What stays the same: which candidate answers and when a model is gone is still Triton's
readiness (routing.py: unload the child and the flow routes around it, as before); a call
names a version folder as before, and each version's engine opens on its first call (two
versions held per model: a rollout lets go of the older); the flow's bls_child_* metrics
count these calls. What differs, for an operator: Triton's own statistics and traces of the
child do not see them (the flow's do), and every flow instance holds a copy of the engine.
bls-serve puts a child that every loaded caller runs in process on standby, so its own
Triton model does not hold another copy (serve/repository.py).

Pure: the engine opener is injected.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from .. import hooks
from ...engines.artifact_io import Declared
from .calls import ChildRequest, Send
from ..load.children import version_folders
from ..errors import ChildCallError
from ...base.modelconfig import parse_config, string_parameters
from ...engines.onnx import ENGINE_SUFFIXES, open_engine
from ...base.errors import ConfigError

__all__ = ["InProcessChildren", "engine_file", "open_model_engine"]

log = logging.getLogger(__name__)

VERSIONS_HELD = 2  # engines held per model: the version serving, and a canary's (or the next)


def engine_file(model_dir: Path, version: str) -> Path | None:
    """The CPU engine file a model's version folder holds (its `artifact`), or None: the
    model is not a CPU engine model (no artifact, or another kind of file)."""
    artifact = string_parameters(parse_config(model_dir)).get("artifact", "")
    return Path(model_dir) / version / artifact if Path(artifact).suffix in ENGINE_SUFFIXES else None


def open_model_engine(model_dir: Path, version: str,
                      opener: Callable[[Path, Sequence[str], Sequence[str], Mapping[str, str],
                                        Declared], object] = open_engine):
    """The engine of a CPU engine model's version folder, opened as the model's adapter opens
    it: its config.pbtxt's tensors (the file checked against them) and parameters."""
    config = parse_config(model_dir)
    declared = Declared.from_config(Path(model_dir).name, config)
    return opener(engine_file(model_dir, version), *declared.names, string_parameters(config), declared)


class InProcessChildren:
    """The engines of `models` (children in `repo`), opened in this process, and a `send`
    that runs the requests to them here and passes the rest to another send.

    `lists`: the flow's candidate lists (the models it calls, in order of preference). A
    named model the flow does not call is left alone, as is one whose folder is not beside
    the flow (a remote repository, where Triton copies each model's folder alone): its calls
    go through Triton; both are logged. A named model whose folder says it is no CPU engine
    model fails the load. In each list the first of these models whose engine file is there
    opens now, so a file unlike its config fails the load and the first call pays no open;
    the others (fallbacks, models exported later) open on their first call."""

    def __init__(self, flow: str, repo: Path, models: Sequence[str], lists: Sequence[Sequence[str]],
                 opener: Callable[[Path, Sequence[str], Sequence[str], Mapping[str, str],
                                   Declared], object] = open_engine):
        self.flow, self.repo = flow, Path(repo)
        self._opener = opener
        self._engines: dict[tuple[str, str], object] = {}
        self._lock = threading.Lock()  # a version's first call opens its engine once
        called = {m for models in lists for m in models}
        here = []
        for model in dict.fromkeys(models):
            folder = self.repo / model
            if model not in called:
                log.info("%s: run_in_process names %s, which it does not call: nothing to run in process for it", flow,
                         model)
            elif not (folder / "config.pbtxt").is_file():
                log.info("%s calls %s through Triton: its folder is not beside %s (a remote repository)", flow, model,
                         flow)
            elif engine_file(folder, "1") is None:  # its artifact names no engine file
                raise ConfigError(f"model {flow}: parameter run_in_process names {model}, which is no CPU engine model "
                                  "(its artifact parameter must name an ONNX file or an OpenVINO IR, .onnx or .xml): "
                                  "remove it from the list")
            else:
                here.append(model)
        self.models = tuple(here)
        for candidates in lists:
            first = next((m for m in candidates if m in self.models and self._newest_file(m) is not None), None)
            if first is not None:
                self._engine(first, version_folders(self.repo / first)[0])

    def _newest_file(self, model: str) -> Path | None:
        versions = version_folders(self.repo / model)
        path = engine_file(self.repo / model, versions[0]) if versions else None
        return path if path is not None and path.is_file() else None

    def _engine(self, model: str, version: str):
        key = (model, version)
        engine = self._engines.get(key)
        if engine is not None:
            return engine
        with self._lock:
            if key not in self._engines:
                started = time.perf_counter()
                engine = open_model_engine(self.repo / model, version, self._opener)
                # A rollout moves the calls to a new version: the model's versions held stay
                # at VERSIONS_HELD (a stable and a canary), the one opened longest ago let go.
                held = [k for k in self._engines if k[0] == model]
                for old in held[:max(0, len(held) + 1 - VERSIONS_HELD)]:
                    del self._engines[old]
                    log.info("%s let go of %s version %s (a newer version opened)", self.flow, model, old[1])
                self._engines[key] = engine
                log.info("%s runs %s version %s in process (%s, opened in %.2f s)", self.flow, model, version,
                         engine_file(self.repo / model, version).name, time.perf_counter() - started)
            return self._engines[key]

    def runs(self, request: ChildRequest) -> bool:
        """Whether this request runs here: to one of the models, host arrays in and out (a GPU
        flow's call, CUDA tensors, goes to Triton as before)."""
        return (request.model in self.models and request.output_gpu is None
                and all(isinstance(v, np.ndarray) for v in request.inputs.values()))

    def call(self, request: ChildRequest) -> Mapping | ChildCallError:
        """The engine's outputs for one request, or the ChildCallError it failed with (a
        broken call, as a failed Triton call: the engine raised)."""
        version = request.version or version_folders(self.repo / request.model)[0]
        try:
            engine = self._engine(request.model, version)
            return engine.run(dict(request.inputs), request.outputs)
        except Exception as exc:  # noqa: BLE001 - the engine's failure is this call's, as in Triton
            return ChildCallError(f"{request.model} (in process): {str(exc) or type(exc).__name__}",
                                  model=request.model)

    def send(self, inner: Send) -> Send:
        """A send running the requests to these models here, in order, and passing the others
        (together, as one send) to `inner`."""

        def send(requests: Sequence[ChildRequest]) -> list:
            local = [i for i, r in enumerate(requests) if self.runs(r)]
            if not local:
                return list(inner(requests))
            out: list = [None] * len(requests)
            remote = sorted(set(range(len(requests))) - set(local))
            if remote:
                for i, result in zip(remote, inner([requests[i] for i in remote])):
                    out[i] = result
            with hooks.stage("child_exec"):
                for i in local:
                    out[i] = self.call(requests[i])
            return out

        return send

    def close(self) -> None:
        with self._lock:
            self._engines.clear()
