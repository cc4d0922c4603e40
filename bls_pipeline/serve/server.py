"""Start a real tritonserver on a model repository, locally, without Docker.

`TritonServer` is what `bls-serve` (cli.py) and the integration tests use. It starts the
`tritonserver` binary.py finds (one on PATH in NGC containers, else the nvidia-pytriton wheel's),
loads only the models whose backend and artifacts are present (explicit model control), binds to
127.0.0.1 by default with the admin APIs behind a key, waits for readiness, and on stop leaves
no tritonserver, python stub or /dev/shm region behind. A model that fails its load, or whose
config.pbtxt does not read, is named and left out, the others served (`fail_fast` off:
bls-serve's default); with a status port, bls-serve's own endpoint answers readiness, what
happened to tritonserver, and (with request tracing on) latency histograms and the recent
requests explained (status.py). A watchdog (watchdog.py) brings back a model whose stub died,
and a liveness check (liveness.py) marks a tritonserver that stopped answering as hung.
Its stop is bounded (stopping.py): the drain's limit and STOP_GRACE_S, whatever tritonserver does.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from ..adapter.queue_waits import WAIT_PREFIX
from ..base.messages import first_line
# passed to every tritonserver started
from ..contract import EXECUTIONS_ENV, MODEL_STATES_ENV, RESTARTS_ENV, STANDBY_ENV
from ..runtime.load.loader import is_flow_model
from ..base.modelconfig import RELOAD_KEY
from . import repository, s3
from .admin import ADMIN_HEADER, AdminError, RepositoryAdmin, model_ready
from .argv import GRPC_ADMIN_HEADER, endpoints, trace_args, tritonserver_argv
from .binary import Binary, available_backends, find_binary, has_gpu
from . import stopping
from .liveness import Liveness
from .options import ServerOptions, check_ports_free, listening
from .processes import (die_with_parent, end_orphans, shm_prefix)
from .flow_retries import FlowRetries
from .model_index import ModelStates
from .queue_monitor import QueueMonitor
from .status import RESTART_CAUSES, ServerState, StatusServer
from .tritonlog import LoadFailure, LogPump, LogWatch
from .watchdog import Watchdog

__all__ = ["TritonServer"]

log = logging.getLogger(__name__)

# A stop takes at most the drain's limit (exit_timeout_s) and this: tritonserver's exit after
# its SIGTERM, the kill, the reaping and the cleanup.
STOP_GRACE_S = 5.0
# How long a drain keeps asking a tritonserver that does not answer before it kills it.
UNANSWERED_S = 5.0


class TritonServer:
    """A tritonserver process; use as a context manager or call start()/stop()."""

    def __init__(self, options: ServerOptions):
        self.options = options
        self._proc: subprocess.Popen | None = None
        self._workdir: Path | None = None
        self._log_handle = None
        self._pump: LogPump | None = None
        repo = options.model_repository
        self.shm_prefix = shm_prefix(secrets.token_hex(3), repo if s3.is_s3(repo) else str(Path(repo).resolve()))
        self.loaded: tuple[str, ...] = ()
        self.skipped: dict[str, str] = {}
        self.failed: dict[str, str] = {}  # planned models whose load failed (fail_fast off): why
        self.ready_for: tuple[str, ...] = ()
        self.states: ModelStates | None = None
        self.status: StatusServer | None = None
        self.repository: repository.Repository | None = None
        self._plan: repository.LoadPlan | None = None
        self._binary: Binary | None = None
        self.watchdog: Watchdog | None = None
        self.queue_monitor: QueueMonitor | None = None  # Triton's measure of the queues, for the flows' admission
        self.last_stop: stopping.StopReport | None = None
        self.restarts = 0  # starts after the first (restart()): RESTARTS_ENV of the running tritonserver
        self._started_at: float | None = None  # time.monotonic() when the running one was serving
        self._cancel: threading.Event | None = None
        self.liveness: Liveness | None = None
        self.hung: str | None = None  # why the running tritonserver counts as hung (liveness), once it does
        self.woken = threading.Event()  # set with `hung`: bls-serve's loop acts at once
        self.log_watch = LogWatch(on_failure=self._load_failed)  # tritonserver's log, read as it is passed on
        self.restart_causes = dict.fromkeys(RESTART_CAUSES, 0)  # restarts by the cause of the end before each
        self._past_reloads: dict[str, int] = {}  # the watchdog's reloads under the tritonservers before this one
        self.condition: str | None = None  # what bls-serve does about tritonserver now (the status port says it)
        self._orphans_ended = False
        self._failures_at_start: dict[str, int] = {}

    # ---- endpoints -------------------------------------------------------------
    @property
    def http_url(self) -> str:
        return f"{_url_host(self.options.host)}:{self.options.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{_url_host(self.options.host)}:{self.options.grpc_port}"

    def url(self, protocol: str) -> str:
        """The inference endpoint for a tritonclient of `protocol` ("http" or "grpc")."""
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be 'http' or 'grpc', got {protocol!r}")
        return self.http_url if protocol == "http" else self.grpc_url

    @property
    def metrics_url(self) -> str:
        return f"http://{_url_host(self.options.host)}:{self.options.metrics_port}/metrics"

    @property
    def status_url(self) -> str | None:
        """bls-serve's own endpoint (/ready, /metrics, /requests), or None without a status port."""
        port = self.options.status_port
        return f"http://{_url_host(self.options.host)}:{port}" if port else None

    @property
    def admin_headers(self) -> dict[str, str]:
        """The HTTP header that opens the restricted APIs (admin_headers_for("grpc") for gRPC)."""
        return self.admin_headers_for("http")

    def admin_headers_for(self, protocol: str) -> dict[str, str]:
        """The header (HTTP) or metadata (gRPC) that opens the restricted APIs."""
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be 'http' or 'grpc', got {protocol!r}")
        return {ADMIN_HEADER if protocol == "http" else GRPC_ADMIN_HEADER: self.options.admin_key}

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        """tritonserver's exit status once it exited (negative: the signal), else None."""
        return self._proc.poll() if self._proc else None

    @property
    def uptime_s(self) -> float:
        """Seconds since the last start() had it serving (0 before)."""
        return time.monotonic() - self._started_at if self._started_at is not None else 0.0

    # ---- lifecycle ---------------------------------------------------------------
    def __enter__(self) -> "TritonServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def plan(self) -> repository.LoadPlan:
        """What start() will load and what it will skip (with why), without starting anything:
        a tool checks it has the models it needs before it waits for a server."""
        if self._plan is None:
            self._workdir = self._workdir or Path(tempfile.mkdtemp(prefix="bls-triton-"))
            try:
                self._plan = self._make_plan()
            except BaseException:
                if not self.running() and self.status is None:  # nothing uses the folder yet: it goes with the error
                    shutil.rmtree(self._workdir, ignore_errors=True)
                    self._workdir = None
                raise
            self.loaded, self.skipped = self._plan.load, self._plan.skipped
        return self._plan

    def _make_plan(self) -> repository.LoadPlan:
        """The plan, from the repository as it reads now (an S3 one through a local view)."""
        if s3.is_s3(self.options.model_repository):
            # Tritonserver reads the bucket itself; the plan reads a local view of it, and
            # a wrong region, credentials or bucket fail here with the cause, not in Triton's log.
            repo = s3.download_for_planning(str(self.options.model_repository), self._workdir / "s3-view")
        else:
            repo = Path(self.options.model_repository).resolve()
        if not (repo.is_dir() and any(repo.glob("*/config.pbtxt"))):
            raise FileNotFoundError(f"no model repository at {repo}: pass --model-repository DIR (a folder of model "
                                    "folders)")
        self._binary = find_binary(self._workdir, self.options.python)
        self.repository = repository.Repository.read(repo)
        exclude = dict(self.options.exclude)
        if self.options.exclude_baselines:
            exclude = {**self.repository.baselines(self.options.models), **exclude}
        return repository.plan_loading(self.repository, available_backends(self._binary),
                                       only=self.options.models, exclude=exclude)

    def start(self, cancel: threading.Event | None = None) -> None:
        """Start tritonserver and wait until every model it loads is READY. `cancel`, once
        set (bls-serve's SIGTERM), ends the wait. Where the start fails, start() stops what
        it started (its temporary folder included, unless a restart keeps it) and raises."""
        try:
            self._start(cancel)
        except BaseException:
            self.stop(final=self.status is None)
            raise

    def _start(self, cancel: threading.Event | None) -> None:
        opts = self.options
        self._cancel = cancel
        repo = opts.model_repository if s3.is_s3(opts.model_repository) else Path(opts.model_repository).resolve()
        plan = self.plan()
        binary = self._binary
        for name, why in plan.skipped.items():
            log.info("not loading %s: %s", name, why)  # the caller says so to its user (bls-serve, bls-demo)
        for name, why in self.repository.broken.items():  # one line each: the file, where in it, and why
            if name not in plan.broken and name not in plan.skipped:
                log.warning("not loading %s (not asked for); its config.pbtxt does not read: %s", name, why)
        if plan.broken and opts.fail_fast:
            raise ValueError(f"cannot read the config of {', '.join(plan.broken)} (the start fails on any model that "
                             f"cannot load): {'; '.join(plan.broken.values())}")
        for name, why in plan.standby.items():
            log.info("%s is %s: on standby (a CPU engine model then holds its engine only while calls come)", name, why)
        if not plan.load:
            raise RuntimeError(f"no model in {repo} can be loaded here: {plan.skipped | plan.broken}")
        self.ready_for = self._ready_for(plan)
        check_ports_free(opts, status=self.status is None)  # a restart keeps its status port
        # The flows read the model states (a failed load: INTERNAL), kept current by the watchdog's
        # rounds and the status port's; a wanted model whose config.pbtxt does not read is one.
        broken, root = tuple(plan.broken), self.repository.root
        callees = self.repository.callees
        self.states = ModelStates(self.admin, self._workdir / "model-states.json",
                                  unreadable=lambda: repository.config_problems(root, broken),
                                  followed=lambda: sorted({c for calls in callees.values() for c in calls}))
        self._flow_retries = FlowRetries(callees)  # a flow that failed for a child: loaded again once it changes
        env = {**binary.env, RESTARTS_ENV: str(self.restarts), STANDBY_ENV: ",".join(plan.standby),
               MODEL_STATES_ENV: str(self.states.path)}
        traces = self._tracing()
        if opts.status_port:
            env[EXECUTIONS_ENV] = str(self._workdir / "executions.sock")
            if self.status is None:  # kept through restarts: it says what happened meanwhile
                self.status = StatusServer(opts.host, opts.status_port, self.states, self.http_url, traces[0],
                                           own_traces=opts.trace_file is None,
                                           records_path=self._workdir / "executions.sock", ready_for=self.ready_for,
                                           watchdog=lambda: self.watchdog, server=self.state,
                                           also_ready=self._flows_ready if opts.ready_for is None else tuple)
                self.status.start()
            else:
                self.status.states, self.status.ready_for = self.states, self.ready_for
        if not self._orphans_ended and not s3.is_s3(opts.model_repository):
            end_orphans(repo)  # a bls-serve killed before on this repository left them
            self._orphans_ended = True

        cmd = tritonserver_argv(binary, opts, repo, plan.load, self.shm_prefix, trace=traces[1], gpu=has_gpu())
        # tritonserver's log goes to the log file, else to this process's stderr (fd 2, as an
        # inherited one would), through the pump.
        self._log_handle = open(opts.log_file, "ab") if opts.log_file is not None else os.fdopen(os.dup(2), "wb")
        log.info("starting %s", " ".join(cmd).replace(opts.admin_key, "***"))
        self.hung = None
        self.woken.clear()
        self._failures_at_start = dict(self.log_watch.failures)  # loads that fail from here on are this one's
        self._proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,  # passed on by the pump, and read on the way (tritonlog.py)
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() reaches every python stub
            preexec_fn=die_with_parent(os.getpid()) if opts.die_with_parent else None,
        )
        self._pump = LogPump(self._proc.stdout, self._log_handle, self.log_watch)
        self._pump.start()
        self.queue_monitor = QueueMonitor(self.http_url, self._proc.pid)
        self.queue_monitor.start()
        self.failed = {**plan.broken, **self.wait_ready(plan.load, opts.startup_timeout_s)}
        self._wait_forendpoints(endpoints(cmd), opts.startup_timeout_s)
        self._check_it_is_ours()
        self.loaded = tuple(m for m in plan.load if m not in self.failed)
        if not self.loaded:
            raise RuntimeError("no model could be loaded: "
                               f"{', '.join(f'{m} ({first_line(w)})' for m, w in self.failed.items())}"
                               f"{self._log_hint()}")
        for name, why in self.failed.items():
            log.error("%s FAILED to load, serving the others without it: %s", name, why)
        # every model was wanted, none named: a flow that failed is not followed
        if not (opts.ready_for or opts.models):
            self.ready_for = tuple(m for m in self.ready_for if m not in self.failed)
            if self.status is not None:
                self.status.ready_for = self.ready_for
        self.states.refresh()
        self._started_at = time.monotonic()
        if opts.watchdog_interval_s > 0:
            self.watchdog = Watchdog(self.http_url, self._watched_models, self.reload_model, opts.watchdog_interval_s,
                                     pgid=self.pid)
            self.watchdog.start()
        if opts.hang_timeout_s > 0:
            grpc = self.grpc_url if "gRPC" in endpoints(cmd) else None
            self.liveness = Liveness(self.http_url, grpc, self._on_hung, opts.hang_timeout_s)
            self.liveness.start()
        self.condition = None
        if self.status is not None:
            self.status.serving = True

    def _on_hung(self, reason: str) -> None:
        """The liveness thread's verdict: said at once (the status port), acted on by bls-serve's loop."""
        fatal = self.log_watch.fatal
        self.hung = reason + (f"; its log's last fatal line: {fatal}" if fatal else "")
        self.condition = f"tritonserver is not answering ({self.hung}): killing it"
        if self.status is not None:
            self.status.serving = False
        log.error("tritonserver does not answer: %s", self.hung)
        self.woken.set()

    def _load_failed(self, failure: LoadFailure) -> None:
        serving = self.states is not None and self.states.states.get(failure.model, {}).get("state") == "READY"
        log.error("%s: a load failed (Triton's log: version %s: %s)%s", failure.model, failure.version,
                  first_line(failure.why), "; Triton keeps its serving copy READY" if serving else "")

    def state(self) -> ServerState:
        """What the status port says of tritonserver and of bls-serve's care of it."""
        reloads = dict(self._past_reloads)
        watchdog = self.watchdog
        for recovery in list(watchdog.recoveries) if watchdog is not None else ():
            reloads[recovery.model] = reloads.get(recovery.model, 0) + 1
        liveness = self.liveness
        silent = liveness.judge.describe(time.monotonic()) if liveness is not None else None
        condition = self.condition or (f"tritonserver is not answering: {silent}" if silent else None)
        known = self._plan.load if self._plan is not None else self.loaded
        configs = self.repository.configs if self.repository is not None else {}
        capacity = {m: configs[m].dynamic_batching.default_queue_policy.max_queue_size for m in known if m in configs}
        return ServerState(condition=condition, restarts=dict(self.restart_causes),
                           load_failing=dict(self.log_watch.failing), load_failures=dict(self.log_watch.failures),
                           known=known, reloads=reloads, queue_capacity={m: n for m, n in capacity.items() if n > 0})

    def kill(self) -> None:
        """SIGKILL tritonserver with its whole group (its stubs): a server that hangs. stop() then
        clears what it left."""
        if self._proc is not None:
            stopping.kill_group(self._proc.pid)

    def _ready_for(self, plan: repository.LoadPlan) -> tuple[str, ...]:
        """The models /ready follows: those named, else those asked for, else every flow (a
        model that calls others) loaded, else every model loaded."""
        named = self.options.ready_for or self.options.models
        if named:
            unknown = [m for m in named if m not in self.repository.names]
            if unknown:
                raise ValueError(f"readiness follows models that are not in the repository: {', '.join(unknown)}")
            return tuple(named)
        return tuple(m for m in plan.load if self.repository.callees.get(m)) or plan.load

    def _flows_ready(self) -> tuple[str, ...]:
        """The flows (models that call others) READY now, as of the last look at the states:
        those known at start, and python models with a flow.py loaded later."""
        root = self.repository.root if self.repository is not None else None
        return tuple(m for m in self.states.ready() if self.repository.callees.get(m)
                     or (m not in self.repository.configs and root is not None and is_flow_model(root / m)))

    def _tracing(self) -> tuple[Path | None, tuple[str, ...]]:
        """Where Triton writes its request traces and the flags that make it: the user's file,
        else (with a status port) a folder of bls-serve's own; none with tracing off."""
        opts = self.options
        rate = opts.trace_rate or (1 if opts.trace_file is not None else 0)
        if rate <= 0 or (opts.trace_file is None and not opts.status_port):
            return None, ()
        prefix = Path(opts.trace_file) if opts.trace_file is not None else self._workdir / "traces" / "trace.json"
        prefix.parent.mkdir(parents=True, exist_ok=True)
        return prefix, trace_args(prefix, rate)

    def _watched_models(self) -> dict:
        """The python models the watchdog probes now: those READY, called models first (a flow's
        probe waits while its flow retries a dead child, so the child is found and reloaded
        first), then any loaded later through the repository API."""
        self.states.refresh()
        self._load_flows_again()
        order = [m for stage in reversed(repository.drain_stages(self.repository, self.loaded)) for m in stage]
        return self.states.python_models(order)

    def _load_flows_again(self) -> None:
        """Load again each flow that failed its load, once one of its children changed since
        (flow_retries.py): a fixed child brings back the flow that failed for it."""
        for flow, ready in self._flow_retries.due(self.states.states).items():
            log.info("loading %s again: %s changed since its load failed", flow, ", ".join(ready))
            try:
                self.load_model(flow)
            except AdminError as exc:
                log.warning("%s still fails its load: %s", flow, first_line(str(exc)))
                continue
            log.info("%s loaded: it follows its children again", flow)
            self.states.refresh()

    def wait_ready(self, models: tuple[str, ...], timeout_s: float) -> dict[str, str]:
        """Wait until every one of `models` is READY, or (fail_fast off) failed its load; the
        failed ones, with why (Triton's repository index)."""
        deadline = time.monotonic() + timeout_s
        pending = list(models)
        failed: dict[str, str] = {}
        while pending:
            self._fail_if_exited("it was ready")
            if time.monotonic() > deadline:
                raise TimeoutError(f"models not ready after {timeout_s:.0f}s: {pending}{self._log_hint()}")
            pending = [m for m in pending if not self.is_model_ready(m)]
            if pending and not self.options.fail_fast and self.states is not None:
                self.states.refresh()
                failed.update({m: why for m, why in self.states.failed().items() if m in pending})
                pending = [m for m in pending if m not in failed]
            if pending:
                time.sleep(0.25)
        return failed

    def _wait_forendpoints(self, ports: dict[str, int], timeout_s: float) -> None:
        """Every endpoint listening: Triton starts its metrics endpoint after the HTTP one that
        answered the readiness poll, so a caller reading metrics at once could be refused."""
        deadline = time.monotonic() + timeout_s
        for what, port in ports.items():
            while not listening(self.options.host, port):
                self._fail_if_exited(f"its {what} endpoint listened")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the {what} endpoint is not listening on port {port} after "
                                       f"{timeout_s:.0f}s{self._log_hint()}")
                time.sleep(0.05)

    def restart(self, cancel: threading.Event | None = None) -> None:
        """start() again, after the one before died on its own and stop() cleared what it left:
        the same models as the first start (models loaded or rolled out later through the
        repository API come back as their config.pbtxt says), RESTARTS_ENV one higher, and a
        watchdog on the new process."""
        if self.running():
            raise RuntimeError("tritonserver is running: restart() follows a death and stop()")
        self.restarts += 1
        self.start(cancel)

    def _fail_if_exited(self, before: str) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise RuntimeError(f"stopped before {before}")
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError(f"tritonserver exited with code {self._proc.returncode if self._proc else '?'} "
                               f"before {before}{self._log_hint()}")

    def _check_it_is_ours(self) -> None:
        """The server that answered the readiness poll is the one started here: only it knows
        this run's admin key (another server on the same port would refuse it)."""
        try:
            self.admin.states()
        except AdminError as exc:
            raise RuntimeError(f"the server answering on {self.http_url} is not the one started here ({exc}): "
                               "is another server using that port?") from None

    def not_loaded(self, models: tuple[str, ...]) -> dict[str, str]:
        """Those of `models` this server will not load, each with the reason (for a tool that
        needs them to say so before it starts, not fail on its first request)."""
        plan = self.plan()
        return {m: plan.skipped.get(m, "not loaded") for m in models if m not in plan.load}

    def is_model_ready(self, model: str) -> bool:
        return model_ready(self.http_url, model, timeout_s=2)

    @property
    def admin(self) -> RepositoryAdmin:
        """The repository and config APIs of this server, with its admin key."""
        return RepositoryAdmin(self.http_url, self.options.admin_key)

    def load_model(self, model: str) -> None:
        """Load `model` from the repository; an AdminError that names its config.pbtxt, and
        why, where that does not read (Triton says only "failed to poll from model repository")."""
        try:
            self.admin.load(model)
        except AdminError as exc:
            problem = repository.config_problems(self.repository.root, (model,)).get(model) if self.repository else None
            if problem:
                raise AdminError(f"{exc}: {problem}") from None
            raise

    def unload_model(self, model: str) -> None:
        self.admin.unload(model)

    def reload_model(self, model: str) -> None:
        """A fresh copy of the model, loaded while the old one keeps serving.

        A plain load of a loaded, unchanged model is a no-op in Triton, and so is (on 2.51) a
        load with its config as served. A load whose config differs loads every version
        again beside the serving copy and swaps the new one in once READY. So this loads the
        config as served (a rollout's version policy included) with RELOAD_KEY counted up.
        Where that load fails, it unloads then loads the model, and requests to it are
        refused in between (a flow calling it waits for it: child_retry_s)."""
        try:
            config = self.admin.config(model)
            params = config.setdefault("parameters", {})
            previous = params.get(RELOAD_KEY, {}).get("string_value", "0")
            params[RELOAD_KEY] = {"string_value": str(int(previous) + 1 if previous.isdigit() else 1)}
            self.admin.load(model, config)
            return
        except (AdminError, ValueError, AttributeError) as exc:
            log.error("reloading %r beside its serving copy failed (%s): unloading then loading it, "
                      "requests to it are refused meanwhile", model, exc)
        self.unload_model(model)
        self.load_model(model)

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, final: bool = True) -> int | None:
        """Drain, SIGTERM, then kill whatever is left (server, stubs, /dev/shm regions), within
        the drain's limit (exit_timeout_s) and STOP_GRACE_S, whatever tritonserver does
        (stopping.py). Also clears what a tritonserver that died, or was killed hung, left.

        Draining unloads the models that call others (classify_bls, ensembles) before the
        classifiers: their in-flight requests finish while the children still serve, and
        new ones are refused at once. A plain SIGTERM stops every scheduler together, so
        in-flight BLS requests lose their child model (and Triton 2.51 can abort). After a
        drain, a model copy that a dead python stub left stuck does not hold the stop up.
        A tritonserver that does not answer is not drained: it is killed.

        final: False (bls-serve, before a restart) keeps the status port and its folder."""
        began = time.monotonic()
        limit = self.options.exit_timeout_s
        deadline = began + limit + STOP_GRACE_S
        # Every helper told to halt at once; each then waited for (a call under way to a server
        # that hangs ends at its own timeout), all within a few seconds together.
        liveness, self.liveness = self.liveness, None
        if liveness is not None:
            liveness.stop(timeout_s=0)
        if self.queue_monitor is not None and self.hung:
            self.queue_monitor.halt()
        watchdog, self.watchdog = self.watchdog, None
        if self.status is not None:
            self.status.serving = False  # /ready: 503 from now on, while the drain runs
        if watchdog is not None:
            try:
                watchdog.stop(timeout_s=min(2.0, max(0.1, deadline - time.monotonic())))
            except Exception as exc:  # noqa: BLE001 - never let it keep the server alive
                log.warning("stopping the watchdog failed: %s", exc)
            for recovery in list(watchdog.recoveries):
                self._past_reloads[recovery.model] = self._past_reloads.get(recovery.model, 0) + 1
        if liveness is not None and liveness.is_alive() and liveness is not threading.current_thread():
            liveness.join(timeout=max(0.0, min(2.0, began + 2.0 - time.monotonic())))
        proc = self._proc
        result = stopping.Drain(False)
        if proc is not None and proc.poll() is None:
            silent = liveness.judge.describe(time.monotonic()) if liveness is not None else None
            if self.hung or silent:  # its liveness checks went unanswered already: no drain to wait for
                result = stopping.Drain(False, reason=f"tritonserver did not answer ({self.hung or silent})",
                                        unanswered=True)
            else:
                stages = repository.drain_stages(self.repository, self.loaded) if self.repository is not None else []
                metrics = self.metrics_url if "metrics" in endpoints(proc.args) else None
                view = stopping.StopView(self.http_url, self.options.admin_key, metrics, proc)
                result = stopping.drain(stages, view,
                                        began + limit, limit_s=limit, unanswered_s=UNANSWERED_S, exit_timeout_s=limit)
        # Its kept-alive connection would hold tritonserver's exit (Triton waits out its exit
        # timeout for open HTTP connections); after the drain no flow reads its readings.
        monitor, self.queue_monitor = self.queue_monitor, None
        if monitor is not None:  # and the queue readings it wrote for the flows (adapter/queue_waits.py)
            monitor.stop(timeout_s=0.5 if result.unanswered else 2.0)
        self._proc = None
        if proc is not None:
            leaked = tuple(sorted(m for m, n in self.log_watch.failures.items()
                                  if n > self._failures_at_start.get(m, 0)))
            self.last_stop = stopping.end_process(proc, result, began, deadline, limit_s=limit, leaked=leaked,
                                                  instance_of=(watchdog and watchdog.instance_of) or (lambda _: None),
                                                  log_file=self.options.log_file)
        else:
            self.last_stop = stopping.StopReport(None, result.drained)  # nothing ran: nothing drained, nothing to say
        code = self.last_stop.code
        drained_at = time.monotonic()
        pump, self._pump = self._pump, None
        if pump is not None:
            pump.join(timeout=max(0.1, min(2.0, deadline - time.monotonic())))
        if final:
            status, self.status = self.status, None
            if status is not None:
                status.stop()
        for leftover in Path("/dev/shm").glob(f"{self.shm_prefix}*"):
            leftover.unlink(missing_ok=True)
        if proc is not None:  # any a killed bls-serve left
            for leftover in Path("/dev/shm").glob(f"{WAIT_PREFIX}{proc.pid}_*"):
                leftover.unlink(missing_ok=True)
        if self._log_handle:
            self._log_handle.close()
            self._log_handle = None
        if self._workdir and final:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir, self._binary = None, None
        self._plan = None
        if proc is not None:
            log.info("tritonserver stopped in %.1f s (%.1f s to its end, %.1f s to clear what it left)",
                     time.monotonic() - began, drained_at - began, time.monotonic() - drained_at)
        return code

    def _log_hint(self) -> str:
        """Error lines of the server log (model load failures), for exception messages."""
        path = self.options.log_file
        if not path or not Path(path).exists():
            return ""
        lines = Path(path).read_text(errors="replace").splitlines()
        errors = [ln for ln in lines if ln.startswith("E") or ln.startswith("error:")][-15:]
        return f"\n--- errors in {path} ---\n" + "\n".join(errors or lines[-15:])


def _url_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host
