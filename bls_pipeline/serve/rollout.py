"""`bls-rollout`: move a running model to another version, then retire the old ones, with no
request lost.

    bls-rollout --url 127.0.0.1:8000 --admin-key KEY resnet50_onnx 2   # forward: 1 -> 2
    bls-rollout --url 127.0.0.1:8000 --admin-key KEY resnet50_onnx 1   # and back

The version's folder (models/<model>/<version>/) must be in the server's repository. Two
steps, each a load through Triton's repository API with the model's config as served,
its version_policy replaced (Triton loads the versions it adds and unloads those it drops;
a version in both keeps serving untouched):
1. serve the versions now READY and the new one (`specific: [old..., new]`); returns once
   the new one is READY. A flow calls each child's newest READY version, so from its next
   readiness check (route_recheck_s) the flow's calls go to the new version if it is the
   newest, and ROUTE names it (<model>@<version> for a version other than 1);
2. serve the new version alone (`specific: [new]`): Triton unloads the others once their
   requests in flight are answered; a flow call that reaches an unloaded version is retried
   on the version now READY (child_retry_s).
`--keep-old` stops after step 1 (both versions serve; run again without it to retire).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from .admin import AdminError, RepositoryAdmin

__all__ = ["RolloutError", "RolloutStep", "roll", "main"]


class RolloutError(RuntimeError):
    """The rollout could not be done; the message says what to fix."""


@dataclass(frozen=True)
class RolloutStep:
    versions: tuple[int, ...]  # what the model serves after this step
    started: float  # time.monotonic() when the load was asked for
    done: float  # ... when the server answered it (every version in `versions` READY)


def roll(url: str, admin_key: str, model: str, version: int, *, keep_old: bool = False, timeout_s: float = 600.0,
         say=lambda line: None) -> list[RolloutStep]:
    """Roll `model` on the server at `url` (host:port of its HTTP endpoint) to `version`."""
    admin = RepositoryAdmin(url, admin_key, timeout_s)
    try:
        return _roll(admin, model, version, keep_old, say)
    except AdminError as exc:
        hint = ": check --url" if str(exc).startswith("no server at") else ""
        raise RolloutError(f"{exc}{hint}") from None


def _roll(admin: RepositoryAdmin, model: str, version: int, keep_old: bool, say) -> list[RolloutStep]:
    serving = admin.ready_versions(model)
    if not serving:
        raise RolloutError(f"model {model} has no READY version on {admin.base}: load it first (a rollout moves a serving model)")
    config = admin.config(model)
    steps = []
    plan = [tuple(sorted(set(serving) | {version}))] + ([] if keep_old else [(version,)])
    for versions in plan:
        if versions == (steps[-1].versions if steps else serving):
            continue  # already so
        say(f"{model}: serving versions {', '.join(map(str, versions))} (was {', '.join(map(str, admin.ready_versions(model)))})")
        started = time.monotonic()
        admin.load(model, {**config, "version_policy": {"specific": {"versions": list(versions)}}})
        ready = admin.ready_versions(model)
        if version not in ready:
            raise RolloutError(f"model {model} version {version} is not READY after its load (READY: {ready}); "
                               f"see the server log, and check {model}/{version}/ is in the repository")
        steps.append(RolloutStep(versions, started, time.monotonic()))
        say(f"{model}: versions {', '.join(map(str, versions))} READY after {steps[-1].done - started:.1f} s")
    return steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bls-rollout", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("model", help="the model to move (e.g. resnet50_onnx)")
    p.add_argument("version", type=int, help="the version to serve (its folder must be in the repository)")
    p.add_argument("--url", default="127.0.0.1:8000", help="the server's HTTP endpoint")
    p.add_argument("--admin-key", required=True, help="the admin key (bls-serve prints it; --admin-key there sets it)")
    p.add_argument("--keep-old", action="store_true", help="serve the new version next to the old ones; do not retire them")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a load")
    args = p.parse_args(argv)
    try:
        roll(args.url, args.admin_key, args.model, args.version, keep_old=args.keep_old, timeout_s=args.timeout,
             say=lambda line: print(line, flush=True))
    except RolloutError as exc:
        print(f"bls-rollout: error: {exc}", file=sys.stderr)
        return 2
    return 0
