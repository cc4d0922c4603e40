"""bls-serve as a real process, crashed into on purpose: a python stub killed under load then
SIGTERM (the stop a Kubernetes pod gets), and tritonserver itself dying of SIGSEGV, brought
back by bls-serve (or not, with --no-restart).

The stop is bounded (5 s, issue 25: tritonserver would wait out its exit timeout on a copy
a dead stub left stuck); the restart is timed and printed (-s), not bounded."""

from __future__ import annotations

import http.client
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bls_pipeline.serve.client import ClassifyClient
from bls_pipeline.contract import RESTARTS_ENV
from bls_pipeline.serve.processes import SHM_PREFIX, stubs
from bls_pipeline.serve.options import free_port
from test_faults import BACKUP, FAILOVER, MAIN, STOP_S, Traffic, _group_exists

pytestmark = pytest.mark.integration


class BlsServe:
    """`bls-serve` on free ports, its output (and tritonserver's log, which it passes on)
    read line by line as it comes."""

    def __init__(self, model_repo: Path, *args: str):
        self.ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port(), "status": free_port()}
        cmd = [str(Path(sys.executable).parent / "bls-serve"), "--model-repository", str(model_repo),
               "--http-port", str(self.ports["http"]), "--grpc-port", str(self.ports["grpc"]),
               "--metrics-port", str(self.ports["metrics"]), "--status-port", str(self.ports["status"]), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.shm_prefix = f"{SHM_PREFIX}bls{self.proc.pid}_"

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.lines.append(None)  # the end of its output
            self._changed.notify_all()

    def wait_for_line(self, pattern: str, after: int = 0, timeout: float = 180.0) -> int:
        """Index of the first line from `after` on that matches `pattern`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            i = after
            while True:
                while i < len(self.lines):
                    line = self.lines[i]
                    assert line is not None, f"bls-serve ended without printing {pattern!r}:\n{self.output()}"
                    if re.search(pattern, line):
                        return i
                    i += 1
                left = deadline - time.monotonic()
                assert left > 0, f"no line {pattern!r} within {timeout:.0f} s:\n{self.output()[-6000:]}"
                self._changed.wait(left)

    def output(self) -> str:
        return "".join(line for line in list(self.lines) if line is not None)

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.ports[protocol]}"

    def tritonserver(self) -> int:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        (pid,) = [int(c) for c in children if Path(f"/proc/{c}/comm").read_text().strip() == "tritonserver"]
        return pid

    def stub(self, instance: str) -> int:
        (pid,) = [p for p, name in stubs(self.tritonserver()).live.items() if name == instance]
        return pid

    def sigterm(self) -> tuple[float, int]:
        """SIGTERM, as Kubernetes stops a pod: (seconds until bls-serve exited, its exit code)."""
        began = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=120)
        took = time.monotonic() - began
        self._reader.join(timeout=10)
        return took, code

    def __enter__(self) -> "BlsServe":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def _shm_regions(prefix: str) -> list[str]:
    return [p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(prefix)]


SERVING = r"^Ctrl-C to stop\.$"


# ---- a python stub killed under load, then SIGTERM -----------------------------------------------

@pytest.mark.timing
def test_sigterm_after_a_stub_killed_under_load_stops_within_5_s_and_leaves_nothing(model_repo, sample_images):
    """resnet50_onnx's stub killed under HTTP and gRPC clients of the failover flow: nothing is
    lost (the flow retries the child call), the watchdog reloads it, and SIGTERM then stops
    bls-serve within 5 s with exit code 0, leaving no process and no /dev/shm region. What
    the stop reports follows what Triton did: the old copy unloaded (no request had reached
    the dead stub) and tritonserver exited 0, or it kept the copy (a request had) and
    bls-serve killed it at once, saying so."""
    with BlsServe(model_repo, "--models", FAILOVER, "--watchdog-interval", "1") as bls:
        bls.wait_for_line(SERVING)
        triton = bls.tritonserver()
        load = [Traffic(bls.url(p), p, FAILOVER, sample_images["mug"], threads=2) for p in ("http", "grpc")]
        for traffic in load:
            traffic.__enter__()
        try:
            for traffic in load:
                traffic.wait_for(4)
            os.kill(bls.stub(f"{MAIN}_0_0"), signal.SIGKILL)
            bls.wait_for_line(rf"WATCHDOG: model '{MAIN}' reloaded, serving again")
            reloaded = time.monotonic()
            for traffic in load:
                traffic.wait_for(4, sent_after=reloaded)
        finally:
            for traffic in load:
                traffic.__exit__(None, None, None)
        took, code = bls.sigterm()
    out = bls.output()
    for traffic in load:
        traffic.assert_every_thread_accounted_for()
    records = [r for traffic in load for r in traffic.records]
    assert [r.error for r in records if r.error] == []  # nothing lost
    assert {r.route for r in records} <= {f"{MAIN}:direct", f"{BACKUP}:direct"}

    # Triton's own word on the old copy: unloaded, or kept by the request that reached its dead stub.
    unloads = len(re.findall(rf"successfully unloaded '{MAIN}' version 1", out))
    stuck = re.findall(r"tritonserver cannot exit cleanly: the model copy of the dead python stub\(s\) (\S+) got", out)
    if unloads == 2:  # the old copy after the reload, then the fresh one in the drain
        assert not stuck and "tritonserver stopped (exit code 0)" in out, out[-3000:]
    else:
        assert unloads == 1 and stuck == [f"{MAIN}_0_0"], out[-3000:]
        assert re.search(r"tritonserver stopped after a full drain: nothing in flight was lost; it was killed "
                         r"\(exit code -9\) for 1 model copy", out), out[-3000:]
    assert code == 0, out[-3000:]
    assert took <= STOP_S, f"SIGTERM to exit took {took:.1f} s:\n{out[-3000:]}"
    assert not _group_exists(triton) and not _shm_regions(bls.shm_prefix)
    print(f"\n{len(records)} requests over HTTP and gRPC, all answered; old copy "
          f"{'kept by a request into its dead stub' if stuck else 'unloaded'}; SIGTERM to exit {took:.1f} s, "
          f"bls-serve exit code {code}")


# ---- tritonserver dies of SIGSEGV ----------------------------------------------------------------

def _noise_jpeg(min_bytes: int) -> bytes:
    """A JPEG of RGB noise (it hardly compresses) of at least min_bytes, built here, not committed."""
    side = int((min_bytes / 2.2) ** 0.5)  # about 2.3 bytes a pixel at quality 95
    while True:
        pixels = np.random.default_rng(0).integers(0, 256, size=(side, side * 4 // 3, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=95)
        if len(buf.getvalue()) >= min_bytes:
            return buf.getvalue()
        side = side * 11 // 10


def _crashing_post(url: str, image: bytes) -> str:
    """README's binary-data recipe as curl sends it by default: Content-Type
    application/x-www-form-urlencoded. Triton 2.51's HTTP server dies of SIGSEGV reading such
    a body of about 4 MiB or more (any body, any model). Returns what the client saw."""
    header = json.dumps({"inputs": [{"name": "IMAGE", "shape": [1, 1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(image) + 4}}],
                         "outputs": [{"name": "LABELS", "parameters": {"binary_data": False}}]}).encode()
    body = header + len(image).to_bytes(4, "little") + image
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", "/v2/models/classify_bls/infer", body,
                     {"Content-Type": "application/x-www-form-urlencoded",
                      "Inference-Header-Content-Length": str(len(header))})
        response = conn.getresponse()
        return f"HTTP {response.status} {response.read()[:200]!r}"
    except (ConnectionError, http.client.HTTPException) as exc:  # reset, or closed without an answer
        return f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


def _restarts_gauge(bls: BlsServe) -> set[float]:
    """The values of bls_server_restarts, one per flow instance, on the metrics endpoint."""
    with urllib.request.urlopen(f"http://{bls.url('metrics')}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("bls_server_restarts{")}


def _classify_over_both(bls: BlsServe, image: bytes) -> dict[str, str]:
    answers = {}
    for protocol in ("http", "grpc"):
        client = ClassifyClient(bls.url(protocol), protocol, model="classify_bls")
        try:
            answers[protocol] = client.classify([image])["ROUTE"][0, 0].decode()
        finally:
            client.close()
    return answers


def _crash(bls: BlsServe, body_image: bytes) -> float:
    """Send the crashing request; the moment it was answered by a dead connection."""
    seen = _crashing_post(bls.url("http"), body_image)
    if seen.startswith("HTTP "):
        pytest.skip(f"this tritonserver answered the form-encoded {len(body_image) >> 20} MiB POST ({seen[:80]}): "
                    "it does not have Triton 2.51's crash")
    return time.monotonic()


@pytest.fixture(scope="module")
def crash_image() -> bytes:
    image = _noise_jpeg(8 << 20)
    assert len(image) > 8 << 20
    return image


def test_bls_serve_restarts_a_tritonserver_that_died_of_sigsegv(model_repo, sample_images, crash_image):
    """The request kills tritonserver; bls-serve says of what, starts it again with the same
    models (BLS_SERVER_RESTARTS=1 in its environment) and a watchdog on the new process, and
    both protocols answer again. The time from the crash to the first answer is printed."""
    mug = sample_images["mug"]
    with BlsServe(model_repo, "--models", "classify_bls", "--watchdog-interval", "1") as bls:
        bls.wait_for_line(SERVING)
        first = bls.tritonserver()
        assert Path(f"/proc/{first}/environ").read_bytes().split(b"\0").count(f"{RESTARTS_ENV}=0".encode()) == 1
        assert _classify_over_both(bls, mug).keys() == {"http", "grpc"}
        assert _restarts_gauge(bls) == {0.0}
        serving = len(bls.lines)

        crashed = _crash(bls, crash_image)
        died = bls.wait_for_line(r"tritonserver died of SIGSEGV after \d+ s serving, not on a stop: the requests in "
                                 rf"flight were lost; restarting it in 1 s \(restart 1, {RESTARTS_ENV}=1\)", serving)
        restarted = bls.wait_for_line(rf"tritonserver restarted \(restart 1, {RESTARTS_ENV}=1\): serving "
                                      r".*classify_bls.* again", died)
        answers, answered = {}, None
        deadline = time.monotonic() + 60
        while answers.keys() != {"http", "grpc"}:
            try:
                answers = _classify_over_both(bls, mug)
                answered = time.monotonic()
            except Exception:  # noqa: BLE001 - not serving yet: asked again
                assert time.monotonic() < deadline, bls.output()[-3000:]
                time.sleep(0.1)
        second = bls.tritonserver()
        assert second != first and not _group_exists(first)  # the dead one's stubs went with it
        assert f"{RESTARTS_ENV}=1".encode() in Path(f"/proc/{second}/environ").read_bytes().split(b"\0")
        assert _restarts_gauge(bls) == {1.0}  # what an operator reads: the flow models publish it

        # The watchdog follows the new process: a stub killed there is found and reloaded.
        os.kill(bls.stub("resnet50_onnx_0_0"), signal.SIGKILL)
        bls.wait_for_line(r"WATCHDOG: model 'resnet50_onnx' reloaded, serving again", restarted)
        took, code = bls.sigterm()
    assert code == 0, bls.output()[-3000:]
    assert not _group_exists(second) and not _shm_regions(bls.shm_prefix)
    print(f"\ntritonserver died of SIGSEGV; answering again over HTTP and gRPC {answered - crashed:.1f} s later "
          f"(restart 1); stopped {took:.1f} s after SIGTERM")


def test_no_restart_lets_bls_serve_exit_1_when_tritonserver_dies(model_repo, crash_image):
    with BlsServe(model_repo, "--models", "classify_bls", "--watchdog-interval", "0", "--no-restart") as bls:
        bls.wait_for_line(SERVING)
        triton = bls.tritonserver()
        _crash(bls, crash_image)
        code = bls.proc.wait(timeout=60)
        bls._reader.join(timeout=10)
    out = bls.output()
    assert code == 1, out[-3000:]
    assert re.search(r"tritonserver died of SIGSEGV after \d+ s serving, not on a stop: the requests in flight were "
                     r"lost; --no-restart: bls-serve exits 1", out), out[-3000:]
    assert "restarting it" not in out
    assert not _group_exists(triton) and not _shm_regions(bls.shm_prefix)
