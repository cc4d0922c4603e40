"""bls-serve's status port (serve/status.py) on a real socket, with the model states and what
bls-serve knows of tritonserver set by the test: every counter there at 0 from the start, for
every label value; /ready and /metrics answer from what was last seen, never waiting on a
tritonserver (here: a port that accepts and never answers)."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import pytest

from bls_pipeline.serve.status import RESTART_CAUSES, ServerState, StatusServer
from bls_pipeline.serve.tritonlog import LoadFailure


class States:
    def __init__(self, states):
        self.states = states

    def refresh(self):
        time.sleep(30)  # a tritonserver that hangs: the status port's own thread waits, nobody else

    def failed(self):
        return {m: e["reason"] for m, e in self.states.items() if e["state"] == "UNAVAILABLE" and e["reason"]}

    def ready(self):
        return [m for m, e in self.states.items() if e["state"] == "READY"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def port(tmp_path):
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(16)
    state = {"now": ServerState(known=("classify_bls", "resnet50_onnx"))}
    states = States({"classify_bls": {"state": "READY", "reason": ""},
                     "resnet50_onnx": {"state": "READY", "reason": ""}})
    status = StatusServer("127.0.0.1", _free_port(), states, f"127.0.0.1:{mute.getsockname()[1]}", None, True,
                          tmp_path / "executions.sock", ready_for=("classify_bls",), server=lambda: state["now"])
    status.start()
    status.serving = True
    yield f"http://127.0.0.1:{status.port}", state, states
    status.stop()
    mute.close()


def test_every_counter_is_there_at_0_from_the_start(port):
    url, _, _ = port
    began = time.monotonic()
    code, text = _get(f"{url}/metrics")
    assert code == 200 and time.monotonic() - began < 2.0
    for cause in RESTART_CAUSES:
        assert f'bls_tritonserver_restarts_total{{cause="{cause}"}} 0' in text
    for model in ("classify_bls", "resnet50_onnx"):
        for family in ("bls_model_load_failures_total", "bls_watchdog_reloads_total", "bls_model_load_failed"):
            assert f'{family}{{model="{model}"}} 0' in text
    assert "bls_request_duration_seconds" not in text  # tracing off: no histogram that would count nothing


def test_ready_answers_at_once_and_says_what_bls_serve_does_about_tritonserver(port):
    url, state, _ = port
    assert _get(f"{url}/ready") == (200, "ready: classify_bls\n")
    state["now"] = ServerState(condition="tritonserver is not answering: HTTP liveness unanswered for 4 s (timed out)")
    began = time.monotonic()
    assert _get(f"{url}/ready") == (503, "not ready: tritonserver is not answering: HTTP liveness unanswered for 4 s "
                                         "(timed out)\n")
    assert time.monotonic() - began < 2.0


def test_a_failed_reload_beside_a_serving_copy_shows_and_ready_stays(port):
    url, state, _ = port
    failure = LoadFailure("resnet50_onnx", "1", "Internal: INVALID_PROTOBUF", 0.0)
    state["now"] = ServerState(known=("classify_bls", "resnet50_onnx"), load_failing={"resnet50_onnx": failure},
                               load_failures={"resnet50_onnx": 1},
                               restarts={**dict.fromkeys(RESTART_CAUSES, 0), "hung": 2})
    text = _get(f"{url}/metrics")[1]
    assert 'bls_model_load_failed{model="resnet50_onnx"} 1' in text
    assert 'bls_model_load_failures_total{model="resnet50_onnx"} 1' in text
    assert 'bls_tritonserver_restarts_total{cause="hung"} 2' in text
    code, ready = _get(f"{url}/ready")
    assert (code == 200
            and "resnet50_onnx (its last load failed, its serving copy answers: Internal: INVALID_PROTOBUF)" in ready)


def test_a_model_not_ready_is_named_from_the_states_last_seen(port):
    url, _, states = port
    states.states["classify_bls"] = {"state": "UNAVAILABLE", "reason": "unloaded"}
    assert _get(f"{url}/ready") == (503, "not ready: classify_bls UNAVAILABLE (unloaded)\n")


def test_requests_say_tracing_is_off(port):
    url, _, _ = port
    code, text = _get(f"{url}/requests?slowest=1")
    assert code == 409 and "--trace-rate N" in text
