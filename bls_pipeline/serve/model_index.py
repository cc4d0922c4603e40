"""What a running tritonserver says of its models: each one's state in the repository index
(READY, LOADING, UNAVAILABLE with why, ...) and, for the python models READY now, their
config as served. bls-serve's watchdog probes the python models READY now (models loaded
later through the repository API too), its /ready and /metrics read the states, and the
flows read them from a file (contract.MODEL_STATES_ENV) to tell a failed load from a model
still to come (runtime/load/states_file.py). A model bls-serve was to load whose config.pbtxt
does not read (Triton's index gives it no state: it only logs "failed to poll") shows as a
failed load, UNAVAILABLE with the file and the reason, until Triton's index gives it a state
or its file reads again.

For the models a flow calls (`followed`), each READY one's entry also holds its config as
served ("config", Triton's JSON), asked anew at every refresh: a model loaded again with
another config (a fixed file, or a config sent with the load, as Model Analyzer does) stays
READY throughout, and only its config says what changed. The flows take it from the file
(FlowRuntime.follow_children) and call the child as it is served now.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Callable, Iterable

from google.protobuf import json_format

from ..runtime.load.states_file import load_failure
from ..base.modelconfig import ModelConfig
from .admin import AdminError, RepositoryAdmin

__all__ = ["ModelStates"]

log = logging.getLogger(__name__)


class ModelStates:
    """The index of the server behind `admin`, as of the last refresh(); `path`: the file the
    flows read, rewritten when the states change (None: no file); `unreadable`: {model: why
    its config.pbtxt does not read}, asked at each refresh, for the models to show as failed
    loads where Triton's index has no state for them."""

    def __init__(self, admin: RepositoryAdmin, path: Path | None = None,
                 unreadable: Callable[[], dict[str, str]] = dict, followed: Callable[[], Iterable[str]] = tuple):
        self._admin = admin
        self.path = path
        self._unreadable = unreadable
        self._followed = followed
        self._lock = threading.Lock()
        self.states: dict[str, dict] = {}  # model -> {"state", "reason"[, "config": as served]}
        self._configs: dict[str, ModelConfig] = {}  # READY model -> its config as served
        self._written = None

    def refresh(self) -> dict[str, dict[str, str]]:
        """Read the index again (a server that does not answer keeps the last states)."""
        try:
            index = self._admin.index()
        except AdminError:
            return self.states
        states: dict[str, dict[str, str]] = {}
        for entry in index:
            if "state" in entry:  # a model of the repository never loaded has none
                states[entry["name"]] = {"state": entry["state"], "reason": entry.get("reason", "")}
        for model, why in self._unreadable().items():
            states.setdefault(model, {"state": "UNAVAILABLE", "reason": why})
        served = {}
        for model in self._followed():
            if states.get(model, {}).get("state") == "READY":
                try:
                    served[model] = self._admin.config(model)
                except AdminError as exc:  # unloaded meanwhile: the next refresh says so
                    log.debug("config of %s as served not read: %s", model, exc)
        for model, config in served.items():
            states[model] = {**states[model], "config": config}
        with self._lock:  # the watchdog's rounds and the status port's refresh: one at a time
            self.states = states
            for gone in [m for m in self._configs if states.get(m, {}).get("state") != "READY" or m in served]:
                del self._configs[gone]  # its config is read again when it is READY again
            for model, config in served.items():
                try:
                    self._configs[model] = _config(config)
                except (json_format.ParseError, ValueError):
                    pass  # python_models() asks again, and says why
            self._write(states)
        return states

    def failed(self) -> dict[str, str]:
        """{model: why its load failed} as of the last refresh."""
        found = {m: load_failure(entry) for m, entry in self.states.items()}
        return {m: why for m, why in found.items() if why}

    def ready(self) -> list[str]:
        return [m for m, entry in self.states.items() if entry["state"] == "READY"]

    def python_models(self, order: list[str] = ()) -> dict[str, ModelConfig]:
        """The python-backend models READY as of the last refresh, with their configs as served:
        those in `order` first, in its order, then the others by name."""
        ready = self.ready()
        ranked = [m for m in order if m in ready] + sorted(m for m in ready if m not in order)
        found = {}
        for model in ranked:
            config = self._configs.get(model)
            if config is None:
                try:
                    config = self._configs[model] = _config(self._admin.config(model))
                except (AdminError, json_format.ParseError, ValueError) as exc:
                    log.warning("could not read the config of %s as served (%s): not watched until it is read", model,
                                exc)
                    continue
            if config.backend == "python":
                found[model] = config
        return found

    def _write(self, states: dict) -> None:
        if self.path is None or states == self._written:
            return
        part = self.path.with_name(f".{self.path.name}.part")
        try:
            part.write_text(json.dumps(states))
            os.replace(part, self.path)  # the flows read a whole file, old or new
        except OSError as exc:  # its folder gone with a stopped server
            log.debug("model states not written: %s", exc)
            return
        self._written = states


def _config(served: dict) -> ModelConfig:
    return json_format.ParseDict(served, ModelConfig(), ignore_unknown_fields=True)
