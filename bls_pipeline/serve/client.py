"""Client for classify_bls over HTTP or gRPC, and the `bls-classify` command."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..contract import BLS_MODEL, CLASS_IDS, IMAGE, JSON, LABELS, ROUTE, SCORES, TOPK
from ..runtime.answer.answer_json import documents
from ..stages.decode import IMAGE_SUFFIXES

__all__ = ["ClassifyClient", "FileResult", "check_server", "classify_files", "find_images", "format_table", "main",
           "tritonclient_module"]



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
class FileResult:
    path: str
    # The image's answer as the JSON output's document (runtime/answer/answer_json.py): route,
    # labels, scores, class_ids, the flow's own outputs, its regions. None when it failed.
    document: dict | None = None
    error: str | None = None

    def json_line(self) -> str:
        """--json: the file and its document (or its error) on one line."""
        body = {"error": self.error} if self.error is not None else (self.document or {})
        return json.dumps({"file": self.path, **body}, ensure_ascii=False)


class ClassifyClient:
    """Thin wrapper over tritonclient; one `classify` call is one inference request."""

    def __init__(self, url: str, protocol: str = "http", concurrency: int = 1, model: str = BLS_MODEL):
        tc = tritonclient_module(protocol)
        # An HTTP client sends `concurrency` requests at once; a gRPC one has no such limit.
        self._client = (tc.InferenceServerClient(url, concurrency=concurrency) if protocol == "http"
                        else tc.InferenceServerClient(url))
        self._tc = tc
        self.model = model
        self._outputs: dict[str, tuple[int, ...]] | None = None

    def output_dims(self) -> dict[str, tuple[int, ...]]:
        """Every output the model declares (the four of every flow, REGION_*, JSON, its own),
        with its dims without the batch."""
        if self._outputs is None:
            meta = self._client.get_model_metadata(self.model,
                                                   **({} if self._tc.__name__.endswith("http") else {"as_json": True}))
            self._outputs = ({o["name"]: tuple(int(d) for d in o.get("shape", [-1, -1])[1:])
                              for o in meta.get("outputs", [])}
                             or {LABELS.name: (-1,), SCORES.name: (-1,), CLASS_IDS.name: (-1,), ROUTE.name: (1,)})
        return self._outputs

    def output_names(self) -> list[str]:
        return list(self.output_dims())

    def classify(self, images: list[bytes], topk: int | None = None, outputs: list[str] | None = None,
                 timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """Send images as one request; returns the outputs named (default: every output the
        model declares), by name (LABELS/SCORES/CLASS_IDS/ROUTE/JSON: one row per image;
        REGION_*: per image, padded to the most regions of the request, REGION_COUNT real).
        timeout_s: the request's deadline (Triton's `timeout` parameter): the flow aims at it
        instead of its latency_target_ms.

        Raises tritonclient's InferenceServerException with the server's message on error.
        """
        tc = self._tc
        inputs = [tc.InferInput(IMAGE.name, [len(images), 1], "BYTES")]
        inputs[0].set_data_from_numpy(np.array(images, dtype=object).reshape(-1, 1))
        if topk is not None:
            t = tc.InferInput(TOPK.name, [len(images), 1], "INT32")
            t.set_data_from_numpy(np.full((len(images), 1), topk, dtype=np.int32))
            inputs.append(t)
        names = outputs or self.output_names()
        deadline = {} if timeout_s is None else {"timeout": max(1, int(timeout_s * 1e6))}
        result = self._client.infer(self.model, inputs, outputs=[tc.InferRequestedOutput(name) for name in names],
                                    **deadline)
        return {name: result.as_numpy(name) for name in names}

    def answers(self, images: list[bytes], topk: int | None = None, timeout_s: float | None = None) -> list[dict]:
        """Each image's answer as a JSON document (runtime/answer/answer_json.py): the model's JSON
        output when it declares one (nothing else is asked for), else the same document made
        here from its tensors."""
        dims = self.output_dims()
        if JSON.name in dims:
            rows = self.classify(images, topk, outputs=[JSON.name], timeout_s=timeout_s)[JSON.name]
            return [json.loads(row) for row in rows[:, 0]]
        return documents(self.classify(images, topk, timeout_s=timeout_s), dims)

    def classify_file(self, path: Path, topk: int | None = None, timeout_s: float | None = None) -> FileResult:
        try:
            (document,) = self.answers([Path(path).read_bytes()], topk, timeout_s)
        except Exception as exc:  # noqa: BLE001 - InferenceServerException, OSError
            return FileResult(str(path), error=_message(exc))
        return FileResult(str(path), document=document)

    def close(self) -> None:
        self._client.close()


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
                return (f"model {model} is not ready on the server at {url} ({protocol}): is it in that model "
                        "repository, and loaded?")
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - connection refused, DNS, a gRPC port spoken to over HTTP...
        return (f"cannot reach a Triton server at {url} ({protocol}): {_message(exc).splitlines()[0]}; is bls-serve "
                "running there?")
    return None


def classify_files(url: str, protocol: str, files: list[Path], topk: int | None, concurrency: int,
                   model: str = BLS_MODEL, timeout_s: float | None = None) -> list[FileResult]:
    """One request per file, `concurrency` in flight: Triton's dynamic batcher merges them,
    and a bad file fails only itself. One client per thread (tritonclient's HTTP client
    is not thread-safe)."""
    local = threading.local()
    clients: list[ClassifyClient] = []

    def classify(path: Path) -> FileResult:
        if not hasattr(local, "client"):
            local.client = ClassifyClient(url, protocol, model=model)
            clients.append(local.client)
        return local.client.classify_file(path, topk, timeout_s)

    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            jobs = pool.map(classify, files)
            return list(tqdm(jobs, total=len(files), desc="classify", unit="img", disable=len(files) < 8,
                             file=sys.stderr))
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
    """One row per label of each image (its route on the first), then the flow's own outputs
    and the image's regions, one line each, all read from its JSON document."""
    width = max([len(Path(r.path).name) for r in results] + [4])
    lines = [f"{'file':<{width}}  {'score':>6}  {'class':<28}  route"]
    for r in results:
        name = Path(r.path).name
        if r.error:
            lines.append(f"{name:<{width}}  {'-':>6}  error: {r.error}")
            continue
        doc = r.document or {}
        route = doc.get("route", "")
        top = list(zip(doc.get("labels", []), doc.get("scores", []), doc.get("class_ids", [])))
        if not top:  # ended early by the flow: no labels, its ROUTE says why
            lines.append(f"{name:<{width}}  {'-':>6}  {'(no label)':<28}  {route}")
        for i, (label, score, index) in enumerate(top):
            lines.append(f"{name if i == 0 else '':<{width}}  {_score(score, 3):>6}  {f'{label} ({index})':<28}  "
                         f"{route if i == 0 else ''}".rstrip())
        for key, value in (doc.get("outputs") or {}).items():
            lines.append(f"{'':<{width}}  {key}: {_shown(value)}")
        for j, region in enumerate(doc.get("regions") or []):
            box = ",".join(f"{v:.0f}" for v in region.get("box", []))
            labels, scores = region.get("labels") or [], region.get("scores") or []
            label = f"{labels[0]} ({_score(scores[0] if scores else None, 2)})" if labels else "(no label)"
            extra = "  ".join(f"{k}: {_shown(v)}" for k, v in (region.get("outputs") or {}).items())
            lines.append(f"{'':<{width}}  region {j} [{box}]  {label}  {region.get('route', '')}  {extra}".rstrip())
    return "\n".join(lines)


