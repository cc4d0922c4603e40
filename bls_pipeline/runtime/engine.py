"""The flow runtime: requests in, one flow call per execute(), per-request answers out.

    check each request (empty, too large, TOPK) ─> decode + preprocess every image once
    (thread pool; a bad image fails its own request) ─> flow(batch, settings) ─> top-k per
    request, ROUTE per image; what went wrong fails only the requests it touched

Pure Python over an injected `send` (runtime/batch.py): the Triton adapter makes it
pb_utils.InferenceRequest calls, LocalFlow (runtime/local.py) runs models in process.
Pixels and scores live on a Device (runtime/device.py): numpy on the CPU, or torch on the
flow model's GPU when its instance is KIND_GPU.
"""

from __future__ import annotations

import logging
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..contract import JSON, REGION_OUTPUTS, STANDARD_OUTPUTS
from ..stages.preprocess import PreprocessSpec, renormalize
from . import hooks
from .answer import Answer
from .answer_json import add_documents
from .batch import Batch, ChildCallError, ChildRequest, FlowError, NoModelReady, Send
from .children import ChildModel, TensorInfo, load_child, version_folders
from .device import Device, device_for
from .loadcheck import check_flow
from .loader import FlowDefinition, load_flow
from .modelconfig import data_type, parse_config
from .routing import CandidateChooser
from .results import BROKEN, UNAVAILABLE, ChildStats, ImageRequest, Prediction, RequestError, Timings
from .settings import ConfigError, RuntimeSettings, Settings, parse_settings
from .trials import Shadow, Trial

__all__ = ["FlowRuntime"]

log = logging.getLogger(__name__)

_RETRY_PAUSE_S = 0.1  # between looks for a model to come back, while a call waits for one


