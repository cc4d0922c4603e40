"""tritonserver's command line, from what bls-serve was asked: pure functions over the
options, so a unit test reads the flags a server gets without starting one."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .admin import ADMIN_HEADER
from .binary import Binary
from .options import ServerOptions

__all__ = ["GRPC_ADMIN_HEADER", "RESTRICTED_APIS", "endpoints", "trace_args", "tritonserver_argv"]

# Over gRPC, Triton looks for the key under the protocol-prefixed metadata name.
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"
# APIs a client never needs for inference, behind the key (docs/deploy.md, "What the admin
# key guards"): the writes (loading and unloading models, mapping shared memory, changing the
# trace and log settings) and reading a model's full config (instances, queue limits, file
# names, settings). Metadata, inference, statistics and health stay open: perf_analyzer and
# Model Analyzer read the config, so they take the key (-H).
RESTRICTED_APIS = "model-repository,model-config,shared-memory,trace,logging"


def tritonserver_argv(binary: Binary, opts: ServerOptions, repository: Path | str, load: Sequence[str],
                      shm_prefix: str, trace: Sequence[str] = (), gpu: bool = False) -> list[str]:
    """The command that starts `binary` on `repository` (a folder, or an S3 address), loading
    `load` and nothing else, on the options' addresses and ports, with the restricted APIs
    behind the admin key, the python stubs' shared memory named by `shm_prefix`, the tracing
    flags `trace` (trace_args) and the options' extra_args last. gpu: the machine has one
    (pinned staging memory is kept)."""
    argv = [
        str(binary.executable),
        f"--model-repository={repository}",
        "--model-control-mode=explicit",
        *[f"--load-model={name}" for name in load],
        f"--http-address={opts.host}", f"--http-port={opts.http_port}",
        f"--grpc-address={opts.host}", f"--grpc-port={opts.grpc_port}",
        f"--metrics-address={opts.host}", f"--metrics-port={opts.metrics_port}",
        "--allow-metrics=true", "--allow-gpu-metrics=false",
        # Every request's latency and queue time, as quantiles over the last minute, measured
        # by Triton with no tracing (nv_inference_request_summary_us, ..._queue_summary_us).
        "--metrics-config=summary_latencies=true",
        f"--http-restricted-api={RESTRICTED_APIS}:{ADMIN_HEADER}={opts.admin_key}",
        f"--grpc-restricted-protocol={RESTRICTED_APIS}:{ADMIN_HEADER}={opts.admin_key}",
        f"--exit-timeout-secs={opts.exit_timeout_s}",
        "--strict-readiness=true",
        # A failed load: tritonserver exits (fail fast), or serves the other models.
        f"--exit-on-error={'true' if opts.fail_fast else 'false'}",
        f"--log-verbose={opts.log_verbose}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        # Pinned (page-locked) staging memory only helps host<->GPU copies; without a GPU
        # its 256 MB pool just fills up under load and shows as resident memory.
        *([] if gpu else ["--pinned-memory-pool-byte-size=0"]),
        *trace,
        *opts.extra_args,
    ]
    if binary.backend_dir is not None:
        argv.append(f"--backend-directory={binary.backend_dir}")
    return argv


def endpoints(argv: Sequence[str]) -> dict[str, int]:
    """The gRPC and metrics ports the command line opens (the last --allow-X flag wins, as in
    tritonserver; extra_args may turn one off)."""
    flags = dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)
    return {what: int(flags[f"{flag}-port"]) for what, flag in (("gRPC", "grpc"), ("metrics", "metrics"))
            if flags.get(f"allow-{flag}", "true").lower() not in ("false", "0", "no", "off")
            and f"{flag}-port" in flags}


def trace_args(file: Path, rate: int = 1) -> tuple[str, ...]:
    """tritonserver's flags to trace one request in `rate` into `file` (written a trace at a
    time, as FILE.0, FILE.1, ...). On Triton 2.51 any traced request can abort tritonserver
    (workarounds.py, "tracing abort"): bls-serve passes them only when asked to."""
    return ("--trace-config", f"triton,file={Path(file).resolve()}", "--trace-config", "triton,log-frequency=1",
            "--trace-config", f"rate={rate}", "--trace-config", "level=TIMESTAMPS", "--trace-config", "count=-1")
