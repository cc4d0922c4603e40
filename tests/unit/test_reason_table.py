"""docs/reliability.md's status-code table names every `reason` the runtime gives a failed
request (the label of bls_rejected_requests_total): the literal reasons are read from the
code (RequestError's and ImageError's reason, and the literals passed down to a function that
hands its parameter on as one), so a new reason without its row fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_MAKERS = {"RequestError": 1, "ImageError": 0}  # the class, and where its reason is among the arguments


def _name(call: ast.Call) -> str:
    return (call.func.id if isinstance(call.func, ast.Name) else call.func.attr if isinstance(call.func, ast.Attribute)
            else "")


def _argument(call: ast.Call, index: int, keyword: str) -> ast.expr | None:
    if index < len(call.args):
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _literals(node: ast.expr | None) -> set[str]:
    """The strings a reason expression can take: "a", `x or "b"`, `"a" if c else "b"`."""
    if node is None:
        return set()
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def code_reasons() -> set[str]:
    trees = [ast.parse(p.read_text()) for p in sorted((ROOT / "bls_pipeline").rglob("*.py"))]
    reasons: set[str] = set()
    # a function whose parameter becomes the reason -> its index among a call's arguments
    passed_on: dict[str, int] = {}
    for tree in trees:
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            params = [a.arg for a in fn.args.args]
            offset = 1 if params[:1] == ["self"] else 0
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call) and _name(n) in _MAKERS):
                reason = _argument(call, _MAKERS[_name(call)], "reason")
                reasons |= _literals(reason) if not isinstance(reason, (ast.Attribute, ast.Call)) else set()
                if isinstance(reason, ast.Name) and reason.id in params:
                    passed_on[fn.name] = params.index(reason.id) - offset
    for tree in trees:
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and _name(n) in passed_on):
            found = _argument(call, passed_on[_name(call)], "")
            if isinstance(found, ast.Constant) and isinstance(found.value, str):
                reasons.add(found.value)
    return reasons


def table_reasons() -> set[str]:
    text = (ROOT / "docs" / "reliability.md").read_text()
    section = text.split("## What a failed request's status code means", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|") and not ln.startswith("|---")][1:]
    return {word for row in rows for word in re.findall(r"`([a-z_]+)`", row.rstrip("|").rsplit("|", 1)[-1])}


def test_the_code_gives_the_reasons_this_test_knows_of():
    """The scan finds what it should (a scan that found nothing would pass the next test)."""
    assert ({"bad_request", "bad_parameter", "flow", "corrupt", "too_many_regions", "cancelled", "no_time"}
            <= code_reasons())


def test_every_reason_the_runtime_gives_is_in_the_status_code_table():
    missing = code_reasons() - table_reasons()
    assert (not missing), (f"docs/reliability.md's status-code table lacks the reason(s) {sorted(missing)}: add a row "
                           "or name them")