class FlowRuntime:
    """One flow model's runtime: its flow, settings and child models, loaded once."""

    def __init__(self, name: str, flow: FlowDefinition, settings: Settings, runtime: RuntimeSettings,
                 children: dict[str, ChildModel], is_ready: Callable[..., bool], instances: int = 1,
                 device: str | None = None, versions_of: Callable[[str], tuple[str, ...]] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 outputs: Sequence[TensorInfo] | None = None, keep_images: bool = False):
        missing = [m for m in settings.models() if m not in children]
        if missing:
            raise ValueError(f"no ChildModel for {missing}")
        self.name, self.flow, self.settings, self.runtime = name, flow, settings, runtime
        self.children = children
        self._is_ready = is_ready
        # versions_of(model): its version folders, newest first. Given, each call names the
        # newest READY version (is_ready(model, version)), so a ROUTE can say which answered;
        # None: is_ready(model) and the version Triton picks.
        self._versions_of = versions_of
        # Shadow and canary (trials.py). A version on trial is called as the stable one only
        # when no other version is READY.
        trials = [t for t in (runtime.shadow, runtime.canary) if t is not None]
        self._on_trial = {(t.model, t.version) for t in trials if t.version}
        self.shadow = Shadow(runtime.shadow, runtime.shadow_max_in_flight) if runtime.shadow else None
        self.canary = runtime.canary if runtime.canary and runtime.canary.share > 0 else None
        self.rng = random.Random()
        # Where mirrored calls go: None sends them through the run's own transport, when the
        # stable answer is back (LocalFlow); the adapter gives them one of their own, used
        # on the shadow's thread while the real call is in flight.
        self.mirror_send: Send | None = None
        self._serving: dict[str, str] = {}  # model -> the version its last READY check found
        self._lost: dict[str, float] = {}  # model -> when a call found it unable to take it
        self.clock, self.sleep = clock, sleep
        self._choosers: dict[tuple[str, ...], CandidateChooser] = {}
        classes = [len(c.labels) for c in children.values() if c.is_classifier]
        self.max_topk = min(classes) if classes else 1
        if runtime.default_topk > self.max_topk:
            raise ConfigError(f"model {name}: default_topk={runtime.default_topk} but its classifiers have {self.max_topk} classes")
        pixel_specs = [c.preprocess for c in children.values() if c.preprocess is not None]
        # Decoded once per run, preprocessed for the first pixel model declared; another
        # model with the same pixels is re-normalised, one with other pixels (size, colour)
        # is preprocessed from the decoded images, which are kept for that.
        self.primary_spec: PreprocessSpec | None = pixel_specs[0] if pixel_specs else None
        # keep_images: the flow cuts regions (the load check saw it call regions()).
        self.keep_images = keep_images or any(renormalize_impossible(self.primary_spec, s) for s in pixel_specs[1:])
        self.uses_regions = keep_images  # set by a run that calls regions()
        # The flow model's outputs (its config.pbtxt), by name: what its answers must fill.
        self.declared: dict[str, TensorInfo] = {o.name: o for o in (outputs or ())}
        # Where a failed request's reader finds what its message leaves out (LocalFlow says its own).
        self.details = "details in the server log"
        threads = runtime.decode_threads or max(1, (os.cpu_count() or 1) // max(1, instances))
        # One thread: decode in execute()'s own thread; a one-worker pool only adds handoffs.
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="decode") if threads > 1 else None
        # None: numpy on the CPU; a torch device ("cuda:0"): decoded, preprocessed and scored there.
        self.device: Device = device_for(device, self.pool)

    @classmethod
    def load(cls, model_dir: Path, params: dict[str, str], is_ready: Callable[..., bool], *, version: str = "1",
             instances: int = 1, name: str | None = None, check: bool = True, device: str | None = None,
             pin_versions: bool = False, outputs: Sequence[TensorInfo] | None = None) -> "FlowRuntime":
        """The flow in model_dir/<version>/flow.py with its settings from `params` and its
        child models' configs from the sibling folders (or their copies beside the flow:
        children.load_child); checked on a probe image. `device`: None to decode and score
        with numpy on the CPU, or the torch device to do it on. pin_versions: call each
        child's newest READY version by number (is_ready(model, version)), from the version
        folders beside it; a child whose folder is not there (a repository on S3, where
        Triton copies each model's folder alone) is called unpinned. outputs: the flow
        model's outputs as served (default: its config.pbtxt's)."""
        name = name or Path(model_dir).name
        flow = load_flow(Path(model_dir) / version / "flow.py")
        runtime, settings = parse_settings(params, flow.settings, name)
        children = {m: load_child(Path(model_dir).parent, m, Path(model_dir)) for m in settings.models()}
        children.update(_trial_children(runtime, children, Path(model_dir), name))
        if outputs is None:
            outputs = [TensorInfo(t.name, data_type(t), tuple(t.dims)) for t in parse_config(Path(model_dir)).output]
        uses_regions = False
        if check:
            probe = cls(name, flow, settings, runtime, children, lambda _: True, instances=1, device=device, outputs=outputs)
            check_flow(probe)
            uses_regions = probe.uses_regions
        repo = Path(model_dir).parent
        versions_of = (lambda model: version_folders(repo / model)) if pin_versions else None
        return cls(name, flow, settings, runtime, children, is_ready, instances, device, versions_of, outputs=outputs,
                   keep_images=uses_regions)

    def close(self) -> None:
        if self.shadow is not None:
            self.shadow.close()
        self.device.close()
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    # ---- one execute() ------------------------------------------------------------------
    def run(self, requests: Sequence[ImageRequest], send: Send, *, probe: bool = False
            ) -> tuple[list[Prediction | RequestError], Timings]:
        """One execute(). probe: health probes (the watchdog's), answered on the stable
        models alone: no shadow mirrors them, no canary answers them."""
        timings = Timings()
        results: list[Prediction | RequestError | None] = [self._check_request(r, timings) for r in requests]
        run = _Run(self, requests, results, send, timings)
        run.trials = not probe
        if run.rows:
            self._answer(run, requests, results, timings)
        if self.shadow is not None:
            timings.trials = self.shadow.drain()
        return results, timings  # type: ignore[return-value]

    def _answer(self, run: "_Run", requests, results, timings: Timings) -> None:
        t0 = time.perf_counter()
        try:
            with hooks.stage("flow"):
                answer = self.flow.fn(Batch(run), self.settings)
            if not isinstance(answer, Answer) or answer.regions_of is not None:
                raise FlowError(f"flow {self.name} returned {type(answer).__name__}; it must return the batch's Answer "
                                "(answer = batch.answer(); ...; return answer)")
            self._check_filled(answer)
        except NoModelReady:
            return self._fail_pending(requests, results, RequestError(run.no_model_message(), run.unready_role(), UNAVAILABLE),
                                      timings)
        except ChildCallError as exc:
            # Temporary (no candidate took the call in time, or one refused it for overload):
            # UNAVAILABLE, try again. Anything else is a broken child: INTERNAL, logged.
            if not exc.temporary:
                log.error("flow %s: %s", self.name, exc)
            error = RequestError(str(exc), exc.role or exc.model or "child", UNAVAILABLE if exc.temporary else BROKEN)
            return self._fail_pending(requests, results, error, timings)
        except FlowError as exc:
            log.error("flow %s: %s", self.name, exc)
            return self._fail_pending(requests, results, RequestError(f"flow {self.name}: {exc}", "flow", BROKEN), timings)
        except Exception as exc:  # noqa: BLE001 - a bug in the flow fails these requests, not the model
            log.exception("flow %s raised %s", self.name, type(exc).__name__)
            # Its text may hold paths or data: the client reads the type, the log the rest.
            message = f"flow {self.name} raised {type(exc).__name__} ({self.details})"
            return self._fail_pending(requests, results, RequestError(message, "flow", BROKEN, cause=exc), timings)
        finally:
            timings.classify = time.perf_counter() - t0 - run.preprocess_in_flow
        with hooks.stage("top_k"):
            self._split(run, requests, results, answer, timings)

    def _check_filled(self, answer: Answer) -> None:
        """Every output the flow model declares is filled; none is silently absent."""
        if not self.declared:
            return
        regions = [n for n in self.declared if n in REGION_OUTPUTS]
        if regions and not answer.attached:
            raise FlowError(f"its config.pbtxt declares {', '.join(regions)}, and the answer attached no regions "
                            "(answer.attach(regions_answer)), on every path, even when there are none")
        filled = set(answer.outputs).union(*(a.outputs for a in answer.attached)) if answer.attached else set(answer.outputs)
        own = [n for n in self.declared if n not in STANDARD_OUTPUTS and n not in REGION_OUTPUTS and n not in filled]
        if own:
            raise FlowError(f"its config.pbtxt declares output(s) {', '.join(own)}, which the answer did not fill "
                            f"(answer.output({own[0]!r}, values)) on this path; fill them on every path")

    def _split(self, run: "_Run", requests, results, answer: Answer, timings: Timings) -> None:
        routes = answer.routes()
        pending, asks, fills = [], [], []  # the device computes every top-k of this run together
        attached = answer.attached
        for r, req in enumerate(requests):
            if results[r] is not None:
                continue
            rows = np.flatnonzero(run.owners == r)
            k = req.k or self.runtime.default_topk
            table = _LabelTable(len(rows), k)
            _ask(answer, rows, table, k, asks, fills)
            # Each attached regions answer: the rows of this request's images, in image order.
            regions = []
            for part in attached:
                of = part.regions_of
                mine = np.flatnonzero(np.isin(of.image, rows))
                mine = mine[np.argsort(np.searchsorted(rows, of.image[mine]), kind="stable")]
                region_table = _LabelTable(len(mine), k)
                _ask(part, mine, region_table, k, asks, fills)
                regions.append((part, mine, region_table))
            pending.append((r, rows, table, regions))
        for top, (table, positions) in zip(self.device.top_k(asks), fills):
            table.labels[positions], table.scores[positions], table.class_ids[positions] = top.labels, top.scores, top.class_ids
        for r, rows, table, regions in pending:
            unanswered = table.unanswered()
            if unanswered is None:
                unanswered = next((f"{_where(part, mine[i], rows)}" for part, mine, rt in regions
                                   if (i := rt.unanswered()) is not None), None)
            else:
                unanswered = f"IMAGE[{unanswered}]"
            if unanswered is not None:
                results[r] = RequestError(f"flow {self.name} left {unanswered} unanswered", "flow", BROKEN)
                timings.reject(results[r], len(rows))
                continue
            route = routes[rows].reshape(-1, 1)
            for value in route[:, 0]:
                timings.count(timings.routes, value.decode())
            outputs = {name: values[rows] for name, values in answer.outputs.items()}
            if regions:
                outputs.update(self._region_outputs(rows, regions, table.k))
            results[r] = Prediction(table.labels, table.scores, table.class_ids, route,
                                    {n: v for n, v in outputs.items() if n in self.declared})
        if JSON.name in self.declared:  # each image's answer as one JSON document, from these outputs
            add_documents(results, self.declared, {name for part in attached for name in part.outputs})

    def _region_outputs(self, rows: np.ndarray, regions: list, k: int) -> dict[str, np.ndarray]:
        """One request's REGION_* outputs and the regions answers' own outputs: per image, its
        regions (the attached answers' in attach order), padded to the most of any image."""
        per_image: list[list[tuple]] = [[] for _ in rows]  # (answer, region row, position in its table)
        for part, mine, region_table in regions:
            images = np.searchsorted(rows, part.regions_of.image[mine])
            for position, (row, image) in enumerate(zip(mine, images)):
                per_image[image].append((part, row, region_table, position))
        most = max((len(items) for items in per_image), default=0)
        n = len(rows)
        out = {
            "REGION_COUNT": np.array([[len(items)] for items in per_image], dtype=np.int32).reshape(n, 1),
            "REGION_BOXES": np.zeros((n, most, 4), np.float32),
            "REGION_LABELS": np.full((n, most, k), b"", dtype=object),
            "REGION_SCORES": np.zeros((n, most, k), np.float32),
            "REGION_CLASS_IDS": np.full((n, most, k), -1, np.int32),
            "REGION_ROUTE": np.full((n, most), b"", dtype=object),
        }
        own = {name for part, _, _ in regions for name in part.outputs}
        for name in own:
            sample = next(part.outputs[name] for part, _, _ in regions if name in part.outputs)
            fill = b"" if sample.dtype == object else (-1 if sample.dtype.kind in "iu" else 0)
            out[name] = np.full((n, most, *sample.shape[1:]) if sample.ndim > 1 else (n, most), fill, dtype=sample.dtype)
        part_outputs = {id(part): part.outputs for part, _, _ in regions}  # a copy per property read: once each
        for i, items in enumerate(per_image):
            for j, (part, row, region_table, position) in enumerate(items):
                out["REGION_BOXES"][i, j] = part.regions_of.box[row]
                out["REGION_LABELS"][i, j] = region_table.labels[position]
                out["REGION_SCORES"][i, j] = region_table.scores[position]
                out["REGION_CLASS_IDS"][i, j] = region_table.class_ids[position]
                out["REGION_ROUTE"][i, j] = part.routes()[row]
                for name, values in part_outputs[id(part)].items():
                    out[name][i, j] = values[row]
        return out

    def _check_request(self, req: ImageRequest, timings: Timings) -> RequestError | None:
        error = None
        total = sum(len(b) for b in req.images)
        if len(req.images) == 0:
            error = RequestError("IMAGE is empty: send at least one encoded image", "bad_request")
        elif total > self.runtime.max_request_bytes:
            error = RequestError(f"IMAGE: the request carries {total} bytes of images, over the {self.runtime.max_request_bytes}-byte limit", "too_large")
        elif isinstance(req.topk, tuple) and len(set(req.topk)) > 1:
            error = RequestError(f"TOPK differs between the images of one request ({sorted(set(req.topk))}): send one value", "bad_request")
        elif req.k is not None and not 1 <= req.k <= self.max_topk:
            error = RequestError(f"TOPK={req.k} is out of range: use 1..{self.max_topk}", "bad_request")
        if error is not None:
            timings.reject(error, max(len(req.images), 1))
        return error

    @staticmethod
    def _fail_pending(requests, results, error: RequestError, timings: Timings) -> None:
        for r, res in enumerate(results):
            if res is None:
                results[r] = error
                timings.reject(error, len(requests[r].images))

    # ---- choosing a model -----------------------------------------------------------------
    def _ready(self, model: str) -> bool:
        """is_ready, with a readiness check that fails (the server shutting down) read as not
        READY. With pinned versions: whether any version is, the newest one noted."""
        try:
            versions = self._versions_of(model) if self._versions_of is not None else ()
            if not versions:  # not pinned, or its folder is not beside this one (S3)
                return bool(self._is_ready(model))
            # A version on trial answers only when no other is READY (its promotion under way).
            ordered = [v for v in versions if (model, v) not in self._on_trial] + [v for v in versions if (model, v) in self._on_trial]
            version = next((v for v in ordered if self._is_ready(model, v)), None)
            if version is not None:
                self._serving[model] = version
            return version is not None
        except Exception as exc:  # noqa: BLE001 - e.g. pb_utils.TritonModelException while the server stops
            log.warning("could not ask whether %s is READY (%s): taking it as not", model, exc)
            return False

    def trial_ready(self, trial: Trial) -> bool:
        try:
            return bool(self._is_ready(trial.model, trial.version) if trial.version else self._is_ready(trial.model))
        except Exception:  # noqa: BLE001 - as _ready: a failed readiness check is "not READY"
            return False

    def serving_version(self, model: str) -> str:
        """The version of `model` its last READY check found ("" without pinned versions)."""
        return self._serving.get(model, "") if self._versions_of is not None else ""

    def lost(self, model: str) -> None:
        self._lost[model] = self.clock()

    def answered(self, model: str) -> None:
        self._lost.pop(model, None)

    def retry_until(self, candidates: tuple[str, ...], failed: bool) -> float | None:
        """Until when a call on `candidates` waits for one to answer: child_retry_s after its own
        failure, or after the latest loss of one of them (a call that finds none READY while the
        watchdog reloads a model that just lost its stub); None: it does not wait."""
        bound = self.runtime.child_retry_s
        if bound <= 0:
            return None
        if failed:
            return self.clock() + bound
        losses = [self._lost[m] for m in candidates if m in self._lost]
        until = max(losses) + bound if losses else None
        return until if until is not None and until > self.clock() else None

    def chooser(self, candidates: tuple[str, ...]) -> CandidateChooser:
        chooser = self._choosers.get(candidates)
        if chooser is None:
            chooser = self._choosers[candidates] = CandidateChooser(candidates, self._ready, self.runtime.route_recheck_s)
        return chooser


