"""bls-serve's own endpoint (--status-port, 8003): readiness that follows the models an
operator names, what happened to tritonserver, and (with request tracing on) the request
latency Triton's metrics lack and the recent requests explained.

Nothing here waits on tritonserver: every answer is made from what bls-serve's threads last
saw (the model states, refreshed every second; the liveness checks; the watchdog's probes), so
a tritonserver that hangs makes /ready say so, at once, instead of hanging it too.

    GET /ready      200 when tritonserver serves, every model it follows is READY and its last
                    probe answered (a flow whose candidates all failed to load does not), else
                    503 naming why; it follows the models named (--ready-for), else those asked
                    for and every flow READY now (one loaded later too, while it is loaded).
                    No other model counts: one that failed its load and nobody named, was
                    unloaded or is fixed later changes nothing here (Triton's strict
                    /v2/health/ready stays 400 after one failed load, even once it is unloaded).
                    A model whose last load failed while its old copy serves stays ready, and
                    the text says so. While tritonserver does not answer, is being killed or
                    restarted, or bls-serve gave up on it: 503 saying which, and why
    GET /metrics    Prometheus text, every counter there from the start at 0 for each label value:
        bls_tritonserver_restarts_total{cause}   tritonserver started again by bls-serve, by the
                    cause of its end: crashed (a signal), exited (an exit code), hung (stopped
                    answering: killed with its group), start_failed (the restart before failed)
        bls_model_load_failures_total{model}   loads that failed, Triton's log says (a reload
                    that failed while the old copy serves included: its index shows none)
        bls_queue_capacity{model}          (gauge) its config's max_queue_size, for a model whose queue is
                    bounded: Triton refuses the request that would overflow it, and counts that
                    refusal nowhere (only a trace shows it); nv_inference_pending_request_count
                    over this is how full the queue stands
        bls_model_ready{model}, bls_model_load_failed{model}   (gauges) from the repository index,
                    and a failed load Triton's log named until the model loads again
        bls_watchdog_reloads_total{model}    models the watchdog reloaded after their stub died
    With request tracing on (bls-serve --trace-rate N; workarounds.py, "tracing abort"), of the
    traced requests (one in N):
        bls_request_duration_seconds{model}  histogram: a request's time in Triton, from its
                    arrival to its response (its trace's REQUEST_START to REQUEST_END), every
                    user's request that reached the model, answered or failed
        bls_queue_duration_seconds{model}    histogram: the time it waited for an instance
                    (QUEUE_START to COMPUTE_START)
        bls_refused_requests_total{model,reason}   requests Triton's queue refused (503)
                    before the model saw them: queue_full ("Exceeds maximum queue size": Triton
                    2.51 counts it nowhere) or queue_timeout ("Request timeout expired": its
                    nv_inference_request_failure{reason="REJECTED"}, probes and child calls
                    included)
        bls_queue_cancelled_requests_total{model}  requests whose client had gone (it
                    cancelled, or its gRPC deadline passed) while they waited in Triton's queue,
                    dropped there: not a refusal (Triton's {reason="CANCELED"}); the flows count
                    those they drop themselves in bls_requests_total{code="CANCELLED"}
    GET /requests?slowest=N, ?id=ID   the recent traced requests (the last KEEP) explained
                    (request_join.py); &model=M: of that model only, &since=S: arrived in the last S
                    seconds. 409 with tracing off

The latencies come from Triton's own request traces (level TIMESTAMPS, one file per trace,
read here and removed); the watchdog's probes (request id contract.PROBE_REQUEST_ID) are left
out. The flows send one record per execute() to a datagram socket read here
(adapter/records.py), which /requests joins with the traces. Without tracing, Triton's own
latency summaries (nv_inference_request_summary_us, on its metrics port) measure every request.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ..base.messages import first_line
from ..contract import PROBE_REQUEST_ID
from .request_join import explain, slowest
from .model_index import ModelStates
from .traces import CANCELLED, QUEUE_FULL, QUEUE_TIMEOUT, RequestTrace, TraceFiles

__all__ = ["LATENCY_BOUNDS", "RESTART_CAUSES", "Histogram", "ServerState", "StatusServer"]

# Why bls-serve started tritonserver again: how the one before ended (bls_tritonserver_restarts_total).
RESTART_CAUSES = ("crashed", "exited", "hung", "start_failed")


@dataclass(frozen=True)
class ServerState:
    """What bls-serve knows of tritonserver beyond its models' states (TritonServer.state)."""
    condition: str | None = None  # what bls-serve does about it now (None: it serves)
    restarts: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(RESTART_CAUSES, 0))
    load_failing: Mapping[str, object] = field(default_factory=dict)  # model -> tritonlog.LoadFailure
    load_failures: Mapping[str, int] = field(default_factory=dict)  # model -> failed loads so far
    known: Sequence[str] = ()  # the models planned to load: every per-model counter has them
    reloads: Mapping[str, int] = field(default_factory=dict)  # model -> the watchdog's reloads so far
    # model -> its config's max_queue_size (bounded only)
    queue_capacity: Mapping[str, int] = field(default_factory=dict)

