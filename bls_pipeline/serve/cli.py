"""`bls-serve`: serve a model repository with a local tritonserver until SIGTERM or Ctrl-C.

It starts a TritonServer (server.py), says what it serves, and starts a tritonserver that died
on its own, or that stopped answering (killed with its group), again, with backoff, giving up
after too many restarts; its exit status (ExitCode) says how it ended.
"""

from __future__ import annotations

import argparse
import enum
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..base.messages import first_line
from ..contract import RESTARTS_ENV
from . import s3
from .admin import ADMIN_HEADER
from .paths import default_models
from .processes import become_subreaper
from .argv import GRPC_ADMIN_HEADER, RESTRICTED_APIS
from .server import TritonServer
from .options import ServerOptions

__all__ = ["ExitCode", "main"]

log = logging.getLogger(__name__)


class ExitCode(enum.IntEnum):
    """bls-serve's exit status, each a cause."""
    OK = 0  # stopped with every request in flight answered (a kill after a full drain included)
    LOST = 1  # stopped without a full drain (requests in flight may have failed), or died with --no-restart
    START = 2  # could not start (--fail-fast: a model failed its load, or its config.pbtxt does not read)
    HUNG = 3  # tritonserver stopped answering (at the stop, or with --no-restart): killed with its group
    GAVE_UP = 4  # tritonserver ended too often: bls-serve gave up restarting it


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bls-serve",
                                description="Serve a model repository with a local tritonserver (no Docker needed).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model-repository", type=_repository_arg, default=default_models(),
                   help="a folder (./models, else the checkout's), or s3://bucket/path or s3://host:port/bucket/path "
                        "(credentials and region from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION)")
    p.add_argument("--host", default="127.0.0.1",
                   help="bind address for HTTP, gRPC and metrics (loopback: this machine only)")
    p.add_argument("--http-port", type=int, default=8000, help="HTTP/REST (KServe v2) port")
    p.add_argument("--grpc-port", type=int, default=8001, help="gRPC port")
    p.add_argument("--metrics-port", type=int, default=8002, help="Prometheus metrics port")
    p.add_argument("--models",
                   help="comma-separated models to load, with the models they call (default: all whose parts are "
                        "present)")
    p.add_argument("--admin-key",
                   help="key for the model-repository/config/shared-memory APIs (default: random per run)")
    p.add_argument("--with-baselines", action="store_true",
                   help="also load the benchmark baselines (the static ensemble)")
    p.add_argument("--log-verbose", type=int, default=0, help="tritonserver's --log-verbose level")
    p.add_argument("--watchdog-interval", type=float, default=2.0,
                   help="seconds between real-inference probes that reload a model whose python stub died (0: off)")
    p.add_argument("--trace-rate", type=int, metavar="N",
                   help="trace one request in N through Triton (TIMESTAMPS): the status port's latency histograms and "
                        "/requests (bls-explain) then work on those; default: no tracing, as Triton 2.51's tracer can "
                        "abort tritonserver on any traced request (docs/reliability.md, \"Triton 2.51 workarounds\")")
    p.add_argument("--trace", metavar="FILE", type=Path,
                   help="keep Triton's traces (TIMESTAMPS) in FILE.0, FILE.1, ... one JSON list per trace, of every "
                        "request unless --trace-rate says otherwise; a flow's child calls show under a request's trace "
                        "(docs/reliability.md, \"Tracing\"); without it, bls-serve reads the traces of --trace-rate "
                        "for the status port and removes them")
    p.add_argument("--status-port", type=int, default=8003,
                   help="bls-serve's own endpoint: /ready (the --ready-for models, and what happened to tritonserver), "
                        "/metrics (restarts, load failures; latency histograms with --trace-rate), /requests "
                        "(bls-explain, with --trace-rate); 0: none")
    p.add_argument("--hang-timeout", type=float, default=8.0, metavar="SECONDS",
                   help="a tritonserver whose liveness endpoint goes unanswered over HTTP or gRPC (each asked "
                        "every second, 2 s timeout) for this long is killed with its stubs and, with --restart, "
                        "started again (0: not checked)")
    p.add_argument("--max-restarts", type=int, default=5, metavar="N",
                   help="give up (exit 4) when tritonserver has to be restarted more than N times within 10 minutes "
                        "(0: never give up)")
    p.add_argument("--ready-for", metavar="MODELS",
                   help="comma-separated models the status port's /ready follows, and no other (default: --models, "
                        "else every flow that loaded at start; and any flow loaded later, while it is): READY, and a "
                        "flow's last watchdog probe answered")
    p.add_argument("--fail-fast", action="store_true",
                   help="exit 2 when any model fails its load or its config.pbtxt does not read; by default "
                        "bls-serve names what failed and serves the rest (docs/reliability.md, \"A model that fails "
                        "its load\")")
    p.add_argument("--restart", action=argparse.BooleanOptionalAction, default=True,
                   help="start tritonserver again when it dies on its own, with the same models (after 1 s, doubling "
                        f"to 30 s, back to 1 s after {_Backoff.stable_s:.0f} s serving; {RESTARTS_ENV} counts the "
                        "restarts); --no-restart: bls-serve exits 1 instead. Under an orchestrator that restarts the "
                        "container (Kubernetes), pass --no-restart: see docs/reliability.md")
    args = p.parse_args(argv)
    if args.model_repository is None:
        p.error("no ./models here and no checkout's models/: pass --model-repository DIR")
    return args


