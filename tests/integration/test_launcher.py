"""The launcher itself: what loads, locked-down defaults, clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bls_pipeline.serve import server as server_module
from bls_pipeline.serve.server import SHM_PREFIX, ServerOptions, TritonServer, _kill_group as kill_group, free_port

pytestmark = pytest.mark.integration


def test_loads_only_models_with_their_parts(server):
    shipped = {"classify_bls", "triage_bls", "image_quality", "resnet50_onnx", "efficientnet_lite0_onnx", "ensemble_resnet50", "ensemble_preprocess",
               "ensemble_postprocess"}
    assert shipped <= set(server.loaded)
    assert set(server.loaded) - shipped == {m for m in server.loaded if m.startswith("classify_bls_")}  # test variants
    assert set(server.skipped) == {"resnet50_trt", "efficientnet_lite0_trt"}
    assert "TensorRT" in server.skipped["resnet50_trt"]
    assert "TensorRT" in server.skipped["efficientnet_lite0_trt"]


def test_missing_onnx_is_skipped_with_the_export_hint(tmp_path, repo_root):
    from bls_pipeline.serve.repository import plan_loading

    plan = plan_loading(repo_root / "models", {"python"})
    if (repo_root / "models" / "resnet50_onnx" / "1" / "model.onnx").exists():
        assert "resnet50_onnx" in plan.load
    else:
        assert "engine_build export" in plan.skipped["resnet50_onnx"]


def test_binds_loopback_and_restricts_admin_apis(server):
    assert server.options.host == "127.0.0.1"
    url = f"http://{server.http_url}/v2/repository/index"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(url, data=b"{}", method="POST"), timeout=5)
    assert err.value.code in (401, 403)
    req = urllib.request.Request(url, data=b"{}", method="POST", headers=server.admin_headers)
    with urllib.request.urlopen(req, timeout=5) as r:
        assert b"classify_bls" in r.read()


def test_stop_leaves_no_process_or_shared_memory(model_repo, tmp_path, server_factory):
    srv = server_factory(model_repo, tmp_path, models=("resnet50_onnx",))
    pid, prefix = srv.pid, srv.shm_prefix
    assert any(p.name.startswith(prefix) for p in Path("/dev/shm").iterdir())
    srv.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole process group (server and python stubs) is gone
    assert not [p for p in Path("/dev/shm").iterdir() if p.name.startswith(prefix)]
    assert prefix.startswith(SHM_PREFIX)


def test_a_server_that_ignores_sigterm_is_killed_with_its_group(tmp_path, caplog, monkeypatch):
    """The launcher's last resort, with a stand-in process that ignores SIGTERM."""

    def kill_and_let_it_die(pgid):  # a loaded CI machine: the kill lands before the launcher looks again
        kill_group(pgid)
        time.sleep(0.3)

    monkeypatch.setattr(server_module, "_kill_group", kill_and_let_it_die)
    srv = TritonServer(ServerOptions(tmp_path, http_port=free_port(), exit_timeout_s=1, log_file=tmp_path / "server.log"))
    stubborn = "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); subprocess.Popen(['sleep', '300']); time.sleep(300)"
    srv._proc = subprocess.Popen([sys.executable, "-c", stubborn], start_new_session=True)
    pid = srv._proc.pid
    time.sleep(0.5)  # let it install its handler and start its child
    code = srv.stop()
    assert code == -signal.SIGKILL and srv.last_stop.drained is False  # nothing answered the drain
    deadline = time.monotonic() + 5  # its orphaned child is reaped by init
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # its child went with it
    assert "did not exit within 6s of SIGTERM" in caplog.text
