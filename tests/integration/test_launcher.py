"""The launcher itself: what loads, locked-down defaults, clean stop."""

from __future__ import annotations

import ipaddress
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from bls_pipeline.serve import stopping
from bls_pipeline.serve.admin import ADMIN_HEADER
from bls_pipeline.serve.processes import SHM_PREFIX
from bls_pipeline.serve.repository import Repository
from bls_pipeline.serve.argv import GRPC_ADMIN_HEADER
from bls_pipeline.serve.server import TritonServer
from bls_pipeline.serve.stopping import kill_group
from bls_pipeline.serve.options import ServerOptions, free_port

pytestmark = pytest.mark.integration

# The models every machine loads from the test repository (python backend, artifacts exported
# by the fixtures), whatever else it has: TensorRT, a GPU, models that need them.
CPU_MODELS = {"classify_bls", "triage_bls", "image_quality", "resnet50_onnx", "efficientnet_lite0_onnx",
              "ensemble_resnet50", "ensemble_preprocess", "ensemble_postprocess"}
HTTP_REFUSAL = {"error": f"This API is restricted, expecting header '{ADMIN_HEADER}'"}
GRPC_REFUSAL = f"This protocol is restricted, expecting header '{GRPC_ADMIN_HEADER}'"


# ---- reading the socket table ----------------------------------------------------------------

def _address(hex_address: str) -> str:
    """An address of /proc/net/tcp or tcp6 (32-bit words in host byte order) as text."""
    raw = bytes.fromhex(hex_address)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    return str(ip.ipv4_mapped or ip) if ip.version == 6 else str(ip)


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket process `pid` holds, from the kernel's
    socket tables: nothing is sent anywhere."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: TCP_LISTEN
                address, port = local.rsplit(":", 1)
                found.add((_address(address), int(port, 16)))
    return found


def _ports(options: ServerOptions) -> tuple[int, int, int]:
    return options.http_port, options.grpc_port, options.metrics_port


# ---- what loads ------------------------------------------------------------------------------

