"""A model folder whose config.pbtxt does not parse, beside the shipped models (issue 42: it
made bls-serve exit 1 with a traceback naming neither the file nor the model, even with
--models leaving it out, and left a bls-triton-* folder behind each time).

bls-serve as a process, on a real tritonserver: it names the file and the reason in one
line, reports the model as a failed load (its output, the status port's gauge), serves the
rest (classify_bls answers, /ready follows it), and leaves no temporary folder; with
--fail-fast it exits 2 in one line instead."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bls_pipeline.serve.client import tritonclient_module
from bls_pipeline.serve.options import free_port

from polling import get

pytestmark = pytest.mark.integration

BROKEN = "broken"
UNPARSABLE = f'name: "{BROKEN}"\nbackend: "python"\nmax_batch_size: 64 {{\n'  # what the operator wrote


@pytest.fixture(scope="module")
def repo(repo_root, onnx_model, effnet_onnx_model, place_exports, tmp_path_factory) -> Path:
    """The shipped models (classify_bls's two ONNX classifiers exported), and `broken`."""
    repo = tmp_path_factory.mktemp("broken-folder") / "models"
    shutil.copytree(repo_root / "models", repo, ignore=shutil.ignore_patterns(
        "*.onnx", "*.onnx.data", "*.onnx.json", "*.plan", "*.xml", "*.bin", "*.xml.json", "__pycache__"))
    place_exports(repo, {"resnet50_onnx": onnx_model, "efficientnet_lite0_onnx": effnet_onnx_model})
    (repo / BROKEN / "1").mkdir(parents=True)
    (repo / BROKEN / "config.pbtxt").write_text(UNPARSABLE)
    return repo


def _bls_serve(repo: Path, temp: Path, ports: list[int], *args: str) -> subprocess.Popen:
    temp.mkdir(exist_ok=True)
    return subprocess.Popen([str(Path(sys.executable).parent / "bls-serve"), "--model-repository", str(repo),
                             "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port",
                             str(ports[2]), "--status-port", str(ports[3]), "--watchdog-interval", "0", *args],
                            env={**os.environ, "TMPDIR": str(temp)},  # where its bls-triton-* folder goes
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _until_serving(proc: subprocess.Popen, timeout_s: float = 240.0) -> str:
    """bls-serve's output up to "Ctrl-C to stop." (failing with what it wrote if it exits first)."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout] + [lines.put(None)], daemon=True).start()
    out, deadline = [], time.monotonic() + timeout_s
    while not out or out[-1] != "Ctrl-C to stop.\n":
        line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
        assert line is not None, "bls-serve exited before serving:\n" + "".join(out)
        out.append(line)
    return "".join(out)


def _classify(http_port: int, image: bytes) -> np.ndarray:
    tc = tritonclient_module("http")
    client = tc.InferenceServerClient(f"127.0.0.1:{http_port}")
    try:
        inp = tc.InferInput("IMAGE", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[image]], dtype=object))
        return client.infer("classify_bls", [inp]).as_numpy("LABELS")
    finally:
        client.close()


@pytest.fixture
def temp():
    """bls-serve's TMPDIR, short: its status socket lives in its bls-triton-* folder there, and a
    UNIX socket's path has at most 107 bytes (pytest-xdist's tmp_path is too long for it)."""
    folder = Path(tempfile.mkdtemp(prefix="bls-bf-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_rest_serve_the_file_is_named_in_one_line_and_no_temporary_folder_is_left(repo, temp, sample_images):
    path = repo / BROKEN / "config.pbtxt"
    why = f"{path}:3:20: 'max_batch_size: 64 {{': Expected identifier or number, got {{."
    ports = [free_port() for _ in range(4)]
    proc = _bls_serve(repo, temp, ports, "--models", f"classify_bls,{BROKEN}", "--ready-for", "classify_bls")
    try:
        text = _until_serving(proc)
        assert "Traceback" not in text, text
        assert re.search(r"^Serving .*\bclassify_bls\b", text, re.M), text
        logged = [ln for ln in text.splitlines() if str(path) in ln and "FAILED to load" in ln and "ERROR" in ln]
        assert (len(logged) == 1
                and logged[0].endswith(f"{BROKEN} FAILED to load, serving the others without it: {why}")), text
        assert f"  FAILED to load: {BROKEN} ({why})" in text
        labels = _classify(ports[0], sample_images["mug"])
        assert labels.shape[0] == 1 and labels[0][0]  # a real answer, with a label
        assert get(f"http://127.0.0.1:{ports[3]}/ready")[0] == 200
        assert f'bls_model_load_failed{{model="{BROKEN}"}} 1' in get(f"http://127.0.0.1:{ports[3]}/metrics")[1]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not [p.name for p in temp.iterdir() if p.name.startswith("bls-triton-")]


def test_with_fail_fast_it_exits_2_naming_the_file_in_one_line_and_leaves_nothing(repo, temp):
    path = repo / BROKEN / "config.pbtxt"
    proc = _bls_serve(repo, temp, [free_port() for _ in range(4)], "--fail-fast")
    try:
        text = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, text
    assert "Traceback" not in text
    (error,) = [ln for ln in text.splitlines() if ln.startswith("bls-serve: error:")]
    assert f"{path}:3:20: 'max_batch_size: 64 {{': Expected identifier or number, got {{." in error
    assert not [p.name for p in temp.iterdir() if p.name.startswith("bls-triton-")]