class _LabelTable:
    """One answer's top-k labels, scores and class ids for some rows, being filled."""

    def __init__(self, n: int, k: int):
        self.k = k
        self.labels = np.full((n, k), b"", dtype=object)
        self.scores = np.zeros((n, k), dtype=np.float32)
        self.class_ids = np.full((n, k), -1, dtype=np.int32)
        self.answered = np.zeros(n, dtype=bool)

    def unanswered(self) -> int | None:
        return None if self.answered.all() else int(np.flatnonzero(~self.answered)[0])


def _ask(answer: Answer, rows: np.ndarray, table: _LabelTable, k: int, asks: list, fills: list) -> None:
    """Queue the top-k of `answer` on `rows` into `table` (skipped rows stay empty)."""
    for positions, source in answer.groups(rows):
        table.answered[positions] = True
        if source is not None:
            asks.append((source, rows[positions], k))
            fills.append((table, positions))


def _where(part: Answer, row: int, image_rows: np.ndarray) -> str:
    image = int(np.searchsorted(image_rows, part.regions_of.image[row]))
    return f"a region of IMAGE[{image}] (region row {row} of {part.regions_of.detector})"


def renormalize_impossible(have: PreprocessSpec | None, want: PreprocessSpec) -> bool:
    return have is not None and have != want and renormalize(np.zeros((0, *have.input_shape), have.numpy_dtype), have, want) is None


