"""bls-serve's command line reaches the launcher: loopback unless --host says otherwise.

No server starts here: a stand-in launcher records the options and refuses to start, so
bls-serve prints its one-line error and exits 2 (the integration tests start real ones)."""

from __future__ import annotations

import signal

import pytest

from bls_pipeline.serve import server


@pytest.fixture
def launched(monkeypatch) -> list:
    """The ServerOptions each bls-serve run hands to the launcher."""
    seen = []

    class RefusesToStart:
        def __init__(self, options):
            seen.append(options)

        def start(self):
            raise RuntimeError("stand-in launcher")

        def stop(self):
            return None

    monkeypatch.setattr(server, "TritonServer", RefusesToStart)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # bls-serve's Ctrl-C handler stays out of pytest
    return seen


def test_bls_serve_binds_loopback_unless_given_a_host(launched, tmp_path, capsys):
    assert server.main(["--model-repository", str(tmp_path)]) == 2
    assert server.main(["--model-repository", str(tmp_path), "--host", "127.0.0.2", "--http-port", "9000",
                        "--models", "resnet50_onnx,classify_bls", "--admin-key", "k"]) == 2
    default, given = launched
    assert (default.host, default.http_port, default.grpc_port, default.metrics_port) == ("127.0.0.1", 8000, 8001, 8002)
    assert default.models is None and len(default.admin_key) >= 16  # random per run
    assert (given.host, given.http_port, given.models, given.admin_key) == ("127.0.0.2", 9000, ("resnet50_onnx", "classify_bls"), "k")
    assert capsys.readouterr().err.splitlines() == ["bls-serve: error: stand-in launcher"] * 2


def test_the_launcher_defaults_to_loopback(tmp_path):
    options = server.ServerOptions.on_free_ports(tmp_path, None)
    assert options.host == "127.0.0.1"
    assert server.TritonServer(options).http_url.startswith("127.0.0.1:")


def test_start_waits_for_each_endpoint_the_command_line_opens():
    """The readiness poll is on HTTP; Triton opens its metrics port after that, so start()
    also waits for gRPC and metrics, except one that extra arguments turned off."""
    cmd = ["tritonserver", "--http-port=1", "--grpc-port=2", "--metrics-port=3", "--allow-metrics=true"]
    assert server._endpoints(cmd) == {"gRPC": 2, "metrics": 3}
    assert server._endpoints([*cmd, "--allow-metrics=false"]) == {"gRPC": 2}
    assert server._endpoints([*cmd, "--allow-grpc=0", "--allow-metrics=false"]) == {}