def _score(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bls-classify",
                                description="Classify image files with a flow model on a Triton server.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="FILE_OR_DIR")
    p.add_argument("--model", default=BLS_MODEL, help="any flow model (IMAGE in, LABELS and ROUTE out)")
    p.add_argument("--url", default=None,
                   help="server address (default: 127.0.0.1:8000 for http, 127.0.0.1:8001 for grpc)")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--topk", type=_positive, default=None, help="labels per image (default: the model's default_topk)")
    p.add_argument("--concurrency", type=_positive, default=8, help="requests in flight")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="each request's deadline, sent as Triton's timeout parameter: the flow aims at it (its "
                        "optional stages skipped past it, answered degraded) instead of its latency_target_ms")
    p.add_argument("--json", action="store_true",
                   help="print each image's answer as one JSON object per line (its file, then the JSON output's "
                        "document: route, labels, scores, class_ids, outputs, regions) instead of a table")
    p.add_argument("--draw", metavar="DIR", type=Path, default=None,
                   help="also write each image into DIR as PNG with its answer drawn on it: its regions' boxes and "
                        "captions, its top label")
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
    results = classify_files(url, args.protocol, files, args.topk, args.concurrency, model=args.model,
                             timeout_s=args.timeout)
    print("\n".join(r.json_line() for r in results) if args.json else format_table(results))
    if args.draw is not None:
        drawn = draw_results(results, args.draw)
        print(f"bls-classify: drew {len(drawn)} image(s) into {args.draw}", file=sys.stderr)
    return 1 if any(r.error for r in results) else 0


def draw_results(results: list[FileResult], folder: Path) -> list[Path]:
    """--draw: each answered image as folder/<name>.png with its answer drawn on it (a second
    file of the same name gets -2, -3, ...); the failed ones are left out."""
    from .draw import draw_answer

    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for r in results:
        if r.document is None:
            continue
        stem, n = Path(r.path).stem, 1
        while (target := folder / (f"{stem}.png" if n == 1 else f"{stem}-{n}.png")) in written:
            n += 1
        draw_answer(Path(r.path).read_bytes(), r.document).save(target, "PNG")
        written.append(target)
    return written