def _repository_arg(value: str) -> Path | str:
    return value if s3.is_s3(value) else Path(value)


@dataclass
class _Backoff:
    """Seconds to wait before each restart: first_s, doubling up to cap_s; back to first_s
    when the server had been serving stable_s or more when it died."""
    first_s: float = 1.0
    cap_s: float = 30.0
    stable_s: float = 60.0
    _next_s: float | None = None

    def delay(self, uptime_s: float) -> float:
        if self._next_s is None or uptime_s >= self.stable_s:
            self._next_s = self.first_s
        delay, self._next_s = self._next_s, min(self._next_s * 2, self.cap_s)
        return delay


def _exit_cause(code: int | None) -> str:
    """How a process ended, from its exit status: "died of SIGSEGV", "exited with code 1"."""
    if code is not None and code < 0:
        try:
            return f"died of {signal.Signals(-code).name}"
        except ValueError:
            return f"died of signal {-code}"
    return f"exited with code {code}"


@dataclass
class _Intensity:
    """Erlang/OTP's restart intensity: more than `most` restarts within `window_s` and bls-serve
    gives up (0: never), so a server that cannot stay up is not started again forever."""
    most: int = 5
    window_s: float = 600.0
    _at: list = field(default_factory=list)

    def allow(self, now: float) -> bool:
        self._at = [t for t in self._at if now - t < self.window_s]
        if self.most and len(self._at) >= self.most:
            return False
        self._at.append(now)
        return True


def _serve(server: TritonServer, stop: threading.Event, restart: bool,
           intensity: _Intensity | None = None) -> int | None:
    """Serve until `stop` is set; start a tritonserver that dies on its own, or hangs (killed
    with its group), again (with _Backoff, and _Intensity's limit: then ExitCode.GAVE_UP), or
    return ExitCode.LOST (died) or HUNG (hung) when `restart` is off. None: stopped."""
    backoff, intensity = _Backoff(), intensity or _Intensity()
    while True:
        while server.running() and not server.hung and not stop.is_set():
            server.woken.wait(0.2)
        if stop.is_set():
            return None
        died_at, uptime = time.monotonic(), server.uptime_s
        fatal = server.log_watch.fatal
        said = f"; its log's last fatal line: {fatal}" if fatal else ""
        if server.hung:
            cause, what, said = "hung", f"did not answer ({server.hung}) and was killed with its group", ""
            server.kill()
        else:
            code = server.returncode
            cause = "crashed" if code is not None and code < 0 else "exited"
            what = _exit_cause(code)
        server.log_watch.fatal = None  # said once
        server.condition = f"tritonserver {what}"
        server.stop(final=False)  # what it left: its stubs, /dev/shm regions, the watchdog on it
        if not restart:
            code = ExitCode.HUNG if cause == "hung" else ExitCode.LOST
            log.error("tritonserver %s after %.0f s serving, not on a stop: the requests in flight were lost; "
                      "--no-restart: bls-serve exits %d%s", what, uptime, code, said)
            return code
        while True:
            if not intensity.allow(time.monotonic()):
                server.condition = (f"bls-serve gave up: tritonserver ended {intensity.most} times within "
                                    f"{intensity.window_s:.0f} s, the last {what}")
                log.error("%s; bls-serve exits %d (restarts by cause: %s)", server.condition, ExitCode.GAVE_UP,
                          ", ".join(f"{c} {n}" for c, n in server.restart_causes.items()))
                return ExitCode.GAVE_UP
            delay = backoff.delay(uptime)
            server.condition = f"tritonserver {what}; restarting it in {delay:.0f} s (restart {server.restarts + 1})"
            log.error("tritonserver %s after %.0f s serving, not on a stop: the requests in flight were lost; "
                      "restarting it in %.0f s (restart %d, %s=%d)%s", what, uptime, delay, server.restarts + 1,
                      RESTARTS_ENV, server.restarts + 1, said)
            said = ""
            if stop.wait(delay):
                return None
            server.restart_causes[cause] += 1
            server.condition = f"tritonserver {what}; starting it again (restart {server.restarts + 1})"
            try:
                server.restart(cancel=stop)
                break
            except (RuntimeError, OSError, TimeoutError, ValueError) as exc:
                if stop.is_set():
                    return None
                cause, what, uptime = "start_failed", f"could not be started again ({exc})", 0.0
        log.warning("tritonserver restarted (restart %d, %s=%d): serving %s again, %.1f s after it %s",
                    server.restarts, RESTARTS_ENV, server.restarts, ", ".join(server.loaded),
                    time.monotonic() - died_at, "was killed" if cause == "hung" else "died")


