"""Client for classify_bls over HTTP or gRPC, and the `bls-classify` command."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..contract import (BLS_MODEL, CLASS_IDS, IMAGE, LABELS, REGION_BOXES, REGION_COUNT, REGION_LABELS, REGION_OUTPUTS,
                        REGION_ROUTE, ROUTE, SCORES, STANDARD_OUTPUTS, TOPK)

__all__ = ["ClassifyClient", "FileResult", "check_server", "classify_files", "find_images", "main", "tritonclient_module"]

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}


def tritonclient_module(protocol: str):
    """tritonclient.http or tritonclient.grpc (the same API), imported on first use."""
    if protocol == "http":
        import tritonclient.http as tc
    elif protocol == "grpc":
        import tritonclient.grpc as tc
    else:
        raise ValueError(f"protocol must be 'http' or 'grpc', got {protocol!r}")
    return tc


@dataclass
class Region:
    box: list[float]  # x0, y0, x1, y1 in the image's pixels
    labels: list[str]  # "score:index:label", best first ([] when the flow answered it without labels)
    route: str
    outputs: dict[str, object]  # the flow's own per-region outputs (REGION_TEXT ...), as JSON values


@dataclass
class FileResult:
    path: str
    labels: list[str] | None = None  # "score:index:label", best first
    route: str | None = None
    error: str | None = None
    outputs: dict[str, object] | None = None  # the flow model's own outputs for this image (NEEDS_REVIEW ...)
    regions: list[Region] | None = None  # a region flow's regions (REGION_* outputs); None for other flows


def _value(v) -> object:
    """One output value as JSON: bytes decoded, arrays as lists."""
    if isinstance(v, np.ndarray):
        return [_value(x) for x in v.tolist()] if v.dtype != object else [_value(x) for x in v]
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list):
        return [_value(x) for x in v]
    return v.item() if isinstance(v, np.generic) else v


class ClassifyClient:
    """Thin wrapper over tritonclient; one `classify` call is one inference request."""

    def __init__(self, url: str, protocol: str = "http", concurrency: int = 1, model: str = BLS_MODEL):
        tc = tritonclient_module(protocol)
        # An HTTP client sends `concurrency` requests at once; a gRPC one has no such limit.
        self._client = tc.InferenceServerClient(url, concurrency=concurrency) if protocol == "http" else tc.InferenceServerClient(url)
        self._tc = tc
        self.model = model
        self._output_names: list[str] | None = None

    def output_names(self) -> list[str]:
        """Every output the model declares (the four of every flow, REGION_*, its own)."""
        if self._output_names is None:
            meta = self._client.get_model_metadata(self.model, **({} if self._tc.__name__.endswith("http") else {"as_json": True}))
            self._output_names = [o["name"] for o in meta.get("outputs", [])] or [o.name for o in (LABELS, SCORES, CLASS_IDS, ROUTE)]
        return self._output_names

    def classify(self, images: list[bytes], topk: int | None = None) -> dict[str, np.ndarray]:
        """Send images as one request; returns every output the model declares, by name
        (LABELS/SCORES/CLASS_IDS/ROUTE: one row per image; REGION_*: per image, padded to the
        most regions of the request, REGION_COUNT real).

        Raises tritonclient's InferenceServerException with the server's message on error.
        """
        tc = self._tc
        inputs = [tc.InferInput(IMAGE.name, [len(images), 1], "BYTES")]
        inputs[0].set_data_from_numpy(np.array(images, dtype=object).reshape(-1, 1))
        if topk is not None:
            t = tc.InferInput(TOPK.name, [len(images), 1], "INT32")
            t.set_data_from_numpy(np.full((len(images), 1), topk, dtype=np.int32))
            inputs.append(t)
        names = self.output_names()
        result = self._client.infer(self.model, inputs, outputs=[tc.InferRequestedOutput(name) for name in names])
        return {name: result.as_numpy(name) for name in names}

    def classify_file(self, path: Path, topk: int | None = None) -> FileResult:
        try:
            out = self.classify([Path(path).read_bytes()], topk)
        except Exception as exc:  # noqa: BLE001 - InferenceServerException, OSError
            return FileResult(str(path), error=_message(exc))
        return FileResult(str(path), labels=[v.decode() for v in out[LABELS.name][0]], route=out[ROUTE.name][0, 0].decode(),
                          outputs=_own_outputs(out, 0), regions=_regions(out, 0))

    def close(self) -> None:
        self._client.close()


def _own_outputs(out: dict[str, np.ndarray], image: int) -> dict[str, object] | None:
    own = {name: _value(value[image]) for name, value in out.items()
           if name not in STANDARD_OUTPUTS and name not in REGION_OUTPUTS and not name.startswith("REGION_")}
    return {name: value[0] if isinstance(value, list) and len(value) == 1 else value for name, value in own.items()} or None


def _regions(out: dict[str, np.ndarray], image: int) -> list[Region] | None:
    if REGION_COUNT.name not in out:
        return None
    count = int(out[REGION_COUNT.name][image, 0])
    own = [name for name in out if name.startswith("REGION_") and name not in REGION_OUTPUTS]

    def get(name: str, j: int):
        return _value(out[name][image, j]) if name in out else None

    return [Region(box=get(REGION_BOXES.name, j) or [], labels=[v for v in get(REGION_LABELS.name, j) or [] if v],
                   route=get(REGION_ROUTE.name, j) or "", outputs={name: get(name, j) for name in own})
            for j in range(count)]


def _message(exc: Exception) -> str:
    msg = getattr(exc, "message", None)
    return msg() if callable(msg) else str(exc)


def find_images(paths: list[str], skipped: list[Path] | None = None) -> list[Path]:
    """Files named, and the image files (by extension) in folders named; the other files of
    those folders go to `skipped`, so the caller can say what it left out."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file())
            found += [f for f in files if f.suffix.lower() in IMAGE_SUFFIXES]
            if skipped is not None:
                skipped += [f for f in files if f.suffix.lower() not in IMAGE_SUFFIXES]
        elif p.exists():
            found.append(p)
        else:
            raise FileNotFoundError(f"no such file or directory: {p}")
    return found


