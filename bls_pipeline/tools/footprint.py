"""`bls-footprint`: how much memory a served model repository takes, idle and under load.

Starts tritonserver on the repository as bls-serve would (every model whose parts are
present, the benchmark baselines left out), then reads it and each python stub from /proc: private memory (pages only it
holds: Private_Clean + Private_Dirty of smaps_rollup) and shared memory (the python
backend's /dev/shm tensor regions and the libraries, counted once per process that
touched them). Measured at idle, after the load-time imports, and again after `--load-s`
seconds of closed-loop load on every flow model. The number to watch is private memory in
all: what the repository costs the machine beyond what it shares.
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..runtime.load.loader import is_flow_model
from ..serve.paths import default_models, default_samples
from ..serve.processes import stubs
from ..serve.repository import Repository
from ..serve.options import ServerOptions
from ..serve.server import TritonServer
from .bench_images import make_image_set
from .bench_sweep import run_point

__all__ = ["Footprint", "main", "measure"]


@dataclass(frozen=True)
class Footprint:
    process: str  # "tritonserver" or the stub's model instance ("classify_bls_0_1")
    private_mib: float
    shared_mib: float


def _smaps_mib(pid: int) -> tuple[float, float]:
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    kb = {k: int(v) for k, v in re.findall(r"^(\w+):\s+(\d+) kB", text, re.M)}
    private = (kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)) / 1024
    return private, (kb.get("Shared_Clean", 0) + kb.get("Shared_Dirty", 0)) / 1024


def measure(server: TritonServer) -> list[Footprint]:
    """tritonserver and each of its python stubs: private and shared memory."""
    rows = []
    for pid, name in {server.pid: "tritonserver", **stubs(server.pid).live}.items():
        try:
            private, shared = _smaps_mib(pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # gone meanwhile
        rows.append(Footprint(name, private, shared))
    return sorted(rows, key=lambda r: (r.process != "tritonserver", r.process))


def report(idle: list[Footprint], loaded: list[Footprint], load_s: float) -> str:
    after = {r.process: r for r in loaded}
    lines = [f"| process | private MiB idle | private MiB after {load_s:.0f} s of load | shared MiB after |",
             "|---|---:|---:|---:|"]
    for r in idle:
        a = after.get(r.process)
        lines.append(f"| {r.process} | {r.private_mib:.0f} | {a.private_mib:.0f} | {a.shared_mib:.0f} |" if a else
                     f"| {r.process} | {r.private_mib:.0f} | (gone) | |")
    lines.append(f"| **all** | **{sum(r.private_mib for r in idle):.0f}** | "
                 f"**{sum(r.private_mib for r in loaded):.0f}** | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bls-footprint", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model-repository", type=Path, default=default_models(), help="./models, else the checkout's")
    p.add_argument("--images", type=Path, default=default_samples(), help="folder of JPEG photos for the load")
    p.add_argument("--load-s", type=float, default=60.0, help="seconds of load, spread over the flow models")
    p.add_argument("--concurrency", type=int, default=8)
    args = p.parse_args(argv)
    if args.model_repository is None or args.images is None:
        p.error("give --model-repository DIR and --images DIR (no checkout's models/ and samples/ here)")
    workdir = Path(tempfile.mkdtemp(prefix="bls-footprint-"))
    baselines = Repository.read(args.model_repository).baselines()  # as bls-serve does
    server = TritonServer(ServerOptions.on_free_ports(args.model_repository, workdir / "tritonserver.log",
                                                      exclude=baselines))
    try:
        server.start()
        time.sleep(5)  # the stubs settle after their load-time imports
        idle = measure(server)
        flows = [m for m in server.loaded if is_flow_model(Path(args.model_repository) / m)]
        images = make_image_set(sorted(args.images.glob("*.jpg")))
        for model in flows:
            run_point(server.url("grpc"), "grpc", model, args.concurrency, images, args.load_s / len(flows), 0.0)
        loaded = measure(server)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{args.model_repository}: loaded {', '.join(server.loaded)}\n")
    print(report(idle, loaded, args.load_s))
    return 0
