"""`bls-bench`: load on classify_bls, its baselines and variants, and what their clients get.

Three modes, against a server bls-bench starts on a copy of the repository (bench_repository:
its targets as variants of the shipped models; --max-queue-size and --set change the copy) or a
running one (--url, --host and the port options):

    the concurrency sweep (default)  for each target and concurrency, N client threads send one
        image per request back to back for a fixed time: images/s, latency p50/p95/p99,
        errors and refusals (by Triton's queue or the model), Triton's server-side queue vs
        compute time per request; bench.json, bench.md, bench.png; also times
        decode+preprocess in process.
    --overload   goodput past capacity, per factor (overload.py): overload.json, overload.md.
    --open-loop  Poisson arrivals below capacity, per load (openloop.py): openloop.json, openloop.md.

The images: by default each photo centre-cropped to 4:3 and resized to 500x375 with its mirror
(the set docs/performance.md's tables were measured with), which bls-bench says per file before
it sends anything and in every table; --image-size original sends the files as given, and
--heavy-images N adds 12-megapixel JPEGs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from ..serve.client import tritonclient_module
from ..contract import LABELS
from .loadgen import FinishedCounter, MetricsUnreadable
from ..runtime.load.loader import is_flow_model
from ..serve.repository import export_hint
from ..serve.paths import checkout, default_models, default_samples, shared_mug
from ..serve.options import ServerOptions, free_port
from ..serve.server import TritonServer
from .bench_images import (HEAVY_SIZE, IMAGE_SIZE, ORIGINAL, announce, image_set, make_image_set, parse_image_size,
                           region_pages, synthetic_12mp, tensor_set)
from .bench_sweep import Point, markdown, plot, ratios, run_point, time_preprocess, top1_with_and_without_draft
from .bench_targets import (CASCADES, CLASSIFIER, DEFAULT_TARGET, HANDWRITTEN, HANDWRITTEN_CALLS, OPEN_LOOP_TARGETS,
                            OVERLOAD_TARGETS, PEER, REGION_TARGETS, RUNNING_SERVED, SHADOW_TARGET, TARGETS,
                            served_model,
                            engine_of, fed_tensors, parse_setting, repository_for, serve_with, served_description)

__all__ = ["Endpoints", "main", "parse_args", "running_endpoints"]

# The overload mode's clients: with only their own deadline (a gRPC deadline, an HTTP
# client's timeout: what nearly every client sends), or also Triton's `timeout` parameter.
CLIENT_KINDS = ("deadline", "timeout")


def _machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    from importlib.metadata import version

    versions = ", ".join(f"{p} {version(p)}" for p in ("nvidia-pytriton", "onnxruntime", "torch", "pillow", "numpy"))
    return {"machine": f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}", "versions": versions}


# ---- the server: a running one, or one bls-bench starts ------------------------------------------
# A running server's ports where none is given: Triton's own (8000, 8001, 8002), as ServerOptions has them.
PORT_DEFAULTS = {what: ServerOptions.__dataclass_fields__[f"{what}_port"].default
                 for what in ("http", "grpc", "metrics")}


@dataclass(frozen=True)
class Endpoints:
    """Where a server answers: HOST:PORT for each protocol's tritonclient, and its metrics URL."""

    http: str
    grpc: str
    metrics: str

    def url(self, protocol: str) -> str:
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be 'http' or 'grpc', got {protocol!r}")
        return self.http if protocol == "http" else self.grpc


def running_endpoints(url: str | None, host: str | None, ports: dict[str, int | None], metrics_url: str | None,
                      protocol: str) -> Endpoints | None:
    """The running server that --url or --host names; None for neither (bls-bench starts one).
    --url HOST:PORT is --protocol's endpoint (HOST alone: every port from the options); the
    other protocol and the metrics are on the same host at --http-port, --grpc-port and
    --metrics-port (`ports`; Triton's 8000, 8001, 8002 where None), or at --metrics-url."""
    if url is None and host is None:
        return None
    ports = dict(ports)
    if url is not None:
        if "/" in url:
            raise ValueError(f"--url: give HOST:PORT, as tritonclient takes it (e.g. 127.0.0.1:8001), not {url!r}")
        url_host, sep, port = url.rpartition(":")
        url_host, port = (url_host, port) if sep else (url, "")
        if port and not port.isdigit():
            raise ValueError(f"--url: {url!r} has no port number after its host")
        if host is not None and host != url_host:
            raise ValueError(f"--url {url} and --host {host} name two hosts: give one")
        if port and ports.get(protocol) not in (None, int(port)):
            raise ValueError(f"--url {url} and --{protocol}-port {ports[protocol]} name two {protocol} ports: give one")
        if port:
            ports[protocol] = int(port)
        host = url_host
    ports = {what: ports.get(what) or default for what, default in PORT_DEFAULTS.items()}
    return Endpoints(f"{host}:{ports['http']}", f"{host}:{ports['grpc']}",
                     metrics_url or f"http://{host}:{ports['metrics']}/metrics")