def main(argv: list[str] | None = None) -> int:
    """bls-serve; its exit status is an ExitCode: 0 once stopped (SIGTERM, Ctrl-C) with every
    request in flight answered (tritonserver drained, even if it had to be killed after for a
    copy a dead stub left stuck, or a model Triton held); 1 when the stop could not drain, or
    tritonserver died on its own with --no-restart; 2 when it could not start (with
    --fail-fast: any model failed its load, or its config.pbtxt does not read); 3 when
    tritonserver stopped answering (at the stop, or with --no-restart) and was killed; 4 when
    it ended too often and bls-serve gave up restarting it."""
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    opts = ServerOptions(
        model_repository=args.model_repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        models=tuple(args.models.split(",")) if args.models else None,
        log_verbose=args.log_verbose,
        watchdog_interval_s=args.watchdog_interval,
        fail_fast=args.fail_fast,
        status_port=args.status_port or None,
        ready_for=tuple(args.ready_for.split(",")) if args.ready_for else None,
        trace_rate=args.trace_rate if args.trace_rate is not None else (1 if args.trace else 0),
        trace_file=args.trace,
        hang_timeout_s=args.hang_timeout,
        die_with_parent=True,  # started from this, the main thread: a bls-serve killed takes tritonserver along
    )
    if args.admin_key:
        opts.admin_key = args.admin_key
    opts.exclude_baselines = not args.with_baselines
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server = TritonServer(opts)
    try:
        server.start(cancel=stop)
    # one line, no traceback: what to fix (S3Error too)
    except (RuntimeError, OSError, TimeoutError, ValueError) as exc:
        server.stop()  # start() stopped what it started; this only makes sure
        if stop.is_set():
            log.info("stopped while tritonserver was starting")
            return ExitCode.OK
        print(f"bls-serve: error: {exc}", file=sys.stderr)
        return ExitCode.START
    # The stubs of a tritonserver that crashed or was killed become bls-serve's children, to
    # reap at once: in a container bls-serve is PID 1 (the entrypoint execs it), and otherwise
    # init would reap them when it gets to it.
    if not become_subreaper():
        log.warning("this kernel refused to make bls-serve a child subreaper: init reaps the stubs of a killed "
                    "tritonserver")
    if opts.trace_rate:
        log.warning("request tracing is on (one request in %d): on Triton 2.51 a traced request can abort tritonserver "
                    "(docs/reliability.md, \"Triton 2.51 workarounds\")", opts.trace_rate)
    outcome = None
    try:
        where = opts.model_repository if s3.is_s3(opts.model_repository) else Path(opts.model_repository).resolve()
        print(f"Serving {', '.join(server.loaded)} from {where}")
        for name, why in server.skipped.items():
            print(f"  not loaded: {name} ({why})")
        for name, why in server.failed.items():
            print(f"  FAILED to load: {name} ({first_line(why)}); its callers answer 500 naming it")
        print(f"  HTTP    {server.http_url}\n  gRPC    {server.grpc_url}\n  metrics {server.metrics_url}")
        if server.status_url:
            also = "" if opts.ready_for else ", and every flow loaded later while it is"
            print(f"  status  {server.status_url} (/ready follows {', '.join(server.ready_for)}{also}; /metrics; "
                  "/requests)")
        print(f"  admin APIs ({RESTRICTED_APIS}) need the key {opts.admin_key}: header {ADMIN_HEADER} over HTTP, "
              f"metadata {GRPC_ADMIN_HEADER} over gRPC")
        print("Ctrl-C to stop.", flush=True)
        outcome = _serve(server, stop, args.restart, _Intensity(most=args.max_restarts))
    finally:
        was_serving = server.running()
        code = server.stop()
    report = server.last_stop
    if outcome is not None:
        return outcome
    if not was_serving:  # it had died and was not started again yet: nothing was in flight
        log.info("stopped while tritonserver was down")
        return ExitCode.OK
    if report.hung:
        log.error("tritonserver did not answer at the stop (%s): it was killed with its group (exit code %s)%s; "
                  "bls-serve exits %d", report.reason, code,
                  "" if report.drained else ", requests in flight may have failed", ExitCode.HUNG)
        return ExitCode.HUNG
    if report.held:
        log.warning("tritonserver stopped after a full drain: nothing in flight was lost; it was killed (exit code %s) "
                    "for %s, which Triton kept live with nothing in flight", code, ", ".join(report.held))
        return ExitCode.OK
    if report.stuck:
        log.warning("tritonserver stopped after a full drain: nothing in flight was lost; it was killed (exit code %s) "
                    "for %d model copy(ies) a dead python stub left stuck", code, len(report.stuck))
        return ExitCode.OK
    if not report.drained and code != 0:
        log.error("tritonserver stopped without a full drain (exit code %s; %s): requests in flight may have failed; "
                  "bls-serve exits %d", code, report.reason or "the drain failed", ExitCode.LOST)
        return ExitCode.LOST
    log.info("tritonserver stopped (exit code %s)", code)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
