#!/usr/bin/env python3
"""Soak bls-serve under load, as shipped, and count what took tritonserver down.

Starts `bls-serve` (this checkout's .venv, its shipped settings, free ports) and sends, for
--minutes, a mix that keeps it at capacity and past it:

  closed-loop gRPC and HTTP clients    every sample photo in turn, no deadline
  impatient gRPC clients                a 0.2 s deadline: answered, or dropped as expired at the door
  cancelled bursts                      gRPC calls whose client gives up after 1 ms (cancellations)
  bad requests                          an unknown request parameter: a 400 at the door

Every few seconds it asks tritonserver's /v2/health/live (2 s timeout) and bls-serve's
status port. At the end it sends SIGTERM and reports: requests sent and their outcomes,
tritonserver aborts (its log's fatal lines, and every restart bls-serve counted, by cause),
liveness checks that went unanswered, and the stop (seconds, exit code). Exit status 0 only
with no abort, no restart, no unanswered liveness check and a clean stop.

    .venv/bin/python scripts/soak.py --minutes 30            # the soak the docs quote
    .venv/bin/python scripts/soak.py --minutes 3 --log build/soak.log
    .venv/bin/python scripts/soak.py --minutes 5 -- --trace build/traces/trace.json   # after --: bls-serve's flags
"""

from __future__ import annotations

import argparse
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np

from bls_pipeline.base.messages import BUSY

REPO = Path(__file__).resolve().parent.parent
# What tritonserver writes when it aborts or crashes (Triton 2.51's signal handler, glibc).
FATAL = re.compile(r"Signal \((?!15\)|2\))\d+\) received|TraceRelease|malloc\(\)|double free|corrupted|Assertion .* "
                   r"failed|terminate called|Segmentation fault")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tally:
    def __init__(self):
        self.counts: Counter = Counter()
        self.lock = threading.Lock()

    def add(self, kind: str) -> None:
        with self.lock:
            self.counts[kind] += 1


def _outcome(exc: Exception | None) -> str:
    if exc is None:
        return "answered"
    text = str(exc)
    for kind, pattern in (("refused (503)", rf"\b503\b|UNAVAILABLE|{BUSY.pattern}"),
                          ("bad request (400)", r"\b400\b|INVALID_ARG"),
                          ("deadline or cancelled", r"DEADLINE_EXCEEDED|CANCELLED|Deadline Exceeded|expired|cancel"),
                          ("connection failed", r"UNAVAILABLE.*connect|Connection refused|failed to connect|"
                                                r"RemoteDisconnected|Connection reset|timed out")):
        if re.search(pattern, text, re.IGNORECASE):
            return kind
    return f"other: {text.splitlines()[0][:100] if text else type(exc).__name__}"


def _inputs(tc, image: bytes):
    inp = tc.InferInput("IMAGE", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[image]], dtype=object))
    return [inp]


def _closed_loop(stop: threading.Event, tally: Tally, url: str, protocol: str, model: str, images: list[bytes],
                 timeout_s: float | None = None, parameters: dict | None = None, pause_s: float = 0.0) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    tc = grpcclient if protocol == "grpc" else httpclient
    client = (tc.InferenceServerClient(url, network_timeout=60.0) if protocol == "http"
              else tc.InferenceServerClient(url))
    i = 0
    try:
        while not stop.is_set():
            kwargs = {"client_timeout": timeout_s} if timeout_s is not None else {}
            if parameters:
                kwargs["parameters"] = parameters
            try:
                client.infer(model, _inputs(tc, images[i % len(images)]), **kwargs)
                tally.add("answered")
            except Exception as exc:  # noqa: BLE001 - every outcome is counted
                kind = _outcome(exc)
                tally.add(kind)
                if kind == "connection failed":
                    stop.wait(0.5)  # a server being restarted: no spin
            i += 1
            if pause_s:
                stop.wait(pause_s)
    finally:
        client.close()