def _check_ready(endpoints: Endpoints, protocols: list[str], models: dict[str, str]) -> None:
    """Every target's model (`models`: target -> model) READY on the running server, over each
    protocol the run uses; else a SystemExit naming what is not."""

    for protocol in protocols:
        url = endpoints.url(protocol)
        client = tritonclient_module(protocol).InferenceServerClient(url)
        try:
            missing = {t: m for t, m in models.items() if not client.is_model_ready(m)}
        except Exception as exc:  # noqa: BLE001 - any failure to reach it is named
            raise SystemExit(f"bls-bench: cannot reach the server's {protocol} endpoint at {url} ({exc}); "
                             "give its ports: --http-port, --grpc-port (and --metrics-port)") from exc
        finally:
            client.close()
        if missing:
            raise SystemExit(f"bls-bench: the server at {url} has no READY model for: "
                             + ", ".join(f"{t} ({m})" for t, m in missing.items()))


# ---- the command ------------------------------------------------------------------------------
DEFAULT_DEADLINE_S = {"overload": 0.5, "open_loop": 2.0}


def _floats(option: str, text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(not v > 0 for v in values):
        raise ValueError(f"{option}: {text!r} is not a comma-separated list of numbers above 0")
    return values


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bls-bench", description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="1,2,4,8,16,32",
                   help="comma-separated sweep: closed-loop clients per point")
    p.add_argument("--duration", type=float, default=15.0,
                   help="seconds measured per point (longer until every client sent a request in them); with "
                        "--open-loop, per load")
    p.add_argument("--warmup", type=float, default=3.0,
                   help="seconds per point (with --open-loop, per load) before measuring")
    p.add_argument("--targets", default=None,
                   help=f"any of {', '.join(TARGETS + tuple(CASCADES))}, classifier@MODEL, classify_bls@MODEL or "
                        f"{PEER}@MODEL for a classifier MODEL of the repository (e.g. resnet50_int8), or any flow "
                        f"model in the repository (as it is configured); default {','.join(TARGETS)} (--overload: "
                        f"{','.join(OVERLOAD_TARGETS)}; "
                        f"--open-loop: {','.join(OPEN_LOOP_TARGETS)})")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure each point this many times (interleaved); report the median")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc", help="the concurrency sweep's protocol")
    p.add_argument("--model-repository", type=Path, default=default_models(),
                   help="default: ./models or the checkout's")
    p.add_argument("--images", type=Path, default=default_samples(),
                   help="folder of JPEG photos, *.jpg and *.jpeg (default: the checkout's samples/)")
    p.add_argument("--image-size", default=f"{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}",
                   help="WxH: each photo centre-cropped to 4:3, resized to WxH and re-encoded, sent with its mirror "
                        f"(default {IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}, as docs/performance.md's tables were measured); "
                        f"{ORIGINAL}: the files as given. bls-bench says per file what it sends.")
    p.add_argument("--heavy-images", type=int, default=0, metavar="N",
                   help=f"add N heavy {HEAVY_SIZE[0]}x{HEAVY_SIZE[1]} (12-megapixel) JPEGs to the images sent, each a "
                        "photo scaled up (every mode)")
    p.add_argument("--keep-branches", action="store_true",
                   help="keep classify_bls's tta_threshold (default: 0, like the ensemble)")
    p.add_argument("--shadow-share", type=float, default=1.0, help=f"the {SHADOW_TARGET} target's shadow_share")
    p.add_argument("--out", type=Path, default=(checkout() or Path(".")) / "bench_results")
    server = p.add_argument_group(
        "the server: without --url or --host bls-bench starts one on a copy of --model-repository (on loopback, on the "
        "ports given, free ports otherwise)")
    server.add_argument("--url",
                        help="use a running server (its own config) instead of starting one: HOST:PORT of --protocol's "
                             "endpoint (HOST alone: the ports below)")
    server.add_argument("--host", help="use a running server on HOST instead of starting one, at the ports below")
    server.add_argument("--http-port", type=int,
                        help=f"HTTP port (a running server's: default {PORT_DEFAULTS['http']})")
    server.add_argument("--grpc-port", type=int,
                        help=f"gRPC port (a running server's: default {PORT_DEFAULTS['grpc']})")
    server.add_argument("--metrics-port", type=int,
                        help=f"metrics port, where the flows' own counts are read (a running server's: default "
                             f"{PORT_DEFAULTS['metrics']})")
    server.add_argument("--metrics-url", help="a running server's metrics URL, if not http://HOST:METRICS_PORT/metrics")
    server.add_argument("--max-queue-size", type=int, metavar="N",
                        help="serve classify_bls, every variant of it and the one-model peers with this queue bound "
                             "(dynamic_batching default_queue_policy max_queue_size; 0: unbounded) in bls-bench's copy")
    server.add_argument("--set", action="append", default=[], metavar="MODEL.PARAMETER=VALUE", dest="set",
                        help="a parameter of MODEL (a model or target; classify_bls: it and every variant of it) in "
                             "bls-bench's copy, e.g. classify_bls.latency_target_ms=0; may repeat")
    load = p.add_argument_group(
        "overload (--overload) and open-loop (--open-loop) modes: asyncio clients in one thread, each target over each "
        "protocol and client kind in turn; --concurrency and --rounds do not apply")
    load.add_argument("--overload", action="store_true",
                      help="measure goodput past capacity (bls_pipeline/tools/overload.py): capacity, then a spike of "
                           "clients with deadlines per --factor, then recovery")
    load.add_argument("--open-loop", metavar="LOADS",
                      help="measure below capacity (bls_pipeline/tools/openloop.py): capacity, then Poisson arrivals "
                           "at each of these fractions of it, e.g. 0.5,0.8,0.95, --duration seconds each")
    load.add_argument("--protocols", default="grpc,http", help="the protocols to measure, in turn")
    load.add_argument("--deadline", type=float, default=None,
                      help=f"each request's deadline, seconds (default: --overload {DEFAULT_DEADLINE_S['overload']}, "
                           f"--open-loop {DEFAULT_DEADLINE_S['open_loop']}); over gRPC the call's deadline, over HTTP "
                           "the client's timeout")
    load.add_argument("--clients", default=None,
                      help="the client kinds, each in turn: deadline (only their own: a gRPC deadline, an HTTP "
                           "client's timeout), timeout (also Triton's timeout request parameter); default: --overload "
                           f"{','.join(CLIENT_KINDS)}, --open-loop deadline")
    load.add_argument("--capacity-clients", type=int, default=8,
                      help="closed-loop clients that measure capacity (and recovery)")
    load.add_argument("--capacity-duration", type=float, default=10.0, help="seconds measured for capacity")
    load.add_argument("--capacity", type=float, metavar="REQUESTS_PER_S",
                      help="open loop: take this capacity instead of measuring it (the same arrival rates across "
                           "servers)")
    load.add_argument("--factor", default="4",
                      help="overload: clients = factor x capacity x deadline; several: 4,8 (a row each)")
    load.add_argument("--spike", type=float, default=30.0, help="overload: seconds of each spike")
    load.add_argument("--recovery", type=float, default=10.0, help="overload: seconds watched after each spike")
    load.add_argument("--no-timeout-parameter", action="store_true", help="overload: the same as --clients deadline")
    return p