log = logging.getLogger(__name__)

# Seconds, 1 ms to 82 s: the E12 series (12 per decade, each bound at most 1.25x the one
# before), so that histogram_quantile's interpolation inside a bucket stays within a few
# percent of the true quantile.
LATENCY_BOUNDS = tuple(round(m * 10.0 ** e, 6) for e in range(-3, 2)
                       for m in (1.0, 1.2, 1.5, 1.8, 2.2, 2.7, 3.3, 3.9, 4.7, 5.6, 6.8, 8.2))
KEEP = 10_000  # traces and execute() records kept for /requests


class Histogram:
    """Prometheus's histogram: cumulative counts per upper bound, their sum and count."""

    def __init__(self, bounds: Sequence[float] = LATENCY_BOUNDS):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        i = next((i for i, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts):
            running += n
            le = "+Inf" if bound == math.inf else f"{bound:g}"
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {running}')
        out += [f"{name}_sum{{{labels}}} {self.sum:.6f}", f"{name}_count{{{labels}}} {self.count}"]
        return out


_HELP = {
    "bls_request_duration_seconds": ("histogram", "Seconds from a request's arrival in Triton to its response (its "
                                     "trace's REQUEST_START to REQUEST_END), every user's request that reached the "
                                     "model, answered or failed"),
    "bls_queue_duration_seconds": ("histogram", "Seconds a user's request waited in Triton's queue for an instance "
                                   "(QUEUE_START to COMPUTE_START)"),
    "bls_refused_requests_total": ("counter", "Users' requests Triton's queue refused (503) before the model saw them, "
                                   "by reason: queue_full (Exceeds maximum queue size) or queue_timeout (Request "
                                   "timeout expired); not those whose client had gone"),
    "bls_queue_cancelled_requests_total": ("counter", "Users' requests whose client had gone (it cancelled, or its "
                                                      "gRPC deadline passed) while they waited in Triton's queue, "
                                                      "dropped there before the model saw them; not a refusal"),
    "bls_model_ready": ("gauge", "1 while the model is READY in Triton's repository index, else 0"),
    "bls_model_load_failed": ("gauge",
                              "1 while the model's last load failed (Triton's index: UNAVAILABLE with a reason)"),
    "bls_watchdog_reloads_total": ("counter",
                                   "Reloads of the model by bls-serve's watchdog after its python stub died"),
    "bls_tritonserver_restarts_total": ("counter", "Starts of tritonserver by bls-serve after the one before ended, by "
                                        "how it ended: crashed (a signal), exited (an exit code), hung (it stopped "
                                        "answering and was killed), start_failed (the restart before did not start)"),
    "bls_queue_capacity": ("gauge",
                           "The most requests the model's queue holds (its config's max_queue_size): one more is "
                           "refused on arrival; beside Triton's nv_inference_pending_request_count, how full it is"),
    "bls_model_load_failures_total": ("counter", "Loads of the model that failed, as Triton's log says, a reload that "
                                      "failed while the old copy serves included"),
}


class StatusServer:
    """The endpoint on host:port, with what feeds it: Triton's trace files under
    `trace_prefix` (removed once read when `own_traces`), the flows' records on the datagram
    socket `records_path`, the model states, and the watchdog (a callable: the current one or
    None). `ready_for`: the models /ready follows; `also_ready`: the models it follows as well,
    asked at each look (bls-serve's: the flows READY now, where --ready-for is not given)."""

    def __init__(self, host: str, port: int, states: ModelStates, http_url: str, trace_prefix: Path | None,
                 own_traces: bool,
                 records_path: Path, ready_for: Sequence[str], watchdog: Callable[[], object | None] = lambda: None,
                 interval_s: float = 0.2, states_every_s: float = 1.0, also_ready: Callable[[], Sequence[str]] = tuple,
                 server: Callable[[], ServerState] = ServerState):
        self.host, self.port = host, port
        self.states = states
        self._http_url = http_url
        self.ready_for = tuple(ready_for)
        self._also_ready = also_ready
        self._watchdog = watchdog
        self._server = server
        self._files = TraceFiles(trace_prefix, remove=own_traces) if trace_prefix is not None else None
        self._records_path = Path(records_path)
        self._interval, self._states_every = interval_s, states_every_s
        self._lock = threading.Lock()  # the histograms, counts and kept traces and records
        self._collecting = threading.Lock()  # one reader of the trace files at a time (the thread's, /requests')
        self._requests: dict[str, Histogram] = {}
        self._queues: dict[str, Histogram] = {}
        self._refused: dict[tuple[str, str], int] = {}  # (model, reason)
        self._cancelled: dict[str, int] = {}
        self.traces: deque[RequestTrace] = deque(maxlen=KEEP)
        self.records: deque[dict] = deque(maxlen=KEEP)
        self.serving = False  # set once tritonserver serves: /ready is 503 "starting" before
        self._halt = threading.Event()
        self._threads: list[threading.Thread] = []
        self._http: ThreadingHTTPServer | None = None
        self._socket: socket.socket | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._records_path.unlink(missing_ok=True)
        self._socket.bind(str(self._records_path))
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        self._socket.settimeout(0.2)
        handler = type("Handler", (_Handler,), {"status": self})
        server = ThreadingHTTPServer if ":" not in self.host else type("Server6", (ThreadingHTTPServer,),
                                                                        {"address_family": socket.AF_INET6})
        self._http = server((self.host, self.port), handler)
        self._http.daemon_threads = True
        work = [(self._http.serve_forever, "bls-status-http"), (self._receive, "bls-status-records"),
                (self._watch_states, "bls-status-states")]
        if self._files is not None:
            work.append((self._collect, "bls-status-traces"))
        for target, name in work:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    @property
    def tracing(self) -> bool:
        return self._files is not None

    def stop(self) -> None:
        self._halt.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        for thread in self._threads:  # the states thread may be in a call to a tritonserver that hangs (2 s)
            thread.join(timeout=3)
        if self._socket is not None:
            self._socket.close()
            self._records_path.unlink(missing_ok=True)

    # ---- what feeds it ---------------------------------------------------------------------
    def _collect(self) -> None:
        while not self._halt.wait(self._interval):
            try:
                self.collect()
            except Exception as exc:  # noqa: BLE001 - a trace that breaks the reader is skipped, the reader goes on
                log.warning("reading Triton's traces failed: %s", exc)

    def collect(self) -> None:
        """Read the trace files written since the last look (the thread's loop, and /requests first)."""
        if self._files is None:
            return
        with self._collecting:
            try:
                traces = self._files.read_new()
            except OSError as exc:  # the folder went with a stopped server
                log.debug("trace files not read: %s", exc)
                return
            self._count(traces)

    def _count(self, traces: list[RequestTrace]) -> None:
        with self._lock:
            for trace in traces:
                # Users' requests: not the watchdog's probes, nor a flow's child call (written
                # apart from its caller's trace).
                if trace.request_id == PROBE_REQUEST_ID or not trace.model or trace.parent_id is not None:
                    continue
                unserved = trace.unserved
                if unserved == CANCELLED:
                    self._cancelled[trace.model] = self._cancelled.get(trace.model, 0) + 1
                elif unserved is not None:
                    self._refused[trace.model, unserved] = self._refused.get((trace.model, unserved), 0) + 1
                else:
                    total = trace.span_ms("REQUEST_START", "REQUEST_END")
                    queue = trace.span_ms("QUEUE_START", "COMPUTE_START")
                    if total is not None:
                        self._requests.setdefault(trace.model, Histogram()).observe(total / 1e3)
                    if queue is not None:
                        self._queues.setdefault(trace.model, Histogram()).observe(queue / 1e3)
                self.traces.append(trace)

    def _receive(self) -> None:
        while not self._halt.is_set():
            try:
                data = self._socket.recv(1 << 20)
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                record = json.loads(data)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == "bls_execute":
                with self._lock:
                    self.records.append(record)

    def _watch_states(self) -> None:
        while not self._halt.wait(self._states_every):
            try:
                self.states.refresh()
            except Exception as exc:  # noqa: BLE001 - the next look tries again
                log.warning("reading the model states failed: %s", exc)

    # ---- what it answers -------------------------------------------------------------------
    def readiness(self) -> tuple[bool, str]:
        """From what was last seen, never asking tritonserver (a server that hangs would hang it)."""
        server = self._server()
        if server.condition:
            return False, f"not ready: {server.condition}"
        if not self.serving:
            return False, "starting: tritonserver is loading its models"
        watchdog = self._watchdog()
        outcomes = getattr(watchdog, "outcomes", {}) if watchdog is not None else {}
        why = {}
        states = self.states.states
        followed = tuple(dict.fromkeys((*self.ready_for, *self._also_ready())))
        for model in followed:
            entry = states.get(model, {})
            if entry.get("state") != "READY":
                why[model] = f"{entry.get('state') or 'not loaded'}" + (f" ({first_line(entry['reason'])})"
                                                                        if entry.get("reason") else "")
            elif model in outcomes and not outcomes[model].ok:
                why[model] = f"its last probe failed: {first_line(outcomes[model].message)}"
        if why:
            return False, "not ready: " + "; ".join(f"{m} {w}" for m, w in why.items())
        failing = [f"{m} (its last load failed, its serving copy answers: {first_line(getattr(f, 'why', ''))})"
                   for m, f in sorted(server.load_failing.items()) if states.get(m, {}).get("state") == "READY"]
        return True, "ready: " + ", ".join(followed) + ("; " + "; ".join(failing) if failing else "")

    def metrics(self) -> str:
        lines = []

        def family(name: str, rows: list[str]) -> None:
            kind, text = _HELP[name]
            lines.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}", *rows])

        server = self._server()
        states, failed = self.states.states, self.states.failed()
        # Every model planned or seen, each counter at 0 from the start: a rate over them sees
        # the first event (a series that appears at 1 shows none).
        models = sorted({*server.known, *states, *self.ready_for, *server.reloads, *server.load_failures})
        if self.tracing:
            with self._lock:
                for model in self.ready_for:
                    self._requests.setdefault(model, Histogram())
                    self._queues.setdefault(model, Histogram())
                for model in models:
                    for reason in (QUEUE_FULL, QUEUE_TIMEOUT):
                        self._refused.setdefault((model, reason), 0)
                    self._cancelled.setdefault(model, 0)
                family("bls_request_duration_seconds",
                       [ln for m, h in sorted(self._requests.items())
                        for ln in h.lines("bls_request_duration_seconds", f'model="{m}"')])
                family("bls_queue_duration_seconds",
                       [ln for m, h in sorted(self._queues.items())
                        for ln in h.lines("bls_queue_duration_seconds", f'model="{m}"')])
                family("bls_refused_requests_total", [f'bls_refused_requests_total{{model="{m}",reason="{r}"}} {n}'
                                                      for (m, r), n in sorted(self._refused.items())])
                family("bls_queue_cancelled_requests_total", [f'bls_queue_cancelled_requests_total{{model="{m}"}} {n}'
                                                              for m, n in sorted(self._cancelled.items())])
        family("bls_tritonserver_restarts_total", [f'bls_tritonserver_restarts_total{{cause="{c}"}} '
                                                   f'{server.restarts.get(c, 0)}'
                                                   for c in RESTART_CAUSES])
        family("bls_model_ready", [f'bls_model_ready{{model="{m}"}} {int(states.get(m, {}).get("state") == "READY")}'
                                   for m in models])
        family("bls_model_load_failed", [f'bls_model_load_failed{{model="{m}"}} '
                                         f'{int(m in failed or m in server.load_failing)}'
                                         for m in models])
        family("bls_model_load_failures_total", [f'bls_model_load_failures_total{{model="{m}"}} '
                                                 f'{server.load_failures.get(m, 0)}'
                                                 for m in models])
        family("bls_watchdog_reloads_total", [f'bls_watchdog_reloads_total{{model="{m}"}} {server.reloads.get(m, 0)}'
                                              for m in models])
        family("bls_queue_capacity",
               [f'bls_queue_capacity{{model="{m}"}} {n}' for m, n in sorted(server.queue_capacity.items())])
        return "\n".join(lines) + "\n"

    def requests(self, slowest_n: int | None = None, request_id: str | None = None, since_s: float | None = None,
                 model: str | None = None) -> list[dict]:
        """The recent requests explained: the slowest n, or those with this id; of `model` only,
        and of those that arrived in the last `since_s` seconds, where given."""
        self.collect()
        with self._lock:
            traces, records = list(self.traces), list(self.records)
        # Triton's trace timestamps are on CLOCK_MONOTONIC, this process's time.monotonic_ns().
        since_ns = None if since_s is None else time.monotonic_ns() - int(since_s * 1e9)
        if request_id is not None:
            chosen = [t for t in traces if t.request_id == request_id and (model is None or t.model == model)
                      and (since_ns is None or t.ns.get("REQUEST_START", since_ns) >= since_ns)]
        else:
            chosen = slowest(traces, slowest_n or 1, model=model, since_ns=since_ns)
        return [explain(t, records, traces) for t in chosen]


