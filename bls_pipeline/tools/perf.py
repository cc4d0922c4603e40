"""`bls-perf`: Triton's own perf_analyzer on this project's models.

`bls-perf data` writes perf_analyzer's --input-data file from images, each as one request's
IMAGE (and, with --expect, validation_data: what a running server answers for each image now,
which perf_analyzer then checks on every answer). `bls-perf compare` measures the same
targets with bls-bench and with perf_analyzer, on one server, in one run, rounds interleaved;
what a flow answered it reads from the flow's own count (flow_requests), not Triton's success
count, which takes in the requests a flow refused.
perf_analyzer itself comes from scripts/perf-tools.sh (docs/performance.md, "perf_analyzer").
"""

from __future__ import annotations

import argparse
import base64
import csv
import json
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..contract import IMAGE, ROUTE
from ..runtime.load.loader import is_flow_model
from ..serve.client import check_server, find_images, tritonclient_module
from ..serve.paths import checkout, default_models, default_samples

__all__ = ["expected_outputs", "flow_counts", "flow_requests", "input_data", "main", "perf_analyzer_command",
           "request_parameter", "run_perf_analyzer", "with_routes"]


# ---- the input-data file -----------------------------------------------------------------
def _serialized(data: bytes) -> str:
    """One BYTES element as perf_analyzer reads it from base64: the tensor's serialized form,
    a 4-byte little-endian length and then the bytes (without the length it reads the JPEG's
    first 4 bytes as one)."""
    return base64.b64encode(struct.pack("<I", len(data)) + data).decode("ascii")


def input_data(images: list[bytes], expected: list[dict[str, list]] | None = None) -> dict:
    """perf_analyzer's --input-data document: one request per image, sent in turn; with
    `expected` (one entry per image), the validation_data it checks every answer against."""
    document: dict = {"data": [{IMAGE.name: {"b64": _serialized(image)}} for image in images]}
    if expected is not None:
        if len(expected) != len(images):
            raise ValueError(f"{len(expected)} expected answers for {len(images)} images")
        document["validation_data"] = expected
    return document


def expected_outputs(url: str, protocol: str, model: str, images: list[bytes], outputs: list[str],
                     parameters: dict | None = None) -> list[dict[str, list]]:
    """Each image's `outputs` as `model` at `url` answers it now (asked with the request
    `parameters` perf_analyzer will send), in validation_data's form.

    Fixed-shape outputs only: perf_analyzer 2.51 reads no shape for a validation tensor, and
    refuses one whose shape has a -1 (LABELS, SCORES, CLASS_IDS). It compares bytes: an output
    that carries floats (SCORES, JSON) can differ in its last digits with the batch it ran in."""
    tc = tritonclient_module(protocol)
    client = tc.InferenceServerClient(url)
    try:
        metadata = (client.get_model_metadata(model, as_json=True) if protocol == "grpc"
                    else client.get_model_metadata(model))
        shapes = {o["name"]: [int(d) for d in o["shape"]] for o in metadata["outputs"]}
        for name in outputs:
            if name not in shapes:
                raise ValueError(f"{model} has no output {name}; its outputs: {', '.join(shapes)}")
            dims = shapes[name][1:] if shapes[name][:1] == [-1] else shapes[name]  # less the batch dimension
            if -1 in dims:
                raise ValueError(f"{model}'s {name} has a variable shape {shapes[name]}: perf_analyzer 2.51 validates "
                                 "fixed-shape outputs only (ROUTE, TEXT, REGION_COUNT)")
        others = dict(parameters or {})
        timeout = others.pop("timeout", None)  # Triton's own: tritonclient sends it as timeout=, in µs
        expected = []
        for image in images:
            tensor = tc.InferInput(IMAGE.name, [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[image]], dtype=object))
            result = client.infer(model, [tensor], outputs=[tc.InferRequestedOutput(name) for name in outputs],
                                  parameters=others or None, timeout=timeout)
            expected.append({name: _content(result.as_numpy(name)[0]) for name in outputs})
        return expected
    finally:
        client.close()


def with_routes(images: list[bytes], expected: list[dict[str, list]],
                branches: set[str]) -> tuple[list[bytes], list[dict[str, list]]]:
    """The images whose expected ROUTE ends in one of `branches` (ROUTE is `model:branch`), and
    their expected answers: e.g. classify_bls's `confident`, answers that no load can change,
    where an escalated image may come back degraded when resnet50 is busy."""
    if any(ROUTE.name not in e for e in expected):
        raise ValueError(f"keeping images by route needs {ROUTE.name} among the expected outputs")
    kept = [(image, e) for image, e in zip(images, expected) if e[ROUTE.name][0].rpartition(":")[2] in branches]
    return [image for image, _ in kept], [e for _, e in kept]


