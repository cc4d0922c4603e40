"""Which flows that failed their load to load again: a flow reads its children's configs as it
loads, so one whose child was broken (its config.pbtxt did not read, or did not make a child
a flow can call) fails its load, and stays failed after the child is fixed unless someone
loads it again. bls-serve does: at each watchdog round it loads again every flow whose last
load failed and one of whose children changed since (READY now, or served with another
config), once per change, so a flow that still fails is not loaded round after round.

Pure: the model states (ModelStates.states) and what calls what come in, flows to load go out.
"""

from __future__ import annotations

import json
from typing import Mapping

from ..runtime.load.states_file import load_failure

__all__ = ["FlowRetries"]


class FlowRetries:
    """callees: {flow: the models it calls} (repository.Repository.callees)."""

    def __init__(self, callees: Mapping[str, tuple[str, ...]]):
        self._callees = callees
        self._seen: dict[str, str] = {}  # failed flow -> its children's states when it last failed or was tried

    def due(self, states: Mapping[str, Mapping]) -> dict[str, tuple[str, ...]]:
        """{flow: its children READY now} for each failed flow to load again now."""
        due = {}
        for flow, calls in self._callees.items():
            if not calls or load_failure(states.get(flow, {})) is None:
                self._seen.pop(flow, None)  # READY, loading, unloaded, or never loaded: not ours to load
                continue
            children = json.dumps([[m, states.get(m, {}).get("state"), states.get(m, {}).get("config")] for m in calls],
                                  sort_keys=True)
            before = self._seen.get(flow)
            self._seen[flow] = children
            ready = tuple(m for m in calls if states.get(m, {}).get("state") == "READY")
            if before is not None and before != children and ready:
                due[flow] = ready
        return due