def _cancelled_bursts(stop: threading.Event, tally: Tally, url: str, model: str, images: list[bytes],
                      burst: int) -> None:
    """Upstream's pattern for Triton's tracing crash: async gRPC calls abandoned after 1 ms."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    done = threading.Semaphore(0)

    def finished(result, error) -> None:
        tally.add("cancelled burst: " + ("answered" if error is None else _outcome(error)))
        done.release()

    try:
        while not stop.is_set():
            for i in range(burst):
                client.async_infer(model, _inputs(grpcclient, images[i % len(images)]), callback=finished,
                                   client_timeout=0.001)
            for _ in range(burst):
                done.acquire(timeout=30)
            stop.wait(1.0)
    finally:
        client.close()


def _get(url: str, timeout_s: float) -> tuple[int | None, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return None, str(exc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Anything after -- goes to bls-serve.")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--model", default="classify_bls")
    p.add_argument("--grpc", type=int, default=6, help="closed-loop gRPC clients")
    p.add_argument("--http", type=int, default=2, help="closed-loop HTTP clients")
    p.add_argument("--impatient", type=int, default=4, help="gRPC clients with a 0.2 s deadline")
    p.add_argument("--bad", type=int, default=1,
                   help="clients sending an unknown parameter (a 400 at the door), 10 a second each")
    p.add_argument("--burst", type=int, default=50, help="gRPC calls cancelled after 1 ms, each second (0: none)")
    p.add_argument("--log", type=Path, default=REPO / "build" / "soak.log",
                   help="bls-serve's output, tritonserver's log in it")
    args, serve_args = p.parse_known_args(argv)
    serve_args = [a for a in serve_args if a != "--"]

    ports = {k: _free_port() for k in ("http", "grpc", "metrics", "status")}
    cmd = [str(Path(sys.executable).parent / "bls-serve"), "--http-port", str(ports["http"]), "--grpc-port",
           str(ports["grpc"]), "--metrics-port", str(ports["metrics"]), "--status-port", str(ports["status"]),
           *serve_args]
    args.log.parent.mkdir(parents=True, exist_ok=True)
    log = open(args.log, "w")
    print(f"soak: {' '.join(cmd)}\nsoak: its output in {args.log}", flush=True)
    serve = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    http, grpc = f"127.0.0.1:{ports['http']}", f"127.0.0.1:{ports['grpc']}"
    status = f"http://127.0.0.1:{ports['status']}"
    deadline = time.monotonic() + 300
    while _get(f"http://{http}/v2/models/{args.model}/ready", 2)[0] != 200:
        if serve.poll() is not None or time.monotonic() > deadline:
            print(f"soak: bls-serve did not serve {args.model} (exit {serve.poll()}); see {args.log}", file=sys.stderr)
            if serve.poll() is None:
                serve.send_signal(signal.SIGTERM)
                serve.wait(60)
            return 2
        time.sleep(1)

    images = [path.read_bytes() for path in sorted((REPO / "samples").glob("*.jpg"))]
    stop, tally = threading.Event(), Tally()
    work = [partial(_closed_loop, stop, tally, grpc, "grpc", args.model, images) for _ in range(args.grpc)]
    work += [partial(_closed_loop, stop, tally, http, "http", args.model, images) for _ in range(args.http)]
    work += [partial(_closed_loop, stop, tally, grpc, "grpc", args.model, images, timeout_s=0.2)
             for _ in range(args.impatient)]
    work += [partial(_closed_loop, stop, tally, http, "http", args.model, images[:1],
                     parameters={"no_such_parameter": 1}, pause_s=0.1) for _ in range(args.bad)]
    if args.burst:
        work.append(partial(_cancelled_bursts, stop, tally, grpc, args.model, images, args.burst))
    threads = [threading.Thread(target=w, daemon=True) for w in work]
    began = time.monotonic()
    for t in threads:
        t.start()
    unanswered, checks = 0, 0
    try:
        while time.monotonic() - began < args.minutes * 60 and serve.poll() is None:
            time.sleep(5)
            checks += 1
            if _get(f"http://{http}/v2/health/live", 2)[0] != 200:
                unanswered += 1
                print(f"soak: {time.monotonic() - began:.0f} s: tritonserver's /v2/health/live unanswered", flush=True)
            elapsed = time.monotonic() - began
            if checks % 12 == 0:
                with tally.lock:
                    sent = sum(tally.counts.values())
                print(f"soak: {elapsed / 60:.1f} min, {sent} requests, {tally.counts['answered']} answered", flush=True)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    metrics = _get(f"{status}/metrics", 5)[1]
    restarts = {m.group(1): float(m.group(2)) for m in
                re.finditer(r'^bls_tritonserver_restarts_total\{cause="([^"]+)"\} (\S+)$', metrics, re.M)}
    stop_began = time.monotonic()
    serve.send_signal(signal.SIGTERM)
    try:
        code = serve.wait(timeout=120)
    except subprocess.TimeoutExpired:
        code = None
        subprocess.run(["kill", "-KILL", f"-{serve.pid}"], check=False)
        serve.wait(timeout=30)
    stopped = time.monotonic() - stop_began
    log.close()
    output = args.log.read_text(errors="replace")
    fatal = [line for line in output.splitlines() if FATAL.search(line)]
    deaths = re.findall(r"tritonserver (died of \w+|exited with code \S+|did not answer[^;:]*)", output)
    minutes = (stop_began - began) / 60
    print(f"\nsoak: {minutes:.1f} min of load on {args.model}: {sum(tally.counts.values())} requests")
    for kind, n in sorted(tally.counts.items(), key=lambda kv: -kv[1]):
        print(f"  {n:8d}  {kind}")
    print(f"tritonserver aborts or crashes in its log: {len(fatal)} line(s)"
          + "".join(f"\n  {ln[:200]}" for ln in fatal[:10]))
    print(f"tritonserver ends bls-serve saw: {len(deaths)}" + "".join(f"\n  {d}" for d in deaths[:10]))
    print(f"restarts by cause (status port): {restarts or 'no such metric'}")
    print(f"liveness checks unanswered: {unanswered} of {checks}")
    print(f"SIGTERM to exit: {stopped:.1f} s, exit code {code}")
    clean = not fatal and not deaths and not any(restarts.values()) and not unanswered and code == 0
    print("soak: PASS" if clean else "soak: FAIL")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