_TYPES = {"int": int, "bool": lambda v: {"true": True, "false": False}[v], "string": str}


def request_parameter(text: str) -> tuple[str, object]:
    """perf_analyzer's --request-parameter NAME:VALUE:TYPE (int, bool or string) as the
    (name, value) it sends: both lowercased, as perf_analyzer 2.51 does."""
    try:
        name, value, kind = text.lower().split(":")
        return name, _TYPES[kind](value)
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"{text!r}: write NAME:VALUE:TYPE, TYPE int, bool or string "
                                         "(skip_cascade:true:bool), as perf_analyzer takes it") from None


def _content(values) -> list:
    """One batch element of an output as validation_data's explicit content: text for BYTES
    (UTF-8, as perf_analyzer serializes it back), numbers for the rest."""
    flat = values.reshape(-1)
    if flat.dtype == object:
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in flat]
    return flat.tolist()


def _data_main(args: argparse.Namespace) -> int:
    files = find_images(args.paths)
    if args.bench_set:
        from .bench_images import make_image_set

        images = make_image_set([f for f in files if f.suffix.lower() in (".jpg", ".jpeg")])
    else:
        images = [f.read_bytes() for f in files]
    if not images:
        print(f"bls-perf data: error: no images in {' '.join(args.paths)}", file=sys.stderr)
        return 2
    expected = None
    if args.expect:
        url = args.url or ("127.0.0.1:8001" if args.protocol == "grpc" else "127.0.0.1:8000")
        why = check_server(url, args.protocol, args.model)
        if why:
            print(f"bls-perf data: error: {why}", file=sys.stderr)
            return 2
        try:
            expected = expected_outputs(url, args.protocol, args.model, images, args.expect.split(","),
                                        dict(args.request_parameter))
        except ValueError as exc:
            print(f"bls-perf data: error: {exc}", file=sys.stderr)
            return 2
    kept = ""
    if args.only_routes:
        if expected is None or any(ROUTE.name not in e for e in expected):
            print("bls-perf data: error: --only-routes keeps images by the ROUTE the server answers: give --expect "
                  "ROUTE", file=sys.stderr)
            return 2
        branches, asked = set(args.only_routes.split(",")), len(images)
        routes = sorted({e[ROUTE.name][0] for e in expected})
        images, expected = with_routes(images, expected, branches)
        wanted = " or :".join(sorted(branches))
        if not images:
            print(f"bls-perf data: error: no image's ROUTE ends in :{wanted} (their routes now: {', '.join(routes)})",
                  file=sys.stderr)
            return 2
        kept = f" (of {asked}: those whose ROUTE ends in :{wanted})"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(input_data(images, expected)))
    checked = f", each answer's {args.expect} checked against {args.model}'s answers now" if expected else ""
    print(f"wrote {args.out}: {len(images)} requests{kept}{checked}")
    return 0


# ---- running perf_analyzer ---------------------------------------------------------------
def perf_analyzer_command(binary: str | None = None) -> list[str]:
    """How to start perf_analyzer: `binary` if given, else through the checkout's
    scripts/perf-tools.sh (which installs it once and gives it its libraries), else the
    perf_analyzer on PATH."""
    if binary:
        return [binary]
    root = checkout()
    if root is not None and (root / "scripts" / "perf-tools.sh").is_file():
        return [str(root / "scripts" / "perf-tools.sh"), "perf_analyzer"]
    found = shutil.which("perf_analyzer")
    if found is None:
        raise FileNotFoundError("no perf_analyzer: in a checkout, scripts/perf-tools.sh installs it; elsewhere put "
                                "tritonclient 2.51.0's perf_analyzer on PATH (with libcudart.so.12 and libb64 where it "
                                "finds them)")
    return [found]


@dataclass
class PerfPoint:
    target: str
    concurrency: int
    images_per_s: float
    p50_ms: float
    p99_ms: float
    server_queue_ms: float  # per request, as perf_analyzer reads Triton's statistics
    server_compute_ms: float  # compute input + infer + output
    flow_answered: int | None = None  # a flow's requests answered in the run, by its own count (flow_requests)


