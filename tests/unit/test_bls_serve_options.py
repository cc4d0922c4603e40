"""bls-serve's command line reaches the launcher: loopback unless --host says otherwise; and
how bls-serve restarts a tritonserver that dies on its own.

No server starts here: a stand-in launcher records the options and refuses to start, so
bls-serve prints its one-line error and exits 2, and a stand-in server dies on cue (the
integration tests start real ones: test_crash_recovery.py)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from bls_pipeline.serve import cli, server
from bls_pipeline.serve.argv import endpoints, trace_args, tritonserver_argv
from bls_pipeline.serve.binary import Binary
from bls_pipeline.serve.options import ServerOptions
from bls_pipeline.serve.status import RESTART_CAUSES
from bls_pipeline.serve.tritonlog import LogWatch


@pytest.fixture
def launched(monkeypatch) -> list:
    """The ServerOptions each bls-serve run hands to the launcher."""
    seen = []

    class RefusesToStart:
        def __init__(self, options):
            seen.append(options)

        def start(self, cancel=None):
            raise RuntimeError("stand-in launcher")

        def stop(self):
            return None

    monkeypatch.setattr(cli, "TritonServer", RefusesToStart)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # bls-serve's Ctrl-C handler stays out of pytest
    return seen


def test_bls_serve_binds_loopback_unless_given_a_host(launched, tmp_path, capsys):
    assert cli.main(["--model-repository", str(tmp_path)]) == 2
    assert cli.main(["--model-repository", str(tmp_path), "--host", "127.0.0.2", "--http-port", "9000",
                        "--models", "resnet50_onnx,classify_bls", "--admin-key", "k"]) == 2
    default, given = launched
    assert (default.host, default.http_port, default.grpc_port, default.metrics_port) == ("127.0.0.1", 8000, 8001, 8002)
    assert default.models is None and len(default.admin_key) >= 16  # random per run
    assert ((given.host, given.http_port, given.models, given.admin_key)
            == ("127.0.0.2", 9000, ("resnet50_onnx", "classify_bls"), "k"))
    assert capsys.readouterr().err.splitlines() == ["bls-serve: error: stand-in launcher"] * 2


def test_trace_keeps_tritons_traces_in_the_file(launched, tmp_path):
    assert cli.main(["--model-repository", str(tmp_path), "--trace", str(tmp_path / "trace.json")]) == 2
    assert cli.main(["--model-repository", str(tmp_path)]) == 2
    traced, plain = launched
    assert traced.trace_file == tmp_path / "trace.json" and plain.trace_file is None
    args = trace_args(tmp_path / "trace.json")
    assert args[::2] == ("--trace-config",) * 5
    assert f"triton,file={tmp_path / 'trace.json'}" in args and "rate=1" in args
    assert "level=TIMESTAMPS" in args and "triton,log-frequency=1" in args


def test_bls_serve_serves_what_loads_and_has_a_status_port_unless_told_otherwise(launched, tmp_path):
    assert cli.main(["--model-repository", str(tmp_path)]) == 2
    assert cli.main(["--model-repository", str(tmp_path), "--fail-fast", "--status-port", "0",
                        "--ready-for", "classify_bls,read_text"]) == 2
    default, given = launched
    assert (default.fail_fast, default.status_port, default.ready_for) == (False, 8003, None)
    assert (given.fail_fast, given.status_port, given.ready_for) == (True, None, ("classify_bls", "read_text"))
    assert ServerOptions(tmp_path).fail_fast  # a tool or a test that needs every model: the start fails


def test_the_launcher_defaults_to_loopback(tmp_path):
    options = ServerOptions.on_free_ports(tmp_path, None)
    assert options.host == "127.0.0.1"
    assert server.TritonServer(options).http_url.startswith("127.0.0.1:")


def test_start_waits_for_each_endpoint_the_command_line_opens():
    """The readiness poll is on HTTP; Triton opens its metrics port after that, so start()
    also waits for gRPC and metrics, except one that extra arguments turned off."""
    cmd = ["tritonserver", "--http-port=1", "--grpc-port=2", "--metrics-port=3", "--allow-metrics=true"]
    assert endpoints(cmd) == {"gRPC": 2, "metrics": 3}
    assert endpoints([*cmd, "--allow-metrics=false"]) == {"gRPC": 2}
    assert endpoints([*cmd, "--allow-grpc=0", "--allow-metrics=false"]) == {}


def test_the_tritonserver_command_line_says_what_bls_serve_was_asked(tmp_path):
    """The flags every tritonserver bls-serve starts gets: only the planned models, the
    restricted APIs behind the key on both protocols, no pinned pool without a GPU, the trace
    flags, then the caller's extra arguments, and the embedded binary's backend folder."""
    opts = ServerOptions(tmp_path, host="127.0.0.2", http_port=1, grpc_port=2, metrics_port=3, admin_key="k",
                         exit_timeout_s=7, fail_fast=False, log_verbose=1, extra_args=("--allow-metrics=false",))
    embedded = Binary(tmp_path / "bin" / "tritonserver", tmp_path / "backends", {}, is_embedded=True)
    trace = trace_args(tmp_path / "trace.json", rate=4)
    argv = tritonserver_argv(embedded, opts, tmp_path, ("resnet50_onnx", "classify_bls"), "bls1_ab_", trace=trace)
    assert argv[:5] == [str(tmp_path / "bin" / "tritonserver"), f"--model-repository={tmp_path}",
                        "--model-control-mode=explicit", "--load-model=resnet50_onnx", "--load-model=classify_bls"]
    assert {"--http-address=127.0.0.2", "--http-port=1", "--grpc-address=127.0.0.2", "--grpc-port=2",
            "--metrics-address=127.0.0.2", "--metrics-port=3", "--exit-timeout-secs=7", "--strict-readiness=true",
            "--exit-on-error=false", "--log-verbose=1", "--backend-config=python,shm-region-prefix-name=bls1_ab_",
            "--pinned-memory-pool-byte-size=0", "--metrics-config=summary_latencies=true"} <= set(argv)
    restricted = "model-repository,model-config,shared-memory,trace,logging:triton-admin-key=k"
    assert f"--http-restricted-api={restricted}" in argv and f"--grpc-restricted-protocol={restricted}" in argv
    assert argv[-4:] == [*trace[-2:], "--allow-metrics=false", f"--backend-directory={tmp_path / 'backends'}"]
    assert endpoints(argv) == {"gRPC": 2}  # the extra argument turned the metrics endpoint off
    on_path = Binary(Path("/opt/tritonserver/bin/tritonserver"), None, {}, is_embedded=False)
    plain = tritonserver_argv(on_path, ServerOptions(tmp_path), "s3://bucket/models", ("m",), "p_", gpu=True)
    assert plain[1] == "--model-repository=s3://bucket/models" and "--exit-on-error=true" in plain
    assert (not any(a.startswith(("--pinned-memory-pool-byte-size", "--trace-config", "--backend-directory"))
                    for a in plain))


# ---- a tritonserver that dies on its own ---------------------------------------------------------

def test_restart_backoff_doubles_to_30_s_and_starts_over_after_a_stable_minute():
    backoff = cli._Backoff()
    assert [backoff.delay(uptime_s=5) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.delay(uptime_s=60) == 1 and backoff.delay(uptime_s=0) == 2


def test_exit_cause_names_the_signal():
    assert cli._exit_cause(-signal.SIGSEGV) == "died of SIGSEGV"
    assert cli._exit_cause(-signal.SIGKILL) == "died of SIGKILL"
    assert cli._exit_cause(1) == "exited with code 1"


def test_restart_is_on_unless_no_restart(tmp_path):
    assert cli._parse_args(["--model-repository", str(tmp_path)]).restart is True
    assert cli._parse_args(["--model-repository", str(tmp_path), "--no-restart"]).restart is False


class DiesOnItsOwn:
    """A stand-in TritonServer: dies of SIGSEGV (or, with `hangs`, stops answering) at each of
    `deaths` starts, the first restart fails to start, then it serves until `stop` is set."""

    def __init__(self, stop, deaths: int, hangs: bool = False, serves_after: bool = True):
        self.stop_event, self.deaths, self.restarts, self.stops, self.kills = stop, deaths, 0, [], 0
        self.loaded, self.returncode, self.uptime_s = ("classify_bls",), -signal.SIGSEGV, 2.0
        self.failed_once, self.hangs, self.serves_after = False, hangs, serves_after
        self.hung = "no answer over HTTP for 8.0 s (timed out)" if hangs and deaths else None
        self.woken = threading.Event()
        self.restart_causes = dict.fromkeys(RESTART_CAUSES, 0)
        self.condition = None
        self.log_watch = LogWatch()

    def running(self) -> bool:
        return self.deaths == 0 or self.hangs

    def kill(self):
        self.kills += 1

    def stop(self, final=True):
        self.stops.append(final)

    def restart(self, cancel):
        assert cancel is self.stop_event
        self.restarts += 1
        if not self.failed_once:
            self.failed_once = True
            raise RuntimeError("tritonserver exited with code 1 before it was ready")
        if self.serves_after:
            self.deaths -= 1
        self.hung = "no answer over HTTP for 8.0 s (timed out)" if self.hangs and self.deaths else None
        if self.deaths == 0:
            threading.Timer(0.3, self.stop_event.set).start()  # serving: then bls-serve is stopped


@pytest.fixture
def quick_backoff(monkeypatch):
    backoff = cli._Backoff
    monkeypatch.setattr(cli, "_Backoff", lambda: backoff(first_s=0.01, cap_s=0.04))


def test_bls_serve_restarts_a_server_that_died_until_it_serves(quick_backoff, caplog):
    stop = threading.Event()
    fake = DiesOnItsOwn(stop, deaths=2)
    caplog.set_level("INFO")
    assert cli._serve(fake, stop, restart=True) is None  # stopped
    assert fake.restarts == 3 and fake.stops == [False, False]  # restart 1 failed; what each death left is cleared
    assert fake.restart_causes == {"crashed": 2, "exited": 0, "hung": 0, "start_failed": 1}
    deaths = [r.getMessage() for r in caplog.records if "not on a stop" in r.getMessage()]
    assert len(deaths) == 3 and all("the requests in flight were lost" in m for m in deaths)
    assert (deaths[0].startswith("tritonserver died of SIGSEGV after 2 s serving")
            and "(restart 1, BLS_SERVER_RESTARTS=1)" in deaths[0])
    assert "could not be started again (tritonserver exited with code 1 before it was ready)" in deaths[1]
    restarted = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tritonserver restarted")]
    assert [m.split(":")[0] for m in restarted] == ["tritonserver restarted (restart 2, BLS_SERVER_RESTARTS=2)",
                                                    "tritonserver restarted (restart 3, BLS_SERVER_RESTARTS=3)"]


def test_a_server_that_hangs_is_killed_and_restarted_with_its_cause(quick_backoff, caplog):
    stop = threading.Event()
    fake = DiesOnItsOwn(stop, deaths=1, hangs=True)
    caplog.set_level("INFO")
    assert cli._serve(fake, stop, restart=True) is None
    assert fake.kills == 1 and fake.restarts == 2
    assert fake.restart_causes == {"crashed": 0, "exited": 0, "hung": 1, "start_failed": 1}
    assert ("tritonserver did not answer (no answer over HTTP for 8.0 s (timed out)) and was killed with its "
            "group" in caplog.text)
    assert "tritonserver restarted (restart 2, BLS_SERVER_RESTARTS=2): serving classify_bls again" in caplog.text


def test_a_restart_loop_backs_off_and_gives_up_visibly(quick_backoff, caplog):
    stop = threading.Event()
    fake = DiesOnItsOwn(stop, deaths=1, serves_after=False)  # every restart fails to start, or dies again
    code = cli._serve(fake, stop, restart=True, intensity=cli._Intensity(most=3, window_s=600))
    assert code == cli.ExitCode.GAVE_UP == 4
    assert fake.restarts == 3 and sum(fake.restart_causes.values()) == 3
    assert fake.condition.startswith("bls-serve gave up: tritonserver ended 3 times within 600 s")
    assert "bls-serve exits 4 (restarts by cause: crashed 2, exited 0, hung 0, start_failed 1)" in caplog.text


def test_restart_intensity_counts_only_the_window():
    intensity = cli._Intensity(most=2, window_s=10)
    assert intensity.allow(0) and intensity.allow(1) and not intensity.allow(2)
    assert intensity.allow(11.5)  # the first two are out of the window
    assert cli._Intensity(most=0).allow(0)  # 0: never gives up


def test_no_restart_exits_1_when_the_server_dies(quick_backoff, caplog):
    stop = threading.Event()
    fake = DiesOnItsOwn(stop, deaths=1)
    assert cli._serve(fake, stop, restart=False) == 1
    assert fake.restarts == 0 and fake.stops == [False]
    assert ("tritonserver died of SIGSEGV after 2 s serving, not on a stop" in caplog.text
            and "--no-restart" in caplog.text)


def test_a_stop_during_the_backoff_ends_bls_serve_at_once(monkeypatch):
    backoff = cli._Backoff
    monkeypatch.setattr(cli, "_Backoff", lambda: backoff(first_s=60))
    stop = threading.Event()
    fake = DiesOnItsOwn(stop, deaths=1)
    threading.Timer(0.3, stop.set).start()
    began = time.monotonic()
    assert cli._serve(fake, stop, restart=True) is None
    assert time.monotonic() - began < 30 and fake.restarts == 0


def test_a_random_admin_key_reads_as_a_value_on_any_command_line(tmp_path):
    """bls-rollout --admin-key KEY: a key beginning with "-" would read as an option (one in
    64 of token_urlsafe's did, and the rollout tests failed on it)."""
    from bls_pipeline.serve.rollout import main as rollout_main

    keys = {ServerOptions(tmp_path).admin_key for _ in range(2000)}
    assert len(keys) == 2000 and all(len(k) == 32 and k.isalnum() for k in keys)
    with pytest.raises(SystemExit) as refused:
        rollout_main(["m", "2", "--admin-key", "-" + next(iter(keys))[1:]])
    assert refused.value.code == 2  # what a urlsafe key could do
