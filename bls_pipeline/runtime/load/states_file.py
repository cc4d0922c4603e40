"""Which of a flow's candidates failed to load, from the model states bls-serve keeps in a file
(contract.MODEL_STATES_ENV): Triton's repository index, each model's state and, for one that
failed to load, the reason. A candidate that is not READY because its load failed is a broken
part of the deployment (INTERNAL, naming the load error); one not READY for any other reason
(not loaded yet, being loaded, unloaded) is a condition that may pass (UNAVAILABLE).

The same file holds, for each READY model a flow calls, its config as served: ServedConfigs
hands the flow the configs when the file changed (a stat, at most once a second), and the
flow calls its children as served now (FlowRuntime.follow_children).

Pure: the file's text comes in, a mapping goes out. Without bls-serve (a stock Triton) there
is no file, and no failed load is known.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, Mapping

from ...base.modelconfig import ModelConfig, served_config

__all__ = ["ServedConfigs", "failed_loads", "load_failure", "reader", "served_configs"]

# What Triton's index says of a model that was unloaded (by the drain, or by an operator): not
# a failed load.
_NOT_FAILURES = ("", "unloaded")


def load_failure(entry: Mapping[str, str]) -> str | None:
    """Why a model failed to load, from its index entry ({"state", "reason"}), or None."""
    reason = str(entry.get("reason", "")).strip()
    return reason if entry.get("state") == "UNAVAILABLE" and reason not in _NOT_FAILURES else None


def failed_loads(text: str) -> dict[str, str]:
    """{model: why its load failed} from the file's JSON; {} for text that is not such JSON."""
    try:
        states = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(states, dict):
        return {}
    found = {model: load_failure(entry) for model, entry in states.items() if isinstance(entry, dict)}
    return {model: why for model, why in found.items() if why}


def reader(path: str | Path | None) -> Callable[[], dict[str, str]]:
    """A function that reads the file at `path` each time it is called (a flow calls it only
    when a role has no READY candidate), or one that knows of no failure (no path)."""
    if not path:
        return dict

    def read() -> dict[str, str]:
        try:
            return failed_loads(Path(path).read_text())
        except OSError:
            return {}

    return read


def served_configs(text: str) -> dict[str, ModelConfig]:
    """{model: its config as served} for the READY models the file gives one for."""
    try:
        states = json.loads(text)
    except ValueError:
        return {}
    found = {}
    for model, entry in (states.items() if isinstance(states, dict) else ()):
        if isinstance(entry, dict) and entry.get("state") == "READY" and isinstance(entry.get("config"), dict):
            try:
                found[model] = served_config(entry["config"])
            except ValueError:
                continue
    return found


class ServedConfigs:
    """The children's configs as served, from the file at `path`: changed() looks at the file
    at most every `every_s` (its mtime and size) and reads it only when that changed."""

    def __init__(self, path: str | Path | None, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self._path, self._every, self._clock = path, every_s, clock
        self._next = float("-inf")
        self._seen: tuple[int, int] | None = None

    def changed(self) -> dict[str, ModelConfig] | None:
        """The configs as served, when the file changed since the last look; else None."""
        now = self._clock()
        if not self._path or now < self._next:
            return None
        self._next = now + self._every
        try:
            st = os.stat(self._path)
            if (st.st_mtime_ns, st.st_size) == self._seen:
                return None
            self._seen = (st.st_mtime_ns, st.st_size)
            return served_configs(Path(self._path).read_text())
        except OSError:
            return None