def run_perf_analyzer(command: list[str], model: str, url: str, protocol: str, input_file: Path, concurrency: int,
                      window_ms: int, headers: dict[str, str], csv_file: Path,
                      extra: tuple[str, ...] = ()) -> dict[str, float]:
    """One closed-loop perf_analyzer point: its CSV row (latencies in µs) as numbers. Raises
    RuntimeError with perf_analyzer's own last lines when it fails (an error answer, an
    answer validation_data does not match, no stable measurement)."""
    cmd = [*command, "-m", model, "-u", url, "-i", protocol, "--input-data", str(input_file),
           "--concurrency-range", str(concurrency), "--measurement-interval", str(window_ms), "-f", str(csv_file),
           *[arg for name, value in headers.items() for arg in ("-H", f"{name}:{value}")], *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not csv_file.is_file():
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
        raise RuntimeError(f"perf_analyzer on {model} at concurrency {concurrency} failed (exit "
                           f"{done.returncode}):\n{tail}")
    with open(csv_file, newline="") as f:
        row = next(csv.DictReader(f))
    return {key: float(value) for key, value in row.items() if value not in ("", None)}


# ---- a flow's own counts -----------------------------------------------------------------
FLOW_REQUESTS = "bls_requests_total"  # a flow's requests by the status code sent (adapter/metrics.py)
_FLUSH_S = 0.25  # how far a flow's metrics lag its answers (FlowMetrics' flush_s)


def flow_requests(metrics_url: str, model: str) -> dict[str, float]:
    """{status code: requests} the flow `model` finished so far, by its own bls_requests_total
    (OK: answered; GONE: answered after its client left; else the code of a refusal or failure),
    summed over instances. Triton's success count cannot stand in for it: the python backend of
    Triton 2.51 reports each execute() a success unless execute() raised, so a request the flow
    refused through an error response counts as a success there (and in perf_analyzer's
    "Successful request count")."""
    return flow_counts(urllib.request.urlopen(metrics_url, timeout=10).read().decode(), model)


def flow_counts(metrics_text: str, model: str) -> dict[str, float]:
    """flow_requests from a Prometheus text page."""
    counts: dict[str, float] = {}
    for labels, value in re.findall(rf"^{FLOW_REQUESTS}\{{(.*)\}} (\S+)$", metrics_text, re.M):
        tags = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if tags.get("model") == model:
            counts[tags["code"]] = counts.get(tags["code"], 0.0) + float(value)
    return counts


def _settled_flow_requests(metrics_url: str, model: str, timeout_s: float = 10.0) -> dict[str, float]:
    """flow_requests once the flow's counts have caught up with its answers: two readings a
    flush apart agree (called when no client is waiting for an answer)."""
    deadline = time.monotonic() + timeout_s
    last = flow_requests(metrics_url, model)
    while time.monotonic() < deadline:
        time.sleep(2 * _FLUSH_S)
        now = flow_requests(metrics_url, model)
        if now == last:
            break
        last = now
    return last


def _point(target: str, concurrency: int, row: dict[str, float]) -> PerfPoint:
    compute = sum(row.get(k, 0.0) for k in ("Server Compute Input", "Server Compute Infer", "Server Compute Output"))
    return PerfPoint(target, concurrency, row["Inferences/Second"], row["p50 latency"] / 1e3, row["p99 latency"] / 1e3,
                     row.get("Server Queue", 0.0) / 1e3, compute / 1e3)


# ---- bls-perf compare: both tools, the same targets, one server, one run ------------------
def _compare_main(args: argparse.Namespace) -> int:
    from . import bench_images, bench_sweep, bench_targets
    from ..serve.options import ServerOptions
    from ..serve.server import TritonServer

    targets = [t for t in args.targets.split(",") if t]
    unfit = [t for t in targets if t.startswith("classifier") or t in bench_targets.REGION_TARGETS]
    if unfit:
        print(f"bls-perf compare: error: {unfit}: compare measures targets fed images (flows, the ensemble, peers)",
              file=sys.stderr)
        return 2
    concurrency = [int(c) for c in args.concurrency.split(",")]
    command = perf_analyzer_command(args.perf_analyzer)
    workdir = Path(tempfile.mkdtemp(prefix="bls-perf-"))
    runs: dict[tuple[str, str, int], dict[int, object]] = {}  # (tool, target, concurrency) -> round -> its point
    unstable: list[tuple[int, str, int]] = []  # (round, target, concurrency) perf_analyzer could not measure
    try:
        repo = workdir / "models"
        bench_targets.repository_for(targets, args.model_repository, repo)
        models = {t: bench_targets.served_model(t) for t in targets}
        flows = {t for t in targets if is_flow_model(repo / models[t])}
        server = TritonServer(ServerOptions.on_free_ports(repo, workdir / "tritonserver.log",
                                                          models=tuple(sorted(set(models.values())))))
        missing = server.not_loaded(tuple(models.values()))
        if missing:
            print(f"bls-perf compare: error: cannot measure without {missing}", file=sys.stderr)
            return 2
        images = bench_images.make_image_set(sorted(args.images.glob("*.jpg")))
        input_file = workdir / "images.json"
        input_file.write_text(json.dumps(input_data(images)))
        with server:
            url = server.url(args.protocol)
            headers = server.admin_headers_for(args.protocol)  # perf_analyzer reads each model's config
            grid = [(r, c, t) for r in range(args.rounds) for c in concurrency for t in targets]
            for n, (r, c, target) in enumerate(grid, 1):
                print(f"[{n}/{len(grid)}] round {r + 1}, concurrency {c}, {target}", flush=True)
                # Which tool goes first alternates by round: drift on a shared machine hits both alike.
                for tool in (("bench", "perf_analyzer") if r % 2 == 0 else ("perf_analyzer", "bench")):
                    if tool == "bench":
                        point = bench_sweep.run_point(url, args.protocol, target, c, images, args.duration, args.warmup)
                        if point.errors:
                            raise RuntimeError(f"bls-bench: {point.errors} errors on {target} at concurrency {c}")
                    else:
                        before = _settled_flow_requests(server.metrics_url, models[target]) if target in flows else None
                        try:
                            row = run_perf_analyzer(command, models[target], url, args.protocol, input_file, c,
                                                    int(args.duration * 1000), headers, workdir / f"pa-{n}.csv",
                                                    ("--stability-percentage", str(args.stability)))
                        except RuntimeError as exc:
                            if "stable measurement" not in str(exc):
                                raise
                            print(f"  perf_analyzer found no 3 windows within {args.stability:g}%: no point this round")
                            unstable.append((r, target, c))
                            continue
                        point = _point(target, c, row)
                        if before is not None:
                            point.flow_answered = _checked_flow(server.metrics_url, models[target], before, target, c)
                    runs.setdefault((tool, target, c), {})[r] = point
                # after every point: a run cut short keeps its rounds
                _write(args, runs, unstable, targets, concurrency)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(_write(args, runs, unstable, targets, concurrency))
    print(f"wrote {args.out}/compare.json, compare.md")
    return 0


def _checked_flow(metrics_url: str, model: str, before: dict[str, float], target: str, concurrency: int) -> int:
    """The requests the flow answered in a perf_analyzer run; raises if it refused or failed any,
    which Triton's statistics (and so perf_analyzer's server-side figures) count as successes."""
    after = _settled_flow_requests(metrics_url, model)
    outcome = {code: int(n - before.get(code, 0.0)) for code, n in after.items() if n != before.get(code, 0.0)}
    others = {code: n for code, n in outcome.items() if code != "OK"}
    if others:
        raise RuntimeError(f"perf_analyzer on {target} at concurrency {concurrency}: {model} answered "
                           f"{outcome.get('OK', 0)} and finished {others} otherwise ({FLOW_REQUESTS}); Triton's "
                           "statistics count those as successes")
    return outcome.get("OK", 0)


def _write(args: argparse.Namespace, runs: dict, unstable: list, targets: list[str], concurrency: list[int]) -> str:
    """compare.json (every round of each tool) and compare.md (the table) as they stand."""
    meta = {"protocol": args.protocol, "duration_s": args.duration, "warmup_s": args.warmup, "rounds": args.rounds,
            "perf_analyzer_window_ms": int(args.duration * 1000), "stability_percentage": args.stability,
            "perf_analyzer_unstable": unstable}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare.json").write_text(json.dumps(
        {"meta": meta,
         "runs": {f"{tool} {t} c={c}": {r: asdict(p) for r, p in ps.items()} for (tool, t, c), ps in runs.items()}},
        indent=2))
    report = _report(runs, targets, concurrency)
    (args.out / "compare.md").write_text(report)
    return report