class _Run:
    """One execute(): its rows (the good requests' images), their pixels, what was tried."""

    def __init__(self, runtime: FlowRuntime, requests: Sequence[ImageRequest], results: list, send: Send, timings: Timings):
        self._runtime, self._send, self._timings = runtime, send, timings
        self.device = runtime.device
        self.retry_s = runtime.runtime.child_retry_s
        self.max_regions = runtime.runtime.max_regions_per_image
        self.declared = runtime.declared
        self._results = results
        self._tried: dict[str, str] = {}  # candidate -> kind ("classifier" or "model"), in order
        self.trials = True  # shadow and canary apply (not to probes)
        self._unready: str | None = None  # the role of the last call that found no candidate READY
        self.preprocess_in_flow = 0.0
        images = [req.images if results[r] is None else None for r, req in enumerate(requests)]
        self._encoded = [data for imgs in images if imgs is not None for data in imgs]
        self.owners = np.array([r for r, imgs in enumerate(images) if imgs is not None for _ in imgs], dtype=np.int64)
        self._pixels: dict[PreprocessSpec, object] = {}  # the device's arrays
        self._decoded = None
        self._scales = None
        spec = runtime.primary_spec
        if spec is not None:  # else every model takes the encoded bytes: nothing to decode
            t0 = time.perf_counter()
            with hooks.stage("decode_preprocess"):
                decoded = self.device.decode(images, runtime.runtime.decode, spec, keep_images=runtime.keep_images)
            for r, err in decoded.errors.items():  # a bad image fails its request, naming the image
                results[r] = RequestError(f"IMAGE[{decoded.bad_index[r]}]: {err}", err.reason)
                timings.reject(results[r], 1)
            if decoded.errors:  # the failed requests' images leave the batch
                self._encoded = [data for data, k in zip(self._encoded, np.isin(self.owners, decoded.owners)) if k]
            self.owners = decoded.owners
            self._pixels[spec] = decoded.batch
            self._decoded = decoded.images
            self._scales = decoded.scales
            timings.decode_preprocess += time.perf_counter() - t0
        self.rows = len(self.owners)

    def candidates(self, models) -> tuple[str, ...]:
        if models is None:
            return ()
        names = (models,) if isinstance(models, str) else tuple(models)
        for m in names:
            if m not in self._runtime.children:
                declared = ", ".join(self._runtime.children) or "none"
                raise FlowError(f"the flow calls model {m!r}, which it did not declare; declare it in a Candidates "
                                f"setting of its Settings (declared: {declared})")
        return names

    def choose(self, candidates: tuple[str, ...], tried: tuple[str, ...], kind: str) -> str | None:
        for m in candidates:
            self._tried.setdefault(m, kind)
        return self._runtime.chooser(candidates).choose(exclude=tried)

    def version(self, model: str) -> str:
        return self._runtime.serving_version(model)

    def canary_for(self, model: str) -> Trial | None:
        """The canary to send this call to instead of `model`: drawn at canary_share, READY."""
        canary = self._runtime.canary
        if canary is None or not self.trials or canary.stable != model or self._runtime.rng.random() >= canary.share:
            return None
        return canary if self._runtime.trial_ready(canary) else None

    def shadow_for(self, model: str) -> Shadow | None:
        """The shadow to mirror this call of `model` to, or None (not drawn, not READY, or no slot free)."""
        shadow = self._runtime.shadow
        if shadow is None or not self.trials or shadow.trial.stable != model:
            return None
        return shadow if shadow.wanted(lambda: self._runtime.trial_ready(shadow.trial)) else None

    def mirror(self, shadow: Shadow, chunks: list[ChildRequest], to_probs):
        """Send `chunks` as a mirrored call: on the shadow's thread now, or, with no transport
        of its own (LocalFlow), through this run's once the stable answer is handed over."""
        send = self._runtime.mirror_send

        def run_call():
            try:
                parts = list((send or self._send)(chunks))
            except Exception as exc:  # noqa: BLE001 - the shadow's failure is only counted
                return exc
            return next((p for p in parts if isinstance(p, Exception)), parts)

        return shadow.mirror(run_call, to_probs, background=send is not None)

    def lost(self, model: str) -> None:
        self._runtime.lost(model)

    def answered(self, model: str) -> None:
        self._runtime.answered(model)

    def retry_until(self, candidates: tuple[str, ...], failed: bool) -> float | None:
        return self._runtime.retry_until(candidates, failed)

    def now(self) -> float:
        return self._runtime.clock()

    def pause(self) -> None:
        self._runtime.sleep(_RETRY_PAUSE_S)

    def still_ready(self, candidates: tuple[str, ...], tried: tuple[str, ...], model: str) -> bool:
        """After `model` failed: is it still the first READY one (a real failure), or did it go away?"""
        chooser = self._runtime.chooser(candidates)
        chooser.invalidate()
        return chooser.choose(exclude=tried) == model

    def role(self, candidates: tuple[str, ...]) -> str:
        """What the flow calls these candidates for: the setting that names them, else their names."""
        return self._runtime.settings.role_of(candidates) or ",".join(candidates)

    def unready(self, candidates: tuple[str, ...]) -> None:
        """A call found none of these READY (and waits no longer): the role NoModelReady names."""
        self._unready = self.role(candidates)

    def unready_role(self) -> str:
        return self._unready or "no_model_ready"

    def no_model_message(self) -> str:
        kind = "classifier" if set(self._tried.values()) <= {"classifier"} else "model"
        return f"no {kind} is ready (tried, in order: {', '.join(self._tried) or 'none'})"

    def child(self, name: str, classifier: bool = False) -> ChildModel:
        child = self._runtime.children[name]
        if classifier and not child.is_classifier:
            raise FlowError(f"classify() needs a classifier, and {name}'s output has no label_filename in its "
                            "config.pbtxt; use infer() for its raw outputs")
        return child

    def inputs(self, child: ChildModel, rows: np.ndarray):
        """`child`'s input for these rows: the encoded bytes, or pixels preprocessed its way
        (a numpy array, or a tensor on the device)."""
        if child.preprocess is None:
            return np.array([self._encoded[i] for i in rows], dtype=object).reshape(-1, 1)
        pixels = self._pixels_for(child.preprocess)
        return pixels if len(rows) == self.rows else self.device.take(pixels, rows)

    def _pixels_for(self, spec: PreprocessSpec):
        if spec in self._pixels:
            return self._pixels[spec]
        t0 = time.perf_counter()
        with hooks.stage("decode_preprocess"):
            renormalized = (self.device.renormalize(have, s, spec) for s, have in self._pixels.items())
            batch = next((b for b in renormalized if b is not None), None)
            if batch is None:
                if self._decoded is None:
                    raise FlowError(f"internal: no decoded images kept for {spec}")
                batch = self.device.preprocess(self._decoded, spec)
        self._pixels[spec] = batch
        elapsed = time.perf_counter() - t0
        self._timings.decode_preprocess += elapsed
        self.preprocess_in_flow += elapsed
        return batch

    def images(self):
        """The decoded images, one per row, and each one's pixels as sent per decoded pixel.
        Kept from the decode when the flow cuts regions (seen at load); else decoded again
        here, once (a flow that reaches regions() only past the load check's path)."""
        self._runtime.uses_regions = self._runtime.keep_images = True  # from the next execute() on: kept
        if self._decoded is None:
            spec = self._runtime.primary_spec
            if spec is None:
                raise FlowError("regions need pixels: declare at least one model with a pixel input")
            log.warning("flow %s: the load check did not see it cut regions, so the images are decoded again for them; "
                        "call regions() on the probe image's path to keep them from the first decode", self._runtime.name)
            t0 = time.perf_counter()
            again = self.device.decode([[data] for data in self._encoded], self._runtime.runtime.decode, spec, keep_images=True)
            self._decoded, self._scales = again.images, again.scales
            self._timings.decode_preprocess += time.perf_counter() - t0
        return self._decoded, self._scales

    def crops(self, spec, image_rows: np.ndarray, boxes: np.ndarray):
        t0 = time.perf_counter()
        with hooks.stage("regions"):
            images, _ = self.images()
            batch = self.device.crop(images, image_rows, boxes, spec)
        elapsed = time.perf_counter() - t0
        self._timings.decode_preprocess += elapsed
        self.preprocess_in_flow += elapsed
        return batch

    def fail_images(self, rows: np.ndarray, message: str, reason: str) -> None:
        """Fail the requests these image rows belong to (their other rows are answered, unread)."""
        for row in rows:
            r = int(self.owners[row])
            if self._results[r] is None:
                index = int(row - np.flatnonzero(self.owners == r)[0])
                self._results[r] = RequestError(f"IMAGE[{index}]: {message}", reason)
                self._timings.reject(self._results[r], int((self.owners == r).sum()))

    def send(self, requests: list[ChildRequest]):
        if not requests:
            return []
        t0 = time.perf_counter()
        with hooks.stage("child_calls"):
            replies = list(self._send(requests))
        elapsed = time.perf_counter() - t0
        if len(replies) != len(requests):
            raise ChildCallError(f"the transport answered {len(replies)} of {len(requests)} child requests")
        for req in requests:
            stats = self._timings.children.setdefault(req.model, ChildStats())
            stats.calls += 1
            stats.images += len(next(iter(req.inputs.values()))) if req.inputs else 0
            stats.seconds += elapsed
        return replies