def _parsed(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The options, with their lists parsed and checked (p.error on a bad one)."""
    args = p.parse_args(argv)
    mode = "overload" if args.overload else "open_loop" if args.open_loop else None
    args.mode = mode
    try:
        if args.overload and args.open_loop:
            raise ValueError("--overload and --open-loop are two runs: give one")
        args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
        default = {"overload": OVERLOAD_TARGETS, "open_loop": OPEN_LOOP_TARGETS}.get(mode, TARGETS)
        args.targets = [t for t in (args.targets or ",".join(default)).split(",") if t]
        args.size = parse_image_size(args.image_size)
        if args.heavy_images < 0:
            raise ValueError(f"--heavy-images: {args.heavy_images} is below 0")
        args.factors = _floats("--factor", args.factor)
        args.loads = _floats("--open-loop", args.open_loop) if args.open_loop else []
        args.settings = [parse_setting(s) for s in args.set]
        args.running = running_endpoints(args.url, args.host, {"http": args.http_port, "grpc": args.grpc_port,
                                                               "metrics": args.metrics_port}, args.metrics_url,
                                         args.protocol)
        if args.running is None and args.metrics_url:
            raise ValueError("--metrics-url is a running server's (with --url or --host); bls-bench knows its own "
                             "server's")
        if args.running is not None and (args.max_queue_size is not None or args.settings):
            raise ValueError("--max-queue-size and --set change bls-bench's own copy of the repository: not with --url "
                             "or --host")
        if args.max_queue_size is not None and args.max_queue_size < 0:
            raise ValueError(f"--max-queue-size: {args.max_queue_size} is below 0 (0: unbounded)")
        if args.capacity is not None and mode != "open_loop":
            raise ValueError("--capacity is for --open-loop")
        args.protocol_list = [x for x in args.protocols.split(",") if x] if mode else [args.protocol]
        if set(args.protocol_list) - {"grpc", "http"}:
            raise ValueError(f"--protocols: {args.protocols!r}; use grpc, http or grpc,http")
        kinds = ("deadline" if args.no_timeout_parameter or (mode == "open_loop" and args.clients is None)
                 else args.clients)
        args.kinds = [k for k in (kinds or ",".join(CLIENT_KINDS)).split(",") if k]
        if set(args.kinds) - set(CLIENT_KINDS):
            raise ValueError(f"--clients: unknown kind(s) {sorted(set(args.kinds) - set(CLIENT_KINDS))}; use "
                             f"{','.join(CLIENT_KINDS)}")
        if args.deadline is None and mode:
            args.deadline = DEFAULT_DEADLINE_S[mode]
    except ValueError as exc:
        p.error(str(exc))
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """bls-bench's options, parsed and checked (what main runs with)."""
    return _parsed(_parser(), argv)


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = _parsed(p, argv)
    targets = args.targets
    if args.model_repository is None or args.images is None:
        p.error("give --model-repository DIR and --images DIR (no checkout's models/ and samples/ here)")
    flows = sorted(d.name for d in args.model_repository.iterdir() if is_flow_model(d))
    engines = tuple(sorted({e[1] for t in targets if (e := engine_of(t))}))
    bad = sorted(set(targets) - set(TARGETS) - set(CASCADES) - set(flows) - set(REGION_TARGETS)
                 - {SHADOW_TARGET, DEFAULT_TARGET}
                 - {t for t in targets if (e := engine_of(t))
                    and (args.model_repository / e[1] / "config.pbtxt").is_file()})
    if bad:
        p.error(f"unknown targets {bad}; choose from {', '.join(TARGETS + tuple(CASCADES))} or a flow model "
                f"({', '.join(flows)})")
    files = sorted(f for f in args.images.iterdir() if f.suffix.lower() in (".jpg", ".jpeg") and f.is_file())
    try:
        images = image_set(files, args.size, args.heavy_images)
    except ValueError as exc:
        p.error(str(exc))
    print(announce(images, args.size), file=sys.stderr)
    points: list[Point] = []
    runs: dict[tuple[str, int], list[Point]] = {}
    server = None
    workdir = None
    endpoints = args.running
    served = RUNNING_SERVED
    try:
        if endpoints is None:
            workdir = Path(tempfile.mkdtemp(prefix="bls-bench-"))
            repo = workdir / "models"
            repository_for(targets, args.model_repository, repo, args.keep_branches, args.shadow_share)
            try:
                serve_with(repo, args.max_queue_size, args.settings)
            except ValueError as exc:
                p.error(str(exc))
            served = served_description(repo, targets, args.max_queue_size, args.settings)
            needed = {served_model(t) for t in targets} | (set(HANDWRITTEN_CALLS) if HANDWRITTEN in targets else set())
            if any(served_model(t).startswith("classify_bls") and engine_of(t) is None and t != DEFAULT_TARGET
                   for t in targets):
                needed.add(CLASSIFIER)  # the bench's flows call it: without it, their answers are degraded
            needed = tuple(sorted(needed))
            server = TritonServer(ServerOptions(repo, http_port=args.http_port or free_port(),
                                                grpc_port=args.grpc_port or free_port(),
                                                metrics_port=args.metrics_port or free_port(),
                                                log_file=workdir / "tritonserver.log", models=needed))
            missing = server.not_loaded(needed)  # before any work
            if missing and set(missing) & set(engines):
                p.error(f"cannot benchmark without {missing}: build the engines first "
                        "(python -m engine_build int8 --help, python -m engine_build openvino --help)")
            if missing:
                p.error(f"cannot benchmark without {', '.join(missing)} ({missing}); random resnet50 weights will do: "
                        + export_hint("resnet50_onnx", weights="random"))
        if not args.mode:  # the sweep's own inputs, before the server starts
            if not images.sources:
                p.error("none of the files is an image Pillow reads: the sweep times decode+preprocess on one")
            try:
                tensors = tensor_set(images.payloads) if any(fed_tensors(t) for t in targets) else []
            except Exception as exc:  # noqa: BLE001 - a file sent as given that does not decode
                p.error(f"the classifier targets are sent decoded tensors, and an image does not decode ({exc}): "
                        "leave them out, or the files that are no images")
            pages = region_pages(default_samples())
            big = shared_mug()
            big_bytes = big.read_bytes() if big else synthetic_12mp(images.sources[0])
            small = make_image_set(images.sources[:1])[0]
            prep = time_preprocess({"500x375 JPEG": small,
                                    "12MP JPEG (3361x2521)" if big else "12MP JPEG (synthetic 4000x3000)": big_bytes})
            top1 = top1_with_and_without_draft(args.model_repository / CLASSIFIER / "1" / "model.onnx", big_bytes)
        if server is not None:
            server.start()
            endpoints = Endpoints(server.http_url, server.grpc_url, server.metrics_url)
        else:
            _check_ready(endpoints, args.protocol_list, {t: served_model(t) for t in targets})
        print(f"bls-bench serves: {served}; HTTP {endpoints.http}, gRPC {endpoints.grpc}, metrics {endpoints.metrics}",
              file=sys.stderr)
        context = {"image_set": images.summary, "image_notes": images.notes, "served": served,
                   "endpoints": asdict(endpoints)}
        if args.mode:
            # A flow's answers are read from its own count on the metrics port, with --url as
            # without: checked here, before any load, so a wrong port fails at once.
            known = {t: True if served_model(t) in flows or served_model(t).startswith("classify_bls") else None
                     for t in targets}
            try:
                is_flow = {t: FinishedCounter.for_model(served_model(t), endpoints.metrics,
                                                        endpoints.url(args.protocol_list[0]),
                                                        args.protocol_list[0], known[t]).by_flow for t in targets}
            except MetricsUnreadable as exc:
                raise SystemExit(f"bls-bench: {exc}") from exc
            run = _overload if args.overload else _open_loop
            return run(args, targets, images.payloads, endpoints, server, is_flow, context)
        url = endpoints.url(args.protocol)
        # Interleaved (every target at one concurrency, then the next; rounds outermost):
        # drift on a shared machine hits every target alike.
        grid = [(r, t, c) for r in range(args.rounds) for c in args.concurrency for t in targets]
        for _, target, c in tqdm(grid, desc="bench", unit="point"):
            payloads = tensors if fed_tensors(target) else pages if target in REGION_TARGETS else images.payloads
            runs.setdefault((target, c), []).append(run_point(url, args.protocol, target, c, payloads, args.duration,
                                                              args.warmup))
        points = [sorted(rs, key=lambda pt: pt.images_per_s)[len(rs) // 2] for rs in runs.values()]
    finally:
        if server is not None:
            server.stop()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    points.sort(key=lambda pt: (targets.index(pt.target), pt.concurrency))
    meta = {**_machine(), "protocol": args.protocol, "duration_s": args.duration, "warmup_s": args.warmup,
            "images": len(images.payloads), **context, "pages": len(pages), "rounds": args.rounds,
            "keep_branches": args.keep_branches, "shadow_share": args.shadow_share, "top1_12mp_draft_vs_full": top1}
    meta["ratios"], meta["ratios_per_round"] = ratios(runs, prep)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps({"meta": meta, "points": [asdict(pt) for pt in points],
                                                     "preprocess": prep}, indent=2))
    table = markdown(points, prep, meta)
    if top1 is not None:
        table += (f"\n12MP top-1 class with draft decode: {top1[0]}, with full decode: {top1[1]} "
                  f"({'unchanged' if top1[0] == top1[1] else 'CHANGED'}).\n")
    (args.out / "bench.md").write_text(table)
    plot(points, args.out / "bench.png")
    print(table)
    print(f"wrote {args.out}/bench.json, bench.md, bench.png")
    return 0


def _load_grid(args, targets: list[str]) -> list[tuple[str, str, str]]:
    return [(t, proto, kind) for proto in args.protocol_list for kind in args.kinds for t in targets]


def _overload(args, targets: list[str], payloads: list[bytes], endpoints: Endpoints, server, is_flow: dict[str, bool],
              context: dict) -> int:
    """--overload: each target over each protocol and client kind in turn, one server
    (bls_pipeline/tools/overload.py); each factor a row."""
    from . import overload

    results = []
    meta = {**_machine(), **context, "deadline_s": args.deadline, "factor": args.factors[0], "factors": args.factors,
            "capacity_clients": args.capacity_clients, "capacity_s": args.capacity_duration, "spike_s": args.spike,
            "recovery_s": args.recovery}
    for target, protocol, kind in tqdm(_load_grid(args, targets), desc="overload", unit="target"):
        results += overload.run_factors(
            endpoints.url(protocol), protocol, target, served_model(target), payloads, output=LABELS.name,
            is_flow=is_flow[target],
            metrics_url=endpoints.metrics, deadline_s=args.deadline, factors=tuple(args.factors),
            capacity_clients=args.capacity_clients, capacity_s=args.capacity_duration, spike_s=args.spike,
            recovery_s=args.recovery, warmup_s=args.warmup, timeout_parameter=kind == "timeout")
        _save(args.out, "overload", meta, results)
    if server is not None:  # the stop after the spikes, as an operator's SIGTERM would find the server
        start = time.monotonic()
        code = server.stop()
        meta["stop"] = {"seconds": round(time.monotonic() - start, 2), "exit_code": code,
                        "drained": server.last_stop.drained}
        _save(args.out, "overload", meta, results)
    return _report(args.out, "overload", overload.markdown(results, meta))


def _open_loop(args, targets: list[str], payloads: list[bytes], endpoints: Endpoints, server, is_flow: dict[str, bool],
               context: dict) -> int:
    """--open-loop: each target over each protocol and client kind in turn, one server
    (bls_pipeline/tools/openloop.py); each load a row."""
    from . import openloop

    results = []
    capacity = (f"{args.capacity:g} requests/s, as given (--capacity)" if args.capacity is not None else
                f"measured first per target, protocol and client kind: {args.capacity_clients} closed-loop clients, no "
                f"deadline, {args.capacity_duration} s after {args.warmup} s")
    meta = {**_machine(), **context, "capacity": capacity, "loads": args.loads, "deadline_s": args.deadline,
            "duration_s": args.duration, "warmup_s": args.warmup}
    for target, protocol, kind in tqdm(_load_grid(args, targets), desc="open loop", unit="target"):
        results += openloop.run_target(
            endpoints.url(protocol), protocol, target, served_model(target), payloads, output=LABELS.name,
            loads=tuple(args.loads),
            is_flow=is_flow[target], metrics_url=endpoints.metrics, deadline_s=args.deadline, duration_s=args.duration,
            warmup_s=args.warmup, capacity_clients=args.capacity_clients, capacity_s=args.capacity_duration,
            capacity=args.capacity, timeout_parameter=kind == "timeout")
        _save(args.out, "openloop", meta, results)
    return _report(args.out, "openloop", openloop.markdown(results, meta))


def _save(out: Path, stem: str, meta: dict, results: list) -> None:
    """A load mode's results so far in out/STEM.json: written after each target, so what ran
    is on disk if a later one fails."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=2))


def _report(out: Path, stem: str, table: str) -> int:
    """A load mode's table in out/STEM.md, and on stdout."""
    (out / f"{stem}.md").write_text(table)
    print(table)
    print(f"wrote {out}/{stem}.json, {stem}.md")
    return 0
