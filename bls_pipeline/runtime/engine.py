"""The flow runtime: requests in, one flow call per execute(), per-request answers out.

    check each request (empty, too large, TOPK) ─> decode + preprocess every image once
    (execution.py; a bad image fails its own request) ─> flow(batch, settings), its calls
    sent by calls.py to the candidates routing.py picks ─> top-k per request, ROUTE per image
    (predictions.py); what went wrong fails only the requests it touched, with the status
    code that says whether to try again

Pure Python over an injected `send`: the Triton adapter makes it pb_utils.InferenceRequest
calls, LocalFlow (local.py) runs models in process. Pixels and scores live on a Device
(device.py): numpy on the CPU, or torch on the flow model's GPU when its instance is KIND_GPU.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from ..stages.preprocess import PreprocessSpec, renormalize
from . import hooks
from .admit.admission import GONE_CHECK_S, Admission, QueueReading, RequestClock
from .answer.answer import Answer
from .call.batch import Batch
from .call.calls import Send
from .load.children import ChildModel, child_folder, child_model, load_child, version_folders
from ..base.tensors import TensorInfo
from .decode.device import Device, device_for
from .errors import ChildCallError, FlowError, NoModelReady
from .decode.execution import Execution
from .load.loadcheck import check_flow
from .load.loader import FlowDefinition, load_flow
from ..base.modelconfig import data_type, parse_config
from .load.fields import ParameterError
from .load.parameters import Parameters
from .answer.predictions import check_filled, predictions
from .results import BROKEN, UNAVAILABLE, ImageRequest, Prediction, RequestError, Timings
from .call.routing import Router
from ..base.errors import ConfigError
from ..base.messages import first_line
from .load.settings import RuntimeSettings, Settings, parse_settings

__all__ = ["FlowRuntime"]

log = logging.getLogger(__name__)


class FlowRuntime:
    """One flow model's runtime: its flow, settings and child models, loaded once."""

    def __init__(self, name: str, flow: FlowDefinition, settings: Settings, options: RuntimeSettings,
                 children: dict[str, ChildModel], is_ready: Callable[..., bool], instances: int = 1,
                 device: str | None = None, versions_of: Callable[[str], tuple[str, ...]] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 outputs: Sequence[TensorInfo] | None = None, keep_images: bool = False,
                 queued: bool = False, queue_readings: Callable[[str], QueueReading | None] | None = None):
        missing = [m for m in settings.models() if m not in children]
        if missing:
            raise ValueError(f"no ChildModel for {missing}")
        # options: the runtime's own settings (RuntimeSettings), the same keys for every flow model.
        self.name, self.flow, self.settings, self.options = name, flow, settings, options
        self.children = children
        # Which candidate answers, which version, the trials, the waits for a lost model: kept
        # across execute()s (routing.py). versions_of(model): its version folders, newest first
        # (each call then names the newest READY one); None: the version Triton picks.
        self.router = Router(settings, options, is_ready, versions_of, clock, sleep)
        self.uses_regions = keep_images  # set by a run that calls regions()
        self._take_children(children)
        # Where each child's label file is (FlowRuntime.load sets it), and the configs as served
        # that follow_children() took: a child loaded again with another config is called as
        # served now, with no load of the flow.
        self.child_dirs: dict[str, Path] = {}
        self._served: dict[str, object] = {}
        # The flow model's outputs (its config.pbtxt), by name: what its answers must fill.
        self.declared: dict[str, TensorInfo] = {o.name: o for o in (outputs or ())}
        # Where a failed request's reader finds what its message leaves out (LocalFlow says its own).
        self.details = "details in the server log"
        # {model: why its load failed}, asked when a role has no READY candidate (the adapter
        # reads bls-serve's model states: states_file.py); none known by default.
        self.failed_loads: Callable[[], Mapping[str, str]] = dict
        self._failure_logged: tuple[str, str] | None = None
        threads = options.decode_threads or max(1, (os.cpu_count() or 1) // max(1, instances))
        # One thread: decode in execute()'s own thread; a one-worker pool only adds handoffs.
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="decode") if threads > 1 else None
        # None: numpy on the CPU; a torch device ("cuda:0"): decoded, preprocessed and scored there.
        self.device: Device = device_for(device, self.pool)
        self.clock = clock
        # The door (admission.py): what Triton measured of the queues (queued False: no queue
        # in front, as in LocalFlow), what an image costs, the latency aim of requests that
        # send no deadline.
        self.admission = Admission(queued, options.latency_target_ms / 1e3, clock, queues=queue_readings, model=name)
        self.parameters: type[Parameters] = flow.parameters or Parameters

    def _take_children(self, children: dict[str, ChildModel]) -> None:
        """Call the children as these configs say; what the runtime derives from them with it."""
        classes = [len(c.labels) for c in children.values() if c.is_classifier]
        max_topk = min(classes) if classes else 1
        if self.options.default_topk > max_topk:
            raise ConfigError(f"model {self.name}: default_topk={self.options.default_topk} but its classifiers have "
                              f"{max_topk} classes")
        pixel_specs = [c.preprocess for c in children.values() if c.preprocess is not None]
        # Decoded once per run, preprocessed for the first pixel model declared; another
        # model with the same pixels is re-normalised, one with other pixels (size, colour)
        # is preprocessed from the decoded images, which are kept for that.
        self.primary_spec: PreprocessSpec | None = pixel_specs[0] if pixel_specs else None
        # keep_images: the flow cuts regions (the load check saw it call regions()).
        self.keep_images = (self.uses_regions
                            or any(renormalize_impossible(self.primary_spec, s) for s in pixel_specs[1:]))
        self.max_topk = max_topk
        if getattr(self, "children", None) is None:
            self.children = children
        else:  # the same dict: an execute() in progress sees the change at its next call
            self.children.update(children)
        # What an answer of a child says beside its labels (random weights); load() logs it.
        self.warnings = {m: c.warning for m, c in self.children.items() if c.warning}

    def follow_children(self, served: Mapping[str, object]) -> tuple[str, ...]:
        """Take the children's configs as served now ({model: ModelConfig}; bls-serve's model
        states, states_file.ServedConfigs): each child whose served config makes another
        ChildModel (dims, max_batch_size, labels, preprocessing ...) is called that way from
        now on. One that makes no ChildModel a flow can call keeps the old one, logged. The
        children that changed."""
        changed = {}
        for model, config in served.items():
            if model not in self.children or self._served.get(model) == config:
                continue
            self._served[model] = config
            try:
                child = child_model(model, config, self.child_dirs.get(model))
            except (ConfigError, OSError) as exc:
                log.error("flow %s: %s as served now cannot be called (%s); calling it as before", self.name, model,
                          exc)
                continue
            if child != self.children[model]:
                changed[model] = child
        if changed:
            try:
                self._take_children({**self.children, **changed})
            except ConfigError as exc:
                log.error("flow %s: %s; calling %s as before", self.name, exc, ", ".join(changed))
                return ()
            log.info("flow %s: %s changed as served; calling %s as served now", self.name, ", ".join(changed),
                     "it" if len(changed) == 1 else "them")
        return tuple(changed)

    def lower_batch(self, model: str, limit: int) -> None:
        """A call to `model` was refused for its batch size (it was loaded again with a smaller
        max_batch_size, which the server said): its calls are split at `limit` from now on."""
        self._take_children({model: replace(self.children[model], max_batch_size=limit)})

    @classmethod
    def load(cls, model_dir: Path, params: dict[str, str], is_ready: Callable[..., bool], *, version: str = "1",
             instances: int = 1, name: str | None = None, check: bool = True, device: str | None = None,
             pin_versions: bool = False, outputs: Sequence[TensorInfo] | None = None,
             queued: bool = False,
             queue_readings: Callable[[str], QueueReading | None] | None = None) -> "FlowRuntime":
        """The flow in model_dir/<version>/flow.py with its settings from `params` and its
        child models' configs from the sibling folders (or their copies beside the flow:
        children.load_child); checked on a probe image. `device`: None to decode and score
        with numpy on the CPU, or the torch device to do it on. pin_versions: call each
        child's newest READY version by number (is_ready(model, version)), from the version
        folders beside it; a child whose folder is not there (a repository on S3, where
        Triton copies each model's folder alone) is called unpinned. outputs: the flow
        model's outputs as served (default: its config.pbtxt's). queued: Triton keeps a queue
        in front of the flow (False: none, as in LocalFlow); queue_readings(model): Triton's
        latest measurement of that model's queue, the flow's own and its children's
        (admission.QueueReading; None: unmeasured)."""
        name = name or Path(model_dir).name
        flow = load_flow(Path(model_dir) / version / "flow.py")
        options, settings = parse_settings(params, flow.settings, name)
        children = {m: load_child(Path(model_dir).parent, m, Path(model_dir)) for m in settings.models()}
        children.update(_trial_children(options, children, Path(model_dir), name))
        if outputs is None:
            outputs = [TensorInfo(t.name, data_type(t), tuple(t.dims)) for t in parse_config(Path(model_dir)).output]
        uses_regions = False
        if check:
            probe = cls(name, flow, settings, options, children, lambda _: True, instances=1, device=device,
                        outputs=outputs)
            check_flow(probe)
            uses_regions = probe.uses_regions
        repo = Path(model_dir).parent
        versions_of = (lambda model: version_folders(repo / model)) if pin_versions else None
        loaded = cls(name, flow, settings, options, children, is_ready, instances, device, versions_of, outputs=outputs,
                     keep_images=uses_regions, queued=queued, queue_readings=queue_readings)
        loaded.child_dirs = {m: child_folder(repo, m, Path(model_dir)) for m in children}
        for warning in loaded.warnings.values():
            log.warning("flow %s calls %s", name, warning)
        return loaded

    @property
    def shadow(self):
        """The shadow (trials.Shadow) this flow mirrors calls to, or None."""
        return self.router.shadow

    def close(self) -> None:
        self.router.close()
        self.device.close()
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    # ---- one execute() ------------------------------------------------------------------
    def run(self, requests: Sequence[ImageRequest], send: Send, *, probe: bool = False,
            at_door: Callable[[list], None] | None = None) -> tuple[list[Prediction | RequestError], Timings]:
        """One execute(). probe: health probes (the watchdog's), answered on the stable
        models alone: no shadow mirrors them, no canary answers them. at_door(results): told
        the requests failed before any work (bad parameters, gone, out of time: their
        RequestError, None for the rest), so their clients can be answered now, not after the
        others' run."""
        timings = Timings()
        if probe:  # the watchdog's: no deadline, no aim
            clock, reading = RequestClock.start(requests, self.clock(), 0.0, self.clock), None
        else:
            clock, reading = self.admission.open(requests)
            timings.queue_wait_s = reading.wait_s if reading is not None else None
        results: list[Prediction | RequestError | None] = [self._check_request(r, timings) for r in requests]
        values = [self._read_parameters(r, res, timings) for r, res in zip(requests, results)]
        results = [v if isinstance(v, RequestError) else res for v, res in zip(values, results)]
        if not probe:
            self.admission.admit(clock, results, timings)
        if at_door is not None and any(res is not None for res in results):
            at_door(list(results))
        run = Execution.start(self, requests, results, send, timings, probe=probe, clock=clock,
                              parameters=[None if isinstance(v, RequestError) else v for v in values])
        if run.rows:
            self._answer(run, requests, results, timings)
        now = self.clock()
        if not probe and now - clock.arrived >= GONE_CHECK_S:  # answers whose client has gone meanwhile: wasted work
            timings.answered_gone = sum(isinstance(res, Prediction) and clock.cancelled(r, now)
                                        for r, res in enumerate(results))
        if self.shadow is not None:
            timings.trials = self.shadow.drain()
        return results, timings  # type: ignore[return-value]

    def _read_parameters(self, req: ImageRequest, result, timings: Timings):
        """The request's values of the flow's declared parameters, or the RequestError (400)
        naming a bad or unknown one; None for a request that failed already."""
        if result is not None:
            return None
        try:
            return self.parameters.read(req.parameters, self.name)
        except ParameterError as exc:
            error = RequestError(str(exc), "bad_parameter")
            timings.reject(error, max(len(req.images), 1))
            return error

    def _answer(self, run: Execution, requests, results, timings: Timings) -> None:
        t0 = time.perf_counter()
        try:
            with hooks.stage("flow"):
                answer = self.flow.fn(Batch(run), self.settings)
            if not isinstance(answer, Answer) or answer.regions_of is not None:
                raise FlowError(f"flow {self.name} returned {type(answer).__name__}; it must return the batch's Answer "
                                "(answer = batch.answer(); ...; return answer)")
            check_filled(answer, self.declared)
        except NoModelReady:
            return self._fail_pending(requests, results, self._no_model_error(run), timings)
        except ChildCallError as exc:
            # A failure that no call could keep to its own rows (calls.py fails those itself).
            # Temporary (no candidate took the call in time, or one refused it for overload):
            # UNAVAILABLE, try again. Anything else is a broken child: INTERNAL, logged. A
            # request whose deadline passed meanwhile (a child's queue let its call time out)
            # fails as expired.
            run.drop_gone(exc.model or "child")
            if not exc.temporary:
                log.error("flow %s: %s", self.name, exc)
            error = RequestError(str(exc), exc.role or exc.model or "child", UNAVAILABLE if exc.temporary else BROKEN)
            return self._fail_pending(requests, results, error, timings)
        except FlowError as exc:
            log.error("flow %s: %s", self.name, exc)
            return self._fail_pending(requests, results, RequestError(f"flow {self.name}: {exc}", "flow", BROKEN),
                                      timings)
        except Exception as exc:  # noqa: BLE001 - a bug in the flow fails these requests, not the model
            log.exception("flow %s raised %s", self.name, type(exc).__name__)
            # Its text may hold paths or data: the client reads the type, the log the rest.
            message = f"flow {self.name} raised {type(exc).__name__} ({self.details})"
            return self._fail_pending(requests, results, RequestError(message, "flow", BROKEN, cause=exc), timings)
        finally:
            timings.classify = time.perf_counter() - t0 - run.preprocess_in_flow
        with hooks.stage("top_k"):
            predictions(answer, run.owners, requests, results, timings, flow=self.name, declared=self.declared,
                        default_topk=self.options.default_topk, device=self.device, warnings=self.warnings)

    def _no_model_error(self, run: Execution) -> RequestError:
        """No candidate READY for a role: UNAVAILABLE (try again later), unless one of its
        candidates failed its load; then nothing will answer until someone fixes it: INTERNAL,
        naming the load error. The message names that role's candidates alone."""
        candidates = run.unready_candidates()
        failed = {m: why for m, why in self.failed_loads().items() if m in candidates and why.strip()}
        message = run.no_model_message({m: first_line(why) for m, why in failed.items()})
        if not failed:
            return RequestError(message, run.unready_role(), UNAVAILABLE)
        model, why = next(iter(failed.items()))
        if (model, why) != self._failure_logged:  # once per failure, not once per request
            self._failure_logged = (model, why)
            log.error("flow %s: its candidate %s failed to load, so its requests fail as INTERNAL: %s", self.name,
                      model, why)
        return RequestError(message, run.unready_role(), BROKEN)

    def _check_request(self, req: ImageRequest, timings: Timings) -> RequestError | None:
        error = None
        total = sum(len(b) for b in req.images)
        if len(req.images) == 0:
            error = RequestError("IMAGE is empty: send at least one encoded image", "bad_request")
        elif total > self.options.max_request_bytes:
            error = RequestError(f"IMAGE: the request carries {total} bytes of images, over the "
                                 f"{self.options.max_request_bytes}-byte limit", "too_large")
        elif isinstance(req.topk, tuple) and len(set(req.topk)) > 1:
            error = RequestError(f"TOPK differs between the images of one request ({sorted(set(req.topk))}): send one "
                                 "value", "bad_request")
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


def renormalize_impossible(have: PreprocessSpec | None, want: PreprocessSpec) -> bool:
    return (have is not None and have != want
            and renormalize(np.zeros((0, *have.input_shape), have.numpy_dtype), have, want) is None)


def _trial_children(options: RuntimeSettings, children: dict[str, ChildModel], model_dir: Path,
                    name: str) -> dict[str, ChildModel]:
    """The shadow's and canary's candidate models, checked: the stable one is a model the
    flow calls, the candidate is in the repository and answers like it (same labels)."""
    found = {}
    for key, trial in (("shadow", options.shadow), ("canary", options.canary)):
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
                raise ConfigError(f"model {name}: parameter {key}: candidate {trial.model!r} cannot be used: "
                                  f"{exc}") from None
            found[trial.model] = candidate
        if key == "shadow" and not stable.is_classifier:
            raise ConfigError(f"model {name}: parameter shadow: {trial.stable} is not a classifier; the shadow "
                              "compares classifiers' answers")
        if stable.labels != candidate.labels:
            raise ConfigError(f"model {name}: parameter {key}: {trial.candidate} does not answer with "
                              f"{trial.stable}'s labels ({len(candidate.labels or ())} against "
                              f"{len(stable.labels or ())})")
    return found