def check_server(url: str, protocol: str, model: str) -> str | None:
    """Why `model` cannot be asked at `url` (no server there, model not ready), or None."""
    tc = tritonclient_module(protocol)
    try:
        client = tc.InferenceServerClient(url)
        try:
            if not client.is_server_live():
                return f"the server at {url} ({protocol}) is not live"
            if not client.is_model_ready(model):
                return f"model {model} is not ready on the server at {url} ({protocol}): is it in that model repository, and loaded?"
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - connection refused, DNS, a gRPC port spoken to over HTTP...
        return f"cannot reach a Triton server at {url} ({protocol}): {_message(exc).splitlines()[0]}; is bls-serve running there?"
    return None


def classify_files(url: str, protocol: str, files: list[Path], topk: int | None, concurrency: int,
                   model: str = BLS_MODEL) -> list[FileResult]:
    """One request per file, `concurrency` in flight: Triton's dynamic batcher merges them,
    and a bad file fails only itself. One client per thread (tritonclient's HTTP client
    is not thread-safe)."""
    local = threading.local()
    clients: list[ClassifyClient] = []

    def classify(path: Path) -> FileResult:
        if not hasattr(local, "client"):
            local.client = ClassifyClient(url, protocol, model=model)
            clients.append(local.client)
        return local.client.classify_file(path, topk)

    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            jobs = pool.map(classify, files)
            return list(tqdm(jobs, total=len(files), desc="classify", unit="img", disable=len(files) < 8, file=sys.stderr))
    finally:
        for client in clients:
            client.close()


def _shown(value) -> str:
    """An output value on one line of the table: a string quoted when empty or when it
    holds line breaks (shown as \\n), a float to 3 decimals, lists item by item."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False) if not value or "\n" in value else value
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return str(value)


def format_table(results: list[FileResult]) -> str:
    width = max([len(Path(r.path).name) for r in results] + [4])
    lines = [f"{'file':<{width}}  {'score':>6}  {'class':<28}  route"]
    for r in results:
        name = Path(r.path).name
        if r.error:
            lines.append(f"{name:<{width}}  {'-':>6}  error: {r.error}")
            continue
        for i, item in enumerate(r.labels or []):
            if not item:  # a row the flow ended early: no labels, its ROUTE says why
                if i == 0:
                    lines.append(f"{name:<{width}}  {'-':>6}  {'(no label)':<28}  {r.route}")
                continue
            score, index, label = item.split(":", 2)
            lines.append(f"{name if i == 0 else '':<{width}}  {float(score):>6.3f}  {f'{label} ({index})':<28}  {r.route if i == 0 else ''}")
        for key, value in (r.outputs or {}).items():
            lines.append(f"{'':<{width}}  {key}: {_shown(value)}")
        for j, region in enumerate(r.regions or []):
            box = ",".join(f"{v:.0f}" for v in region.box)
            top = region.labels[0].split(":", 2) if region.labels else None
            label = f"{top[2]} ({float(top[0]):.2f})" if top else "(no label)"
            extra = "  ".join(f"{k}: {_shown(v)}" for k, v in region.outputs.items())
            lines.append(f"{'':<{width}}  region {j} [{box}]  {label}  {region.route}  {extra}".rstrip())
    return "\n".join(lines)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bls-classify", description="Classify image files with a flow model on a Triton server.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="FILE_OR_DIR")
    p.add_argument("--model", default=BLS_MODEL, help="any flow model (IMAGE in, LABELS and ROUTE out)")
    p.add_argument("--url", default=None, help="server address (default: 127.0.0.1:8000 for http, 127.0.0.1:8001 for grpc)")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--topk", type=_positive, default=None, help="labels per image (default: the model's default_topk)")
    p.add_argument("--concurrency", type=_positive, default=8, help="requests in flight")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    url = args.url or ("127.0.0.1:8000" if args.protocol == "http" else "127.0.0.1:8001")
    skipped: list[Path] = []
    try:
        files = find_images(args.paths, skipped)
    except FileNotFoundError as exc:
        print(f"bls-classify: error: {exc}", file=sys.stderr)
        return 2
    if skipped:
        names = ", ".join(f.name for f in skipped[:5]) + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else "")
        print(f"bls-classify: skipped {len(skipped)} file(s) whose extension is not an image's "
              f"({', '.join(sorted(IMAGE_SUFFIXES))}): {names}", file=sys.stderr)
    if not files:
        print("bls-classify: error: no image files found", file=sys.stderr)
        return 2
    problem = check_server(url, args.protocol, args.model)
    if problem:
        print(f"bls-classify: error: {problem}", file=sys.stderr)
        return 2
    results = classify_files(url, args.protocol, files, args.topk, args.concurrency, model=args.model)
    print(json.dumps([asdict(r) for r in results], indent=2) if args.json else format_table(results))
    return 1 if any(r.error for r in results) else 0
