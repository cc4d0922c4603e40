"""`bls-explain`: where a slow request's time went, from a running bls-serve.

    bls-explain --slowest 3                  # the 3 slowest of the recent requests
    bls-explain --slowest 3 --since 5m --model classify_bls   # ... of classify_bls, in the last 5 minutes
    bls-explain --request req-17             # one request, by the id its client sent
    bls-explain --log-executions on classify_bls --url 127.0.0.1:8000 --admin-key KEY

bls-serve traces every request (Triton's tracing: queue, compute) and each flow instance sends
it a record of each execute() (read, decode, each child call, the flow's own code, the answers,
probes beside them, the responses); bls-serve's status port joins them (serve/request_join.py) for
its last 10,000 requests. This prints the join, part by part, with the share of Triton's compute
the measured parts cover.

`--log-executions on FLOW` writes the same record into the server log for each execute() of
FLOW from now on (its config parameter log_executions), by loading the flow anew with it
through the repository API, as the watchdog and bls-rollout do: a fresh copy beside the
serving one, swapped in, no request lost. For a server that is not bls-serve (no status port),
that log line and Triton's trace file are what there is to join.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

from ..serve.admin import AdminError, RepositoryAdmin

__all__ = ["main", "parse_duration", "render", "set_log_executions"]

_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds from a duration such as 30s, 5m, 1h or 1.5m; ValueError saying what to write."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*", text or "")
    seconds = float(found.group(1)) * _UNITS_S[found.group(2)] if found else 0.0
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a duration: write a number above 0 and a unit (ms, s, m, h), e.g. 30s, 5m, "
                         "1h")
    return seconds


def set_log_executions(admin: RepositoryAdmin, flow: str, on: bool) -> bool:
    """Load `flow` anew with log_executions on or off; False when it already was so."""
    config = admin.config(flow)
    params = dict(config.get("parameters") or {})
    want = "true" if on else "false"
    already = ("true", "1", "yes") if on else ("false", "0", "no")
    if params.get("log_executions", {}).get("string_value", "false").lower() in already:
        return False
    params["log_executions"] = {"string_value": want}
    admin.load(flow, {**config, "parameters": params})
    return True


def render(found: dict) -> str:
    """One explained request (serve/request_join.py's dict) as the lines bls-explain prints."""
    name = found["request_id"] or f"#{found['trace_id']}"
    total = found.get("total_ms")
    lines = [f"{found['model']} request {name} (trace {found['trace_id']}): "
             + (f"{total:,.1f} ms in Triton" if total is not None else "no end recorded")]
    if found.get("unserved"):
        return "\n".join(lines + [f"  {found['parts'][0]['note']}"])
    lines.append(f"  {'queue':34s}{found['queue_ms']:>10,.1f} ms  waiting for an instance")
    execute = found.get("execute")
    pid = f" (pid {execute['pid']})" if execute and execute.get("pid") else ""
    where = (f"{execute['instance']}{pid}, one execute() of {len(execute['requests'])} request(s) and "
             f"{execute['probes']} probe(s), {execute['images']} image(s) answered" if execute else "")
    lines.append(f"  {'compute':34s}{found['compute_ms']:>10,.1f} ms  {where}")
    for part in found["parts"]:
        indent = "    " + "  " * part.get("level", 0)
        label = f"{indent}{part['part']}"
        value = "" if part["ms"] is None else f"{part['ms']:>10,.1f}"
        lines.append(f"{label:36s}{value}     {part['note']}")
    if found.get("covered") is not None:
        lines.append(f"    (the measured parts: {found['covered']:.1%} of the compute)")
    lines.append(f"  {'response':34s}{found['response_ms']:>10,.1f} ms  compute end to the response")
    return "\n".join(lines)


def _fetch(status: str, query: dict) -> list[dict]:
    base = status if status.startswith("http") else f"http://{status}"
    url = f"{base}/requests?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bls-explain",
                                description="Where a slow request's time went (bls-serve's status port).")
    p.add_argument("--status", default="127.0.0.1:8003", help="bls-serve's status port (host:port)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--slowest", type=int, default=1, metavar="N", help="the N slowest of the recent requests")
    which.add_argument("--request", metavar="ID", help="the request(s) its client sent with this id")
    which.add_argument("--log-executions", nargs=2, metavar=("on|off", "FLOW"),
                       help="log one line per execute() of FLOW in the server log from now on (or no more)")
    p.add_argument("--since", metavar="DURATION", help="only requests that arrived in the last DURATION (30s, 5m, 1h)")
    p.add_argument("--model", metavar="M", help="only requests to model M")
    p.add_argument("--url", default="127.0.0.1:8000", help="tritonserver's HTTP endpoint (--log-executions)")
    p.add_argument("--admin-key", help="its admin key (--log-executions)")
    p.add_argument("--json", action="store_true", help="the breakdown as JSON")
    args = p.parse_args(argv)
    since_s = None
    if args.since is not None:
        try:
            since_s = parse_duration(args.since)
        except ValueError as exc:
            p.error(f"--since: {exc}")
    if args.log_executions:
        state, flow = args.log_executions
        if state not in ("on", "off") or not args.admin_key:
            p.error("--log-executions on|off FLOW needs --admin-key (bls-serve prints it)")
        try:
            changed = set_log_executions(RepositoryAdmin(args.url, args.admin_key), flow, state == "on")
        except AdminError as exc:
            print(f"bls-explain: {exc}", file=sys.stderr)
            return 1
        print(f"{flow}: log_executions {state}" + ("" if changed else " already"))
        return 0
    query = {"id": args.request} if args.request else {"slowest": args.slowest}
    if since_s is not None:
        query["since"] = since_s
    if args.model:
        query["model"] = args.model
    try:
        found = _fetch(args.status, query)
    except urllib.error.HTTPError as exc:
        print(f"bls-explain: the status port at {args.status} refused the query: "
              f"{exc.read().decode(errors='replace').strip()}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"bls-explain: no bls-serve status port at {args.status} ({exc}): start bls-serve with --status-port",
              file=sys.stderr)
        return 1
    if not found:
        scope = "".join([f" of {args.model}" if args.model else "", f" in the last {args.since}" if args.since else ""])
        print(f"no such request among the recent ones{scope}" if args.request else f"no request{scope} traced"
              + ("" if scope else " yet"), file=sys.stderr)
        return 1
    print(json.dumps(found, indent=1) if args.json else "\n\n".join(render(f) for f in found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
