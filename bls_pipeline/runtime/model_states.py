"""Which of a flow's candidates failed to load, from the model states bls-serve keeps in a file
(contract.MODEL_STATES_ENV): Triton's repository index, each model's state and, for one that
failed to load, the reason. A candidate that is not READY because its load failed is a broken
part of the deployment (INTERNAL, naming the load error); one not READY for any other reason
(not loaded yet, being loaded, unloaded) is a condition that may pass (UNAVAILABLE).

Pure: the file's text comes in, a mapping goes out. Without bls-serve (a stock Triton) there
is no file, and no failed load is known.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Mapping

__all__ = ["failed_loads", "load_failure", "reader"]

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
