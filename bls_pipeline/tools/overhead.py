"""`bls-overhead`: what the python backend's plumbing costs one request, with no work in it.

bls-bench times the real pipeline; this times the same paths with every model replaced
by a stand-in that does nothing (data/probe_models/probe_model.py), one request at a
time, so what is left is Triton's and the python backend's own cost:

    direct    client --602 KB FP32 tensor--> probe_classifier              (bls-bench's "classifier")
    stub      client --IMAGE--> a python model that answers at once
    bls       client --IMAGE--> probe_bls --ONE BLS child call, DLPack--> probe_classifier
    ensemble  client --IMAGE--> probe_prep --Triton's ensemble scheduler--> probe_classifier

`bls - stub - hold` is one BLS child call; `ensemble - stub - hold` is one ensemble hop (a
second stub plus the scheduler). `--hold-ms` makes the classifier stand-in hold its
execute() that long (resnet50 takes ~20-25 ms here), so every process on the path waits
between requests as it does at concurrency 1; `--hold-mode stream` spends that time
reading 128 MB, so the path after it also runs with cold caches, as after onnxruntime.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..serve.client import tritonclient_module
from ..contract import CLASSIFIER_INPUT, CLASSIFIER_OUTPUT, IMAGE
from ..base.modelconfig import config_variant, parse_config

__all__ = ["PATHS", "main", "measure", "probe_repository"]

PROBES = Path(__file__).resolve().parent / "probe_models"
PATHS = {"direct": "probe_classifier", "stub": "probe_stub", "bls": "probe_bls", "ensemble": "probe_ensemble"}
IMAGE_BYTES = 100_000  # about a 500x375 JPEG


def probe_repository(dst: Path, hold_ms: float, hold_mode: str = "sleep") -> Path:
    """A model repository of the probe models under dst/models."""
    repo = dst / "models"
    for source in sorted(p.parent for p in PROBES.glob("*/config.pbtxt")):
        model = repo / source.name
        (model / "1").mkdir(parents=True)
        if source.name == PATHS["direct"]:
            (model / "config.pbtxt").write_text(config_variant(source, model.name,
                                                               {"hold_ms": str(hold_ms), "hold_mode": hold_mode}))
        else:
            shutil.copy(source / "config.pbtxt", model / "config.pbtxt")
        if parse_config(source).backend == "python":
            shutil.copy(PROBES / "probe_model.py", model / "1" / "model.py")
    return repo


def _inputs(tc, path: str) -> list:
    if path == "direct":
        inp = tc.InferInput(CLASSIFIER_INPUT.name, [1, *CLASSIFIER_INPUT.dims], "FP32")
        inp.set_data_from_numpy(np.zeros((1, *CLASSIFIER_INPUT.dims), np.float32))
    else:
        inp = tc.InferInput(IMAGE.name, [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[b"\xff" * IMAGE_BYTES]], dtype=object))
    return [inp]


def measure(url: str, protocol: str = "grpc", requests: int = 300, rounds: int = 3,
            warmup: int = 30) -> dict[str, list[float]]:
    """p50 latency in ms per path, one value per round; paths interleaved within a round."""
    tc = tritonclient_module(protocol)
    client = tc.InferenceServerClient(url)
    outputs = [tc.InferRequestedOutput(CLASSIFIER_OUTPUT.name)]
    p50: dict[str, list[float]] = {path: [] for path in PATHS}
    try:
        for _, path in tqdm([(r, p) for r in range(rounds) for p in PATHS], desc="overhead", unit="path"):
            inputs = _inputs(tc, path)
            latencies = []
            for i in range(warmup + requests):
                t0 = time.perf_counter()
                result = client.infer(PATHS[path], inputs, outputs=outputs)
                if i >= warmup:
                    latencies.append(time.perf_counter() - t0)
            assert result.as_numpy(CLASSIFIER_OUTPUT.name).shape == (1, CLASSIFIER_OUTPUT.dims[0]), path
            p50[path].append(statistics.median(latencies) * 1e3)
    finally:
        client.close()
    return p50


def report(p50: dict[str, list[float]], hold_ms: float, hold_mode: str = "sleep") -> str:
    rounds = len(next(iter(p50.values())))
    lines = [f"p50 latency per request, concurrency 1, classifier stand-in holding {hold_ms:g} ms ({hold_mode}):", "",
             "| path | median of rounds ms | " + " | ".join(f"round {r + 1}" for r in range(rounds)) + " |",
             "|---|---:|" + "---:|" * rounds]
    rows = dict(p50)
    rows["bls - stub - hold (one BLS child call)"] = [b - s - hold_ms for b, s in zip(p50["bls"], p50["stub"])]
    rows["ensemble - stub - hold (one ensemble hop)"] = [e - s - hold_ms for e, s in zip(p50["ensemble"], p50["stub"])]
    rows["bls - ensemble"] = [b - e for b, e in zip(p50["bls"], p50["ensemble"])]
    rows["bls - direct"] = [b - d for b, d in zip(p50["bls"], p50["direct"])]
    for name, values in rows.items():
        lines.append(f"| {name} | {statistics.median(values):.2f} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bls-overhead", description=__doc__.splitlines()[0])
    p.add_argument("--hold-ms", type=float, default=0.0, help="the classifier stand-in's execute() time")
    p.add_argument("--hold-mode", choices=("sleep", "stream"), default="sleep", help="how it spends that time")
    p.add_argument("--requests", type=int, default=300, help="timed requests per path and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    args = p.parse_args(argv)

    from ..serve.options import ServerOptions
    from ..serve.server import TritonServer

    workdir = Path(tempfile.mkdtemp(prefix="bls-overhead-"))
    try:
        repo = probe_repository(workdir, args.hold_ms, args.hold_mode)
        with TritonServer(ServerOptions.on_free_ports(repo, workdir / "tritonserver.log")) as server:
            p50 = measure(server.url(args.protocol), args.protocol, args.requests, args.rounds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(report(p50, args.hold_ms, args.hold_mode))
    return 0