def _trial_children(runtime: RuntimeSettings, children: dict[str, ChildModel], model_dir: Path,
                    name: str) -> dict[str, ChildModel]:
    """The shadow's and canary's candidate models, checked: the stable one is a model the
    flow calls, the candidate is in the repository and answers like it (same labels)."""
    found = {}
    for key, trial in (("shadow", runtime.shadow), ("canary", runtime.canary)):
        if trial is None:
            continue
        stable = children.get(trial.stable)
        if stable is None:
            raise ConfigError(f"model {name}: parameter {key}: the flow calls no model {trial.stable!r} (it calls "
                              f"{', '.join(children) or 'none'})")
        if trial.model in children or trial.model in found:
            candidate = children.get(trial.model) or found[trial.model]
        else:
            try:
                candidate = load_child(model_dir.parent, trial.model, model_dir)
            except (ConfigError, FileNotFoundError, OSError) as exc:
                raise ConfigError(f"model {name}: parameter {key}: candidate {trial.model!r} cannot be used: {exc}") from None
            found[trial.model] = candidate
        if key == "shadow" and not stable.is_classifier:
            raise ConfigError(f"model {name}: parameter shadow: {trial.stable} is not a classifier; the shadow compares "
                              "classifiers' answers")
        if stable.labels != candidate.labels:
            raise ConfigError(f"model {name}: parameter {key}: {trial.candidate} does not answer with "
                              f"{trial.stable}'s labels ({len(candidate.labels or ())} against {len(stable.labels or ())})")
    return found