def _ready_models(server) -> set[str]:
    req = urllib.request.Request(f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST",
                                 headers=server.admin_headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return {m["name"] for m in json.loads(r.read()) if m.get("state") == "READY"}


def test_loads_every_model_whose_parts_are_present(server):
    """The same assertions here, in a clean clone and in an NGC image with TensorRT: what a
    machine cannot load (TensorRT plans, GPU-only models) is skipped with a reason, and
    everything else is READY."""
    repo = Repository.read(server.options.model_repository)
    variants = {name for name in repo.configs if name.startswith("classify_bls_")}
    assert variants and CPU_MODELS | variants <= set(server.loaded)
    assert set(server.loaded) | set(server.skipped) == set(repo.configs)
    assert not set(server.loaded) & set(server.skipped)
    assert all(why.strip() for why in server.skipped.values()), server.skipped
    assert "resnet50_trt" in server.skipped  # the test repository never holds a plan
    assert _ready_models(server) == set(server.loaded)


# ---- locked down by default --------------------------------------------------------------------

def test_every_port_listens_on_loopback_only(server):
    assert listening(server.pid) == {("127.0.0.1", port) for port in _ports(server.options)}


def _http_admin(server, api: str, headers: dict[str, str]):
    """One call of an admin API over HTTP: (status, decoded JSON body)."""
    method, path = {"repository": ("POST", "/v2/repository/index"),
                    "model-config": ("GET", "/v2/models/resnet50_onnx/config"),
                    "system-shared-memory": ("GET", "/v2/systemsharedmemory/status"),
                    "cuda-shared-memory": ("GET", "/v2/cudasharedmemory/status"),
                    # the settings' writes, changing nothing ({}): they answer the settings
                    "trace": ("POST", "/v2/trace/setting"),
                    "logging": ("POST", "/v2/logging")}[api]
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=b"{}" if method == "POST" else None,
                                 method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _grpc_admin(server, api: str, headers: dict[str, str]):
    """One call of an admin API over gRPC: its answer as JSON, or the InferenceServerException."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        call = {"repository": lambda: client.get_model_repository_index(headers=headers, as_json=True),
                "model-config": lambda: client.get_model_config("resnet50_onnx", headers=headers, as_json=True),
                "system-shared-memory": lambda: client.get_system_shared_memory_status(headers=headers, as_json=True),
                "cuda-shared-memory": lambda: client.get_cuda_shared_memory_status(headers=headers, as_json=True),
                "trace": lambda: client.update_trace_settings(settings={}, headers=headers, as_json=True),
                "logging": lambda: client.update_log_settings({}, headers=headers, as_json=True)}[api]
        try:
            return call()
        except InferenceServerException as exc:
            return exc
    finally:
        client.close()


ADMIN_APIS = ("repository", "model-config", "system-shared-memory", "cuda-shared-memory", "trace", "logging")


def _allowed_answer(api: str, answer) -> bool:
    if api == "repository":
        names = [m["name"] for m in (answer["models"] if isinstance(answer, dict) else answer)]
        return "classify_bls" in names
    if api == "model-config":
        return (answer.get("config", answer))["name"] == "resnet50_onnx"
    if api in ("trace", "logging"):
        return ("trace_level" if api == "trace" else "log_verbose_level") in answer.get("settings", answer)
    return answer in ([], {}, {"regions": {}})  # no region registered


@pytest.mark.parametrize("api", ADMIN_APIS)
def test_http_admin_apis_need_the_key(server, api):
    key = server.options.admin_key
    for headers in ({}, {ADMIN_HEADER: "not-the-key"}, {GRPC_ADMIN_HEADER: key}):
        assert _http_admin(server, api, headers) == (403, HTTP_REFUSAL), headers
    status, answer = _http_admin(server, api, {ADMIN_HEADER: key})
    assert status == 200 and _allowed_answer(api, answer), answer


@pytest.mark.parametrize("api", ADMIN_APIS)
def test_grpc_admin_apis_need_the_key(server, api):
    key = server.options.admin_key
    for headers in ({}, {GRPC_ADMIN_HEADER: "not-the-key"}, {ADMIN_HEADER: key}):
        refused = _grpc_admin(server, api, headers)
        assert isinstance(refused, InferenceServerException), f"{api} answered without the key ({headers}): {refused}"
        assert (refused.status(), refused.message()) == ("StatusCode.UNAVAILABLE", GRPC_REFUSAL), headers
    answer = _grpc_admin(server, api, server.admin_headers_for("grpc"))  # the launcher's own name for it
    assert not isinstance(answer, Exception) and _allowed_answer(api, answer), answer


def test_inference_apis_need_no_key(server):
    """Metadata (names, tensors, shapes), inference, readiness and statistics: what a client
    and a measuring tool read without the key."""
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/resnet50_onnx", timeout=10) as r:
        assert json.loads(r.read())["name"] == "resnet50_onnx"
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/resnet50_onnx/stats", timeout=10) as r:
        assert json.loads(r.read())["model_stats"][0]["name"] == "resnet50_onnx"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert client.get_model_metadata("resnet50_onnx", as_json=True)["name"] == "resnet50_onnx"
        assert client.is_model_ready("classify_bls")
        assert (client.get_inference_statistics("resnet50_onnx", as_json=True)["model_stats"][0]["name"]
                == "resnet50_onnx")
    finally:
        client.close()


# ---- bls-serve ---------------------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _read_lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)
    into.put(None)


def test_bls_serve_binds_the_host_it_is_given_and_ctrl_c_leaves_nothing(model_repo):
    """--host 127.0.0.2 (loopback too: nothing leaves the machine) reaches all three listeners;
    Ctrl-C drains and stops, leaving no tritonserver, stub or /dev/shm region."""
    host, ports = "127.0.0.2", (free_port(), free_port(), free_port())
    cmd = [sys.executable, "-c", "import sys; from bls_pipeline.serve.cli import main; sys.exit(main())",
           "--model-repository", str(model_repo), "--models", "resnet50_onnx", "--host", host,
           "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
           "--status-port", str(free_port()), "--watchdog-interval", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    out, triton = [], None
    try:
        deadline = time.monotonic() + 180
        while not out or out[-1] != "Ctrl-C to stop.\n":
            line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
            assert line is not None, "bls-serve exited before serving:\n" + "".join(out)
            out.append(line)
        (triton,) = [c for c in _children(proc.pid) if Path(f"/proc/{c}/comm").read_text().strip() == "tritonserver"]
        assert listening(triton) == {(host, port) for port in ports}
        assert f"  HTTP    {host}:{ports[0]}\n" in out and f"  gRPC    {host}:{ports[1]}\n" in out
        shm_prefix = f"{SHM_PREFIX}bls{proc.pid}_"
        assert [p for p in Path("/dev/shm").iterdir() if p.name.startswith(shm_prefix)]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, "".join(out)
        with pytest.raises(ProcessLookupError):
            os.killpg(triton, 0)  # tritonserver's group: the server and its python stubs
        assert not [p for p in Path("/dev/shm").iterdir() if p.name.startswith(shm_prefix)]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if triton is not None:
            kill_group(triton)


def test_a_server_that_ignores_sigterm_is_killed_with_its_group(tmp_path, caplog, monkeypatch):
    """The launcher's last resort, with a stand-in process that ignores SIGTERM."""

    def kill_and_let_it_die(pgid):  # a loaded CI machine: the kill lands before the launcher looks again
        kill_group(pgid)
        time.sleep(0.3)

    monkeypatch.setattr(stopping, "kill_group", kill_and_let_it_die)
    srv = TritonServer(ServerOptions(tmp_path, http_port=free_port(), exit_timeout_s=0,
                                     log_file=tmp_path / "server.log"))
    stubborn = ("import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "subprocess.Popen(['sleep', '300']); print('ready', flush=True); time.sleep(300)")
    srv._proc = subprocess.Popen([sys.executable, "-c", stubborn], start_new_session=True, stdout=subprocess.PIPE)
    pid = srv._proc.pid
    assert srv._proc.stdout.readline() == b"ready\n"  # its handler is in and its child started
    srv._proc.stdout.close()
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
    assert "tritonserver did not exit after SIGTERM" in caplog.text and srv.last_stop.hung
