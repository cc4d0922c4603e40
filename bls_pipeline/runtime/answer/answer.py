"""What a flow answers, row by row: labels and a ROUTE per row, its own extra outputs, and
the regions it looked at.

    answer = batch.answer()
    answer.set(scores, "branch")            rows scores covers: their top-k, ROUTE <model>:branch; the
                                            optional rows its call skipped under overload keep
                                            their answer, ROUTE <its model>:degraded
    answer.skip(rows, "route")              rows ended early: no labels, this ROUTE
    answer.output("NEEDS_REVIEW", flags)    an output the flow model's config.pbtxt declares, per row
    answer.attach(region_answer)            the answer of a batch.regions(...): REGION_* outputs

The runtime turns it into each request's outputs (predictions.py); a declared output the flow
never fills fails the requests (and the load check) with its name: none is silently absent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from ...contract import JSON, REGION_OUTPUTS, STANDARD_OUTPUTS
from ...base.dtypes import numpy_dtype
from ...base.tensors import TensorInfo
from ..errors import FlowError
from ..call.rows import Rows, _as_rows

if TYPE_CHECKING:
    from ..call.scores import Scores

__all__ = ["Answer"]

class Answer:
    """The flow's answer for the rows of one batch (the images, or a batch of regions).
    Each row gets a classifier's Scores and a ROUTE, or ends early with a ROUTE and no
    labels. Later calls overwrite earlier ones, row by row."""

    _UNANSWERED, _SKIPPED = -1, -2

    def __init__(self, size: int, declared: Mapping[str, TensorInfo] | None = None, regions: Any = None):
        self.size = size
        self._declared = dict(declared or {})  # the flow model's outputs, by name (None: not checked)
        self.regions_of = regions  # the Regions this answer is for (None: the images)
        self._sources: list = []  # batch.Scores
        self._source = np.full(size, self._UNANSWERED, dtype=np.int64)  # index into _sources, or a marker
        self._routes = np.full(size, b"", dtype=object)
        # Rows an optional call skipped under overload, answered with that call's result:
        # (stage, why, reason), and their answer's route says degraded (routes()).
        self._degraded = np.full(size, None, dtype=object)
        self._outputs: dict[str, np.ndarray] = {}
        self._attached: list[Answer] = []

    def __repr__(self) -> str:
        what = "regions" if self.regions_of is not None else "images"
        return f"Answer({self.size} {what}, {int(self.pending.sum())} pending)"

    @property
    def pending(self) -> np.ndarray:
        """Boolean mask of the rows not answered yet."""
        return self._source == self._UNANSWERED

    def set(self, scores: Scores | None, branch: str) -> "Answer":
        """Answer the rows `scores` covers with its labels; ROUTE "<model>:<branch>". The rows
        its call skipped as optional under overload keep the answer they have (set before or
        after), and its ROUTE becomes "<that model>:degraded", the reason in the JSON answer."""
        if scores is None:
            raise FlowError(f"Answer.set(None, {branch!r}): that call found no READY model; check for None before "
                            "answering with it")
        if scores.size != self.size:
            raise FlowError(f"Answer.set: these Scores are for a batch of {scores.size} rows and this answer has "
                            f"{self.size}; answer regions with regions.answer(), images with batch.answer()")
        if len(scores.rows):
            self._source[scores.rows] = len(self._sources)
            self._sources.append(scores)
            self._routes[scores.rows] = f"{scores.source}:{branch}".encode()
        for group in getattr(scores, "_skipped", ()):
            for row, reason in zip(group.rows.tolist(), group.reasons.tolist()):
                self._degraded[row] = (group.stage, group.why, reason)
        return self

    def skip(self, rows: Rows, route: str) -> "Answer":
        """End these rows here: no labels (empty strings, score 0, class -1), ROUTE `route`."""
        picked = _as_rows(self.size, rows)
        self._source[picked] = self._SKIPPED
        self._routes[picked] = route.encode()
        return self

    def output(self, name: str, values) -> "Answer":
        """Fill the output `name` that the flow model's config.pbtxt declares: one value per
        row (a flag, a score, a vector, a string). For a regions answer, the output is per
        region, its dims [-1, ...] (the regions of each image)."""
        if name == JSON.name:
            raise FlowError(f"answer.output({name!r}): the runtime writes {name} from the rest of the answer; "
                            "fill those (set(), skip(), output(), attach()) and it follows")
        if name in STANDARD_OUTPUTS or name in REGION_OUTPUTS:
            raise FlowError(f"answer.output({name!r}): the runtime fills {name}; use set()/skip() (and attach() for "
                            "regions)")
        info = self._declared.get(name)
        if info is None:
            declared = ", ".join(n for n in self._declared if n not in STANDARD_OUTPUTS and n not in REGION_OUTPUTS)
            raise FlowError(f"answer.output({name!r}): the flow model declares no output {name} in its config.pbtxt "
                            f"(its own outputs: {declared or 'none'}); declare it there")
        dims = info.dims
        if self.regions_of is not None:
            if not dims or dims[0] != -1:
                raise FlowError(f"output {name} is filled per region, so its dims must start with -1 (the regions of "
                                f"each image), e.g. [-1] or [-1, 4]; config.pbtxt says {list(dims)}")
            dims = dims[1:]
        array = np.asarray(values, dtype=None if info.dtype in ("STRING", "BYTES") else numpy_dtype(info.dtype))
        if info.dtype in ("STRING", "BYTES"):
            array = np.array([v.encode() if isinstance(v, str) else bytes(v) for v in array.reshape(-1)],
                             dtype=object).reshape(array.shape)
        if array.ndim == 1 and dims == (1,):
            array = array.reshape(-1, 1)
        fits = array.shape[:1] == (self.size,) and array.ndim == 1 + len(dims) and all(
            d < 0 or d == s for d, s in zip(dims, array.shape[1:]))
        if not fits:
            raise FlowError(f"answer.output({name!r}): got shape {array.shape}; it needs one value per row "
                            f"({self.size}) of dims {list(dims)} (config.pbtxt)")
        self._outputs[name] = array
        return self

    def attach(self, regions_answer: "Answer") -> "Answer":
        """Send a regions answer with this one: each image's regions come back as the REGION_*
        outputs (boxes, top-k labels, scores, class ids, route) and the regions answer's own
        outputs. Regions of regions are attached the same way, each answer once."""
        if self.regions_of is not None:
            raise FlowError("attach() the regions answers to the images' answer (batch.answer())")
        if not isinstance(regions_answer, Answer) or regions_answer.regions_of is None:
            raise FlowError("answer.attach() takes the answer of a batch of regions (regions.answer())")
        declared = [n for n in self._declared if n in REGION_OUTPUTS]
        if self._declared and not declared:
            raise FlowError("answer.attach(): the flow model declares no REGION_* output in its config.pbtxt, so its "
                            "regions would be sent nowhere; declare those it should send "
                            f"({', '.join(REGION_OUTPUTS)})")
        if any(a is regions_answer for a in self._attached):
            raise FlowError("answer.attach(): that regions answer is attached already")
        self._attached.append(regions_answer)
        return self

    # ---- for the runtime ----------------------------------------------------------------
    @property
    def attached(self) -> list["Answer"]:
        return list(self._attached)

    @property
    def outputs(self) -> dict[str, np.ndarray]:
        return dict(self._outputs)

    def routes(self) -> np.ndarray:
        """Each row's ROUTE; a row answered degraded names the model whose answer stands."""
        marked = np.flatnonzero(self._degraded != None)  # noqa: E711 - elementwise
        if not len(marked):
            return self._routes
        routes = self._routes.copy()
        for row in marked:
            source = self._source[row]
            if source >= 0:
                routes[row] = f"{self._sources[source].source}:degraded".encode()
        return routes

    def models(self, row: int) -> tuple[str, ...]:
        """The models whose answer a row has (two for an average), none for a row skipped or pending."""
        source = self._source[row]
        return tuple(self._sources[source].model.split("+")) if source >= 0 and self._sources[source].model else ()

    def degraded(self, row: int) -> tuple[str, str, str] | None:
        """(the stage skipped, why, the reason) for a row answered degraded, else None."""
        return self._degraded[row]

    def groups(self, rows: np.ndarray) -> list[tuple[np.ndarray, Scores | None]]:
        """`rows` split by where their answer came from: (positions within `rows`, Scores or
        None for skipped rows). Unanswered rows are not included."""
        out = []
        sources = self._source[rows]
        for value in np.unique(sources):
            if value == self._UNANSWERED:
                continue
            positions = np.flatnonzero(sources == value)
            out.append((positions, None if value == self._SKIPPED else self._sources[value]))
        return out