class _Handler(BaseHTTPRequestHandler):
    status: StatusServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urllib.parse.urlparse(self.path)
        query = urllib.parse.parse_qs(url.query)
        try:
            if url.path == "/ready":
                ok, text = self.status.readiness()
                self._send(200 if ok else 503, text + "\n", "text/plain; charset=utf-8")
            elif url.path == "/metrics":
                self._send(200, self.status.metrics(), "text/plain; version=0.0.4; charset=utf-8")
            elif url.path == "/requests" and not self.status.tracing:
                self._send(409, "request tracing is off (on Triton 2.51 a traced request can abort tritonserver): "
                                "start bls-serve with --trace-rate N to trace one request in N\n",
                           "text/plain; charset=utf-8")
            elif url.path == "/requests":
                n = int(query.get("slowest", ["1"])[0])
                since = query.get("since", [None])[0]
                since_s = None if since is None else float(since)
                if since_s is not None and not (math.isfinite(since_s) and since_s > 0):
                    raise ValueError(f"since={since}: a number of seconds above 0, e.g. since=300")
                found = self.status.requests(slowest_n=n, request_id=query.get("id", [None])[0], since_s=since_s,
                                             model=query.get("model", [None])[0])
                self._send(200, json.dumps(found), "application/json")
            else:
                self._send(404, "GET /ready, /metrics or /requests\n", "text/plain; charset=utf-8")
        except ValueError as exc:
            self._send(400, f"{exc}\n", "text/plain; charset=utf-8")

    def _send(self, code: int, body: str, content_type: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # a probe every few seconds: not worth a line each
        pass
