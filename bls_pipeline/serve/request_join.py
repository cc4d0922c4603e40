"""Where one request's time went: Triton's trace of it (queue, compute) joined with the flow's
record of the execute() that answered it (adapter/records.py: read, decode, each child call,
the flow's own code, the answers, probes beside it, the responses), and the trace of the
child calls. What `bls-explain` prints and bls-serve's /requests answers.

The join: the record of the flow model's execute() that lies inside the request's
COMPUTE_START..COMPUTE_END (both on CLOCK_MONOTONIC), the one naming the request's id if
several do. The parts then cover the compute: the hand-over to the stub before the
execute() began, its parts, and the hand-back after it ended.

Pure: traces and records in, a JSON-able breakdown out.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from .traces import CANCELLED, QUEUE_FULL, QUEUE_TIMEOUT, RequestTrace

__all__ = ["explain", "slowest"]

_SLACK_NS = 500_000  # a record's bounds may sit this far outside the trace's (clock reads a hair apart)

# A request the model never saw, by how it left Triton's queue (RequestTrace.unserved).
_UNSERVED = {
    QUEUE_FULL: "refused by Triton's queue, full (Exceeds maximum queue size): the model never saw it",
    QUEUE_TIMEOUT: "refused by Triton's queue once it waited out its timeout (Request timeout expired): the model "
                   "never saw it",
    CANCELLED: "its client had gone (cancelled, or its gRPC deadline passed) while it waited in Triton's queue: "
               "dropped there, not refused; the model never saw it",
}


def slowest(traces: Iterable[RequestTrace], n: int, exclude_ids: Sequence[str] = (), *, model: str | None = None,
            since_ns: int | None = None) -> list[RequestTrace]:
    """The n traces with the longest REQUEST_START..REQUEST_END, slowest first: of `model`
    only if given, and of the requests that arrived at or after `since_ns` (CLOCK_MONOTONIC,
    the traces' clock) if given."""
    timed = [t for t in traces if t.span_ms("REQUEST_START", "REQUEST_END") is not None
             and t.request_id not in exclude_ids
             and (model is None or t.model == model) and (since_ns is None or t.ns["REQUEST_START"] >= since_ns)]
    return sorted(timed, key=lambda t: t.span_ms("REQUEST_START", "REQUEST_END"), reverse=True)[:n]


def _record_for(trace: RequestTrace, records: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    start, end = trace.ns.get("COMPUTE_START"), trace.ns.get("COMPUTE_END")
    if start is None or end is None:
        return None
    inside = [r for r in records if r.get("flow") == trace.model
              and start - _SLACK_NS <= r["t0_ns"] and r["t1_ns"] <= end + _SLACK_NS]
    named = [r for r in inside if trace.request_id and trace.request_id in r.get("requests", ())]
    candidates = named or inside
    return min(candidates, key=lambda r: abs(r["t0_ns"] - start)) if candidates else None


def _calls_of(trace: RequestTrace, traces: Iterable[RequestTrace]) -> list[RequestTrace]:
    """The child calls of the request's execute(): under the trace of its first request, one of
    the traces with the same model and the same COMPUTE_START..COMPUTE_END (one execute())."""
    if trace.children:
        return trace.children
    window = (trace.ns.get("COMPUTE_START"), trace.ns.get("COMPUTE_END"))
    return next((other.children for other in traces if other.children and other.model == trace.model
                 and (other.ns.get("COMPUTE_START"), other.ns.get("COMPUTE_END")) == window), [])


def explain(trace: RequestTrace, records: Iterable[Mapping[str, Any]],
            traces: Iterable[RequestTrace] = ()) -> dict[str, Any]:
    """One request's time, part by part (JSON-able): `records` are the flows' execute()
    records, `traces` the other requests' traces (the first request of the execute() holds
    the child calls)."""
    out: dict[str, Any] = {"model": trace.model, "request_id": trace.request_id, "trace_id": trace.id,
                           "total_ms": trace.span_ms("REQUEST_START", "REQUEST_END")}
    if trace.unserved is not None:
        out["unserved"] = trace.unserved
        out["refused"] = trace.refused
        out["parts"] = [{"part": "queue", "ms": trace.span_ms("QUEUE_START", "REQUEST_END"),
                         "note": _UNSERVED[trace.unserved]}]
        return out
    compute = trace.span_ms("COMPUTE_START", "COMPUTE_END")
    out.update(queue_ms=trace.span_ms("REQUEST_START", "COMPUTE_START"), compute_ms=compute,
               response_ms=trace.span_ms("COMPUTE_END", "REQUEST_END"))
    record = _record_for(trace, records)
    calls = _calls_of(trace, traces)
    parts: list[dict[str, Any]] = []
    if record is None:
        out["parts"] = [{"part": "compute", "ms": compute,
                         "note": "no record of its execute(): the flow did not send one"}]
        out["covered"] = None
        return out
    ms = record["ms"]
    out["execute"] = {"instance": record["instance"], "pid": record.get("pid"), "requests": record["requests"],
                      "probes": record["probes"],
                      "images": record["images"], "child_calls_traced_with": record["child_calls_traced_with"]}
    # Top-level parts (level 0) follow each other and sum to the compute; the flow's details
    # (level 1: its child calls, which may overlap, and its own code) lie within the flow.
    parts.append(_part("to the stub", (record["t0_ns"] - trace.ns["COMPUTE_START"]) / 1e6,
                       "Triton hands the requests to the python stub"))
    parts.append(_part("read", ms.get("read", 0.0), "inputs to numpy"))
    parts.append(_part("decode_preprocess", ms.get("decode_preprocess", 0.0), "every image once"))
    parts.append(_part("flow", ms.get("flow", 0.0), "the flow function: its child calls and its own code"))
    triton_calls: dict[str, list[RequestTrace]] = {}
    for call in calls:
        triton_calls.setdefault(call.model, []).append(call)
    for child, st in record.get("children", {}).items():
        if st.get("in_process"):
            note = f"{st['calls']} call(s), {st['images']} image(s), in process (no Triton request)"
        else:
            seen = triton_calls.get(child, [])
            queue = sum(c.span_ms("REQUEST_START", "COMPUTE_START") or 0.0 for c in seen)
            work = sum(c.span_ms("COMPUTE_START", "COMPUTE_END") or 0.0 for c in seen)
            note = f"{st['calls']} call(s), {st['images']} image(s)" + (
                f"; in Triton: queue {queue:.1f} ms, compute {work:.1f} ms" if seen else "")
        parts.append(_part(f"child {child}", st["ms"], note, level=1))
    parts.append(_part("flow's own code", max(0.0, ms.get("flow", 0.0) - ms.get("child_calls", 0.0)),
                       "the flow less its child calls' wall time (calls sent together overlap)", level=1))
    parts.append(_part("answers", ms.get("answers", 0.0), "request checks, top-k, the answers"))
    if "probes" in ms:  # run beside the users' requests (none of theirs answered)
        parts.append(_part("probes", ms["probes"],
                           f"{record['probes']} watchdog probe(s) run in the same execute(): the responses waited for "
                           "them"))
    parts.append(_part("metrics", ms.get("metrics", 0.0), "counts handed to the metrics' flusher"))
    parts.append(_part("responses", ms.get("responses", 0.0), "pb_utils responses built"))
    in_execute = sum(p["ms"] for p in parts[1:] if p["level"] == 0)
    execute_ms = (record["t1_ns"] - record["t0_ns"]) / 1e6
    back = _part("back to Triton", (trace.ns["COMPUTE_END"] - record["t1_ns"]) / 1e6,
                 "the responses handed back from the stub")
    measured = parts[0]["ms"] + in_execute + back["ms"]
    parts.append(_part("unmeasured in execute()", max(0.0, execute_ms - in_execute),
                       "the execute()'s time no part above took"))
    parts.append(back)
    out["parts"] = parts
    out["covered"] = measured / compute if compute else None  # the measured parts' share of the compute
    return out


def _part(name: str, ms: float, note: str, level: int = 0) -> dict[str, Any]:
    return {"part": name, "ms": round(ms, 3), "note": note, "level": level}
