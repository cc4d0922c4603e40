"""What a TritonServer is started with (ServerOptions), and the ports it takes: a free one for
a throwaway server, a check that nothing listens on them yet, and whether one listens now.
"""

from __future__ import annotations

import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServerOptions", "check_ports_free", "free_port", "listening"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerOptions:
    model_repository: Path | str  # a folder, or an S3 address (s3://bucket/path, s3://host:port/bucket/path)
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    models: tuple[str, ...] | None = None  # None: every model whose parts are present; else these and what they call
    exclude: dict[str, str] = field(default_factory=dict)  # models not to load: {name: why}
    exclude_baselines: bool = False  # also leave out the bench baselines that `models` does not need (bls-serve)
    # Hex: a key that begins with "-" (1 in 64 of token_urlsafe's) reads as an option to
    # `bls-rollout --admin-key KEY` and the other commands that take it.
    admin_key: str = field(default_factory=lambda: secrets.token_hex(16))
    exit_timeout_s: int = 20
    startup_timeout_s: float = 180.0
    log_verbose: int = 0
    log_file: Path | None = None  # None: inherit stderr
    extra_args: tuple[str, ...] = ()
    # Probe python models with real inference and reload one whose stub died (0: off).
    watchdog_interval_s: float = 0.0
    # The Python whose environment the python models run in (its bin goes first on PATH),
    # of this one's version; None: this one. A model with EXECUTION_ENV_PATH runs in that instead.
    python: Path | None = None
    # A model that fails its load, or whose config.pbtxt does not read: True, the start fails
    # (tritonserver exits, or is not started: what a tool or a test that needs every model
    # wants); False, it is named (failed) and the others serve.
    fail_fast: bool = True
    # bls-serve's own endpoint on this port (status.py): readiness of `ready_for`, latency
    # histograms from Triton's traces, the recent requests explained; None: none.
    status_port: int | None = None
    # The models /ready follows; None: those asked for (`models`), else every flow that loaded
    # at start, and (both) every flow READY now, one loaded later included.
    ready_for: tuple[str, ...] | None = None
    # Triton's request tracing (workarounds.py, "tracing abort": on 2.51 any traced request can
    # abort tritonserver): 0, off; N, one request in N traced, into `trace_file` (FILE.0,
    # FILE.1, ... kept), else (with a status port) into a folder of its own, each removed once
    # read; a trace_file alone traces every request.
    trace_rate: int = 0
    trace_file: Path | None = None
    # Seconds tritonserver may go without answering its liveness endpoint (HTTP or gRPC) before
    # `hung` is set and on_hung called (bls-serve kills and restarts it); 0: not watched.
    hang_timeout_s: float = 0.0
    # tritonserver gets SIGKILL when the thread that started it ends (bls-serve's main thread:
    # a bls-serve killed takes it along). Off for a library user, whose thread may end first.
    die_with_parent: bool = False

    @classmethod
    def on_free_ports(cls, model_repository: Path, log_file: Path | None, **kwargs) -> "ServerOptions":
        """Loopback on three free ports: a throwaway server for a tool (bls-bench, bls-demo...) or a test."""
        return cls(model_repository, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                   log_file=log_file, **kwargs)


def check_ports_free(opts: ServerOptions, status: bool = True) -> None:
    """Fail at once, naming the port, when something already listens there (another Triton
    would otherwise answer our readiness poll and we would serve nothing)."""
    ports = [("HTTP", opts.http_port), ("gRPC", opts.grpc_port), ("metrics", opts.metrics_port)]
    for what, port in ports + ([("status", opts.status_port)] if opts.status_port and status else []):
        with socket.socket(socket.AF_INET6 if ":" in opts.host else socket.AF_INET, socket.SOCK_STREAM) as s:
            # as tritonserver binds: a listener is a clash, TIME_WAIT is not
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((opts.host, port))
            except OSError as exc:
                raise RuntimeError(f"{what} port {port} on {opts.host} is taken ({exc.strerror}): stop what uses it, "
                                   f"or pick another with --{what.lower()}-port") from None


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False