def _report(runs: dict[tuple[str, str, int], dict[int, object]], targets: list[str], concurrency: list[int]) -> str:
    """Per point, each tool's median round side by side, and the median over rounds of
    perf_analyzer / bls-bench (each round's two measurements taken back to back)."""
    lines = ["| target | c | bls-bench images/s | perf_analyzer images/s | PA / bench (median of rounds) | "
             "p50 ms bench / PA | PA server queue / compute ms | flow's OK in PA's runs |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for target in targets:
        for c in concurrency:
            bench_runs, pa_runs = runs.get(("bench", target, c), {}), runs.get(("perf_analyzer", target, c), {})
            both = sorted(set(bench_runs) & set(pa_runs))
            if not both:
                continue
            b, p = _median(list(bench_runs.values())), _median(list(pa_runs.values()))
            ratio = statistics.median(pa_runs[r].images_per_s / bench_runs[r].images_per_s for r in both)
            answered = [pr.flow_answered for pr in pa_runs.values()]
            flow = "-" if None in answered else str(sum(answered))
            lines.append(f"| {target} | {c} | {b.images_per_s:.1f} | {p.images_per_s:.1f} | {ratio:.2f} ({len(both)}) "
                         f"| {b.p50_ms:.0f} / {p.p50_ms:.0f} | {p.server_queue_ms:.1f} / {p.server_compute_ms:.1f} | "
                         f"{flow} |")
    lines.append("")
    lines.append("Server queue / compute: Triton's statistics per request it counts a success, which for a flow "
                 "(python backend, Triton 2.51) takes in the requests the flow refused. A flow's OK: the requests it "
                 f"answered by its own {FLOW_REQUESTS}; a flow point where it finished any otherwise fails the run.")
    return "\n".join(lines) + "\n"


def _median(points: list):
    return sorted(points, key=lambda p: p.images_per_s)[len(points) // 2]


# ---- the command line --------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bls-perf", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("data", help="write perf_analyzer's --input-data file from images",
                       description="Write perf_analyzer's --input-data JSON: one request per image (IMAGE, BYTES).")
    d.add_argument("paths", nargs="+", metavar="FILE_OR_DIR")
    d.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    d.add_argument("--bench-set", action="store_true",
                   help="bls-bench's images instead of the files as they are: each JPEG cropped to 4:3 at 500x375, and "
                        "its mirror")
    d.add_argument("--expect", metavar="OUTPUTS",
                   help="comma-separated fixed-shape outputs (ROUTE; TEXT,REGION_COUNT for read_text) to add as "
                        "validation_data: what --model at --url answers for each image now; perf_analyzer then fails "
                        "on any other answer")
    d.add_argument("--request-parameter", type=request_parameter, action="append", default=[],
                   metavar="NAME:VALUE:TYPE",
                   help="with --expect: a request parameter to ask with, as perf_analyzer will send it "
                        "(skip_cascade:true:bool)")
    d.add_argument("--only-routes", metavar="BRANCHES",
                   help="with --expect ROUTE: keep only the images whose ROUTE now ends in one of these "
                        "comma-separated branches (confident: answers no load changes; an escalated image may come "
                        "back degraded under load)")
    d.add_argument("--model", default="classify_bls", help="with --expect: the model to ask")
    d.add_argument("--url", help="with --expect: the server (default 127.0.0.1:8001 for grpc, :8000 for http)")
    d.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    c = sub.add_parser("compare", help="bls-bench and perf_analyzer on the same targets, one server, one run",
                       description="Start one server on bls-bench's repository copy; measure each target at each "
                                   "concurrency with bls-bench's client and with perf_analyzer (closed loop), rounds "
                                   "interleaved; write compare.json and compare.md.")
    c.add_argument("--targets", default="cascade@0.5,classify_bls,ensemble_resnet50",
                   help="bls-bench's target names fed images (cascade@0.5, classify_bls, ensemble_resnet50, "
                        "classify_peer@MODEL, ...)")
    c.add_argument("--concurrency", default="1,8")
    c.add_argument("--duration", type=float, default=8.0,
                   help="bls-bench's measured seconds per point, and each perf_analyzer window (it needs 3 stable "
                        "ones)")
    c.add_argument("--warmup", type=float, default=2.0, help="bls-bench's seconds before measuring")
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--stability", type=float, default=25.0,
                   help="perf_analyzer's --stability-percentage (10 by default there: rarely met on a shared machine)")
    c.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    c.add_argument("--model-repository", type=Path, default=default_models())
    c.add_argument("--images", type=Path, default=default_samples(),
                   help="folder of JPEG photos (bls-bench's set is made from them)")
    c.add_argument("--perf-analyzer",
                   help="the perf_analyzer binary (default: through scripts/perf-tools.sh, else PATH)")
    c.add_argument("--out", type=Path, default=(checkout() or Path(".")) / "bench_results" / "perf")
    args = p.parse_args(argv)
    if args.command == "data":
        return _data_main(args)
    if args.model_repository is None or args.images is None:
        p.error("give --model-repository DIR and --images DIR (no checkout's models/ and samples/ here)")
    return _compare_main(args)


if __name__ == "__main__":
    sys.exit(main())
