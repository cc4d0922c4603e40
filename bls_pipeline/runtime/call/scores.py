"""What a call gives back: a classifier's Scores, any model's Outputs, and one output left
where the call put it (a Column), for some rows of a batch.

Every per-row array a flow reads has one entry per row of the batch; rows a call did not
cover hold NaN (floats), -1 (integers), b"" (bytes) or False (booleans), so masks combine
with `&`, `|` and `~` and go straight back into `rows=`. They are numpy arrays on the host
whatever the device: on a GPU, the probabilities stay there, and only what the flow reads
(top-1, its class, a model's raw outputs) is copied out.
"""

from __future__ import annotations

import numpy as np

from ..admit.admission import Skipped
from ..decode.device import HOST, Device
from ..errors import FlowError
from .rows import Rows, _as_rows, _mask, _spread

__all__ = ["Column", "Outputs", "Scores"]


class _CallResult:
    """What a call's Scores and Outputs share: the rows of the batch it covered, and the
    optional ones it left out."""

    size: int
    rows: np.ndarray
    _skipped: tuple[Skipped, ...]

    @property
    def covered(self) -> np.ndarray:
        """Boolean mask of the rows this call answered."""
        return _mask(self.size, self.rows)

    @property
    def skipped(self) -> np.ndarray:
        """Boolean mask of the optional rows this call left out under overload."""
        return _skipped_mask(self.size, self._skipped)


class Scores(_CallResult):
    """A classifier's answer for some rows of the batch: probabilities over its labels.

    model: the model that answered (None when the call had no rows).
    version: its version that answered ("" when not known).
    rows: the rows covered, ascending.
    """

    def __init__(self, model: str | None, labels: tuple[str, ...], size: int, rows: np.ndarray, probs,
                 device: Device = HOST, version: str = "", skipped: tuple[Skipped, ...] = ()):
        self.model, self.labels, self.size, self.rows, self.version = model, labels, size, rows, version
        self._probs = probs  # (len(rows), classes) float32, on `device` (numpy, or a tensor)
        self._device = device
        self._skipped = skipped  # optional rows the call left out under overload, and why

    def __repr__(self) -> str:
        return f"Scores({self.source!r}, {len(self.rows)} of {self.size} rows, {len(self.labels)} classes)"

    @property
    def source(self) -> str | None:
        """What ROUTE names: the model, and "@<version>" when a version other than 1 answered
        (e.g. resnet50_onnx@2 during a rollout); "a+b" for an average of two."""
        if self.model is None or self.version in ("", "1") or "+" in self.model:
            return self.model
        return f"{self.model}@{self.version}"

    @property
    def probs(self) -> np.ndarray:
        """(rows, classes) probabilities (copied to the host from a GPU)."""
        return _spread(self.size, self.rows, self._device.to_host(self._probs))

    @property
    def top1(self) -> np.ndarray:
        """Each row's highest probability."""
        return _spread(self.size, self.rows, self._device.top1(self._probs))

    @property
    def top1_class(self) -> np.ndarray:
        """Each row's most probable class index."""
        return _spread(self.size, self.rows, self._device.top1_class(self._probs))

    def probs_for(self, rows: np.ndarray):
        """(len(rows), classes) probabilities of these rows, all covered, on the device (for
        the runtime's top-k)."""
        return self._device.take(self._probs, np.searchsorted(self.rows, rows))

    def __getitem__(self, rows: Rows) -> "Scores":
        """These rows only (those this call covered)."""
        picked = _as_rows(self.size, rows)
        keep = np.isin(self.rows, picked)
        return Scores(self.model, self.labels, self.size, self.rows[keep],
                      self._device.take(self._probs, np.flatnonzero(keep)),
                      self._device, self.version, _skipped_within(self._skipped, picked))

    def mean(self, other: "Scores") -> "Scores":
        """The average of two answers' probabilities, on the rows both cover. Its model is
        this one's when both came from the same model and version, else "<this>+<other>"."""
        if len(self.labels) != len(other.labels):
            raise FlowError(f"cannot average {self.model} ({len(self.labels)} classes) with {other.model} "
                            f"({len(other.labels)})")
        rows = np.intersect1d(self.rows, other.rows)
        mine, theirs = np.searchsorted(self.rows, rows), np.searchsorted(other.rows, rows)
        same = other.model is None or (other.model, other.version) == (self.model, self.version)
        model, version = (self.model, self.version) if same else (f"{self.source}+{other.source}", "")
        take = self._device.take
        return Scores(model, self.labels, self.size, rows, (take(self._probs, mine) + take(other._probs, theirs)) / 2,
                      self._device, version)


class Column:
    """One output of a call, for the rows it covered, left where the call put it (on a GPU
    flow instance, in GPU memory): `inputs={"features": outputs.tensor("features")}` hands it
    to the next child as it is (DLPack, no copy to the host)."""

    def __init__(self, model: str | None, name: str, size: int, rows: np.ndarray, value):
        self.model, self.name, self.size, self.rows, self.value = model, name, size, rows, value

    def __repr__(self) -> str:
        return f"Column({self.model!r}.{self.name}, {len(self.rows)} of {self.size} rows)"


class Outputs(_CallResult):
    """Any model's outputs for some rows: `outputs["NAME"]` is that output, one entry per row."""

    def __init__(self, model: str | None, size: int, rows: np.ndarray, values: dict[str, np.ndarray],
                 device: Device = HOST, skipped: tuple[Skipped, ...] = ()):
        self.model, self.size, self.rows = model, size, rows
        self._values = values  # on the device (numpy on the host)
        self._device = device
        self._host: dict[str, np.ndarray] = {}
        self._skipped = skipped

    def __repr__(self) -> str:
        return f"Outputs({self.model!r}, {len(self.rows)} of {self.size} rows, {sorted(self._values)})"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._values)

    def _check(self, name: str) -> None:
        if name not in self._values:
            raise FlowError(f"model {self.model} has no output {name!r}; its outputs: {', '.join(self._values)}")

    def __getitem__(self, name: str) -> np.ndarray:
        self._check(name)
        if name not in self._host:
            self._host[name] = _spread(self.size, self.rows, self._device.to_host(self._values[name]))
        return self._host[name]

    def raw(self, name: str) -> np.ndarray:
        """That output for the covered rows only, on the host (len(rows) entries)."""
        self._check(name)
        return self._device.to_host(self._values[name])

    def tensor(self, name: str) -> Column:
        """That output as a Column, to feed another child's input without a copy."""
        self._check(name)
        return Column(self.model, name, self.size, self.rows, self._values[name])


def _skipped_mask(size: int, skipped: tuple[Skipped, ...]) -> np.ndarray:
    mask = np.zeros(size, dtype=bool)
    for group in skipped:
        mask[group.rows] = True
    return mask


def _skipped_within(skipped: tuple[Skipped, ...], rows: np.ndarray) -> tuple[Skipped, ...]:
    """The skipped rows among `rows`, each with its reason."""
    out = []
    for group in skipped:
        keep = np.isin(group.rows, rows)
        if keep.any():
            out.append(Skipped(group.rows[keep], group.stage, group.why, group.reasons[keep]))
    return tuple(out)
