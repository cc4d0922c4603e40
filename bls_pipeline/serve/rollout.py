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

Before a version answers anyone, try it on live traffic (the flow's shadow and canary,
runtime/call/trials.py), each step its own run:

    bls-rollout ... resnet50_onnx 2 --shadow 1.0     # the flow mirrors its calls to version 2
    bls-rollout ... resnet50_onnx 2 --report         # agreement and latency, from /metrics
    bls-rollout ... resnet50_onnx 2 --canary 0.1     # version 2 answers a tenth of the calls
    bls-rollout ... resnet50_onnx 2                  # promote: trials off, version 2 alone
    bls-rollout ... resnet50_onnx 2 --rollback       # or back: version 2 unloaded, trials off

--shadow sets the flow's (--flow, default classify_bls) shadow first, so version 2 is held
back from the flow's stable calls, then loads version 2 beside the serving one. --canary
needs version 2 loaded (by --shadow). Each change of the flow's trial settings loads the
flow model anew (a fresh copy beside the serving one, swapped in: no request lost).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from .admin import AdminError, RepositoryAdmin

__all__ = ["RolloutError", "RolloutStep", "TRIAL_KEYS", "main", "report", "roll", "set_trials", "trial"]

TRIAL_KEYS = ("shadow", "shadow_share", "canary", "canary_share")


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"a share is between 0 and 1, got {text}")
    return value


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
        raise RolloutError(f"model {model} has no READY version on {admin.base}: load it first (a rollout moves a "
                           "serving model)")
    config = admin.config(model)
    steps = []
    plan = [tuple(sorted(set(serving) | {version}))] + ([] if keep_old else [(version,)])
    for versions in plan:
        if versions == (steps[-1].versions if steps else serving):
            continue  # already so
        say(f"{model}: serving versions {', '.join(map(str, versions))} (was "
            f"{', '.join(map(str, admin.ready_versions(model)))})")
        started = time.monotonic()
        admin.load(model, {**config, "version_policy": {"specific": {"versions": list(versions)}}})
        ready = admin.ready_versions(model)
        if version not in ready:
            raise RolloutError(f"model {model} version {version} is not READY after its load (READY: {ready}); "
                               f"see the server log, and check {model}/{version}/ is in the repository")
        steps.append(RolloutStep(versions, started, time.monotonic()))
        say(f"{model}: versions {', '.join(map(str, versions))} READY after {steps[-1].done - started:.1f} s")
    return steps


def _trials_of(config: dict) -> dict[str, str]:
    """The flow's trial parameters as served."""
    params = config.get("parameters") or {}
    return {k: params[k].get("string_value", "") for k in TRIAL_KEYS if k in params}


def set_trials(admin: RepositoryAdmin, flow: str, trials: dict[str, str], say=lambda line: None) -> None:
    """Load `flow` anew with its trial parameters replaced by `trials` (empty: none)."""
    config = admin.config(flow)
    if _trials_of(config) == trials:
        return
    params = {k: v for k, v in (config.get("parameters") or {}).items() if k not in TRIAL_KEYS}
    params.update({k: {"string_value": v} for k, v in trials.items()})
    say(f"{flow}: loading anew with " + (", ".join(f"{k}={v}" for k, v in trials.items()) or "no shadow or canary"))
    try:
        admin.load(flow, {**config, "parameters": params})
    except AdminError as exc:
        raise RolloutError(f"{flow} did not load with {trials or 'no trials'}: {exc}") from None
    if not admin.ready_versions(flow):
        raise RolloutError(f"{flow} is not READY after its load with {trials}; see the server log")


def trial(url: str, admin_key: str, model: str, version: int, *, flow: str = "classify_bls",
          shadow: float | None = None,
          canary: float | None = None, rollback: bool = False, timeout_s: float = 600.0, say=lambda line: None) -> None:
    """One trial step for `model` version `version` in `flow`: start or change its shadow,
    its canary share, or roll back (the version unloaded, the trials off)."""
    admin = RepositoryAdmin(url, admin_key, timeout_s)
    pair = f"{model}={model}@{version}"
    try:
        serving = admin.ready_versions(model)
        if not admin.ready_versions(flow):
            raise RolloutError(f"flow model {flow} is not READY on {admin.base}: name the flow that calls {model} "
                               "(--flow)")
        current = _trials_of(admin.config(flow))
        if rollback:
            if version in serving:
                rest = [v for v in serving if v != version]
                if not rest:
                    raise RolloutError(f"{model} serves version {version} alone: nothing to roll back to")
                say(f"{model}: unloading version {version} (serving {', '.join(map(str, rest))})")
                admin.load(model, {**admin.config(model), "version_policy": {"specific": {"versions": rest}}})
            set_trials(admin, flow, {}, say)
            return
        if not [v for v in serving if v != version]:
            raise RolloutError(f"model {model} has no READY version other than {version} on {admin.base}: "
                               "a trial needs the stable version serving")
        if canary is not None and version not in serving:
            raise RolloutError(f"model {model} version {version} is not loaded: start with --shadow, which loads it "
                               "beside the serving version")
        trials = dict(current)
        if shadow is not None:
            trials.update(shadow=pair, shadow_share=f"{shadow:g}")
        if canary is not None:
            trials.update(canary=pair, canary_share=f"{canary:g}")
        set_trials(admin, flow, trials, say)  # first: the version is held back from the flow's stable calls
        if version not in serving:
            try:
                _roll(admin, model, version, True, say)
            except (RolloutError, AdminError) as exc:
                set_trials(admin, flow, current, say)  # back as it was: the flow serves as before
                if isinstance(exc, RolloutError):
                    raise
                raise RolloutError(f"model {model} version {version} is not READY after its load ({exc}); check "
                                   f"{model}/{version}/ is in the repository") from None
    except AdminError as exc:
        hint = ": check --url" if str(exc).startswith("no server at") else ""
        raise RolloutError(f"{exc}{hint}") from None


def report(metrics_url: str, flow: str = "classify_bls") -> str:
    """The shadow's agreement and latency per pair, from the server's metrics, as lines."""
    import re
    import urllib.request
    from collections import defaultdict

    base = (metrics_url if metrics_url.startswith("http") else f"http://{metrics_url}").rstrip("/")
    base = base[: -len("/metrics")] if base.endswith("/metrics") else base
    try:
        text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    except OSError as exc:
        raise RolloutError(f"no metrics at {base} ({exc}): check --metrics-url") from None
    pairs: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for name, labels, value in re.findall(r"^(bls_shadow_\w+)\{(.*)\} (\S+)$", text, re.M):
        tags = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if tags.get("model") != flow:
            continue
        key = name + "".join(f":{tags[t]}" for t in ("outcome", "side", "le") if t in tags)
        pairs[tags["stable"], tags["candidate"]][key] += float(value)
    if not pairs:
        return f"{flow}: no shadow has compared anything yet"
    lines = []
    for (stable, candidate), m in sorted(pairs.items()):
        rows, compared = m["bls_shadow_rows_total"], m["bls_shadow_calls_total:compared"]
        lines.append(f"{flow}: {candidate} shadowing {stable}: {compared:.0f} calls compared, "
                     f"{m['bls_shadow_calls_total:failed']:.0f} failed, {m['bls_shadow_calls_total:skipped']:.0f} "
                     f"skipped, {m['bls_shadow_calls_total:unready']:.0f} before it was READY; "
                     f"{rows:.0f} rows")
        if rows:
            lines.append(f"  top-1 agreement {m['bls_shadow_top1_agree_total'] / rows:.2%}, "
                         f"top-5 overlap {m['bls_shadow_top5_overlap_total'] / rows:.2%}, "
                         f"top-1 score moved <= 0.01 on {m['bls_shadow_score_diff_total:0.01'] / rows:.2%} of rows")
            lines.append(f"  mean seconds per call: {stable} {m['bls_shadow_seconds_total:stable'] / compared:.3f}, "
                         f"{candidate} {m['bls_shadow_seconds_total:candidate'] / compared:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bls-rollout", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("model", help="the model to move (e.g. resnet50_onnx)")
    p.add_argument("version", type=int, help="the version to serve (its folder must be in the repository)")
    p.add_argument("--url", default="127.0.0.1:8000", help="the server's HTTP endpoint")
    p.add_argument("--admin-key", required=True, help="the admin key (bls-serve prints it; --admin-key there sets it)")
    p.add_argument("--keep-old", action="store_true",
                   help="serve the new version next to the old ones; do not retire them")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a load")
    step = p.add_mutually_exclusive_group()
    step.add_argument("--shadow", type=_share, metavar="SHARE",
                      help="mirror this share of the flow's calls to the version")
    step.add_argument("--canary", type=_share, metavar="SHARE",
                      help="answer this share of the flow's calls with the version")
    step.add_argument("--report", action="store_true", help="print the shadow's agreement and latency")
    step.add_argument("--rollback", action="store_true", help="unload the version and turn the flow's trials off")
    p.add_argument("--flow", default="classify_bls", help="the flow model whose calls are tried")
    p.add_argument("--metrics-url", default="127.0.0.1:8002", help="the server's metrics endpoint (--report)")
    args = p.parse_args(argv)
    say = lambda line: print(line, flush=True)  # noqa: E731
    try:
        if args.report:
            print(report(args.metrics_url, args.flow))
        elif args.shadow is not None or args.canary is not None or args.rollback:
            trial(args.url, args.admin_key, args.model, args.version, flow=args.flow, shadow=args.shadow,
                  canary=args.canary, rollback=args.rollback, timeout_s=args.timeout, say=say)
        else:
            admin = RepositoryAdmin(args.url, args.admin_key, args.timeout)
            try:
                if _trials_of(admin.config(args.flow)) and args.version in admin.ready_versions(args.model):
                    set_trials(admin, args.flow, {}, say)  # promote: the flow calls the newest READY, this version
            except AdminError:
                pass  # no such flow here: a plain rollout
            roll(args.url, args.admin_key, args.model, args.version, keep_old=args.keep_old, timeout_s=args.timeout,
                 say=say)
    except RolloutError as exc:
        print(f"bls-rollout: error: {exc}", file=sys.stderr)
        return 2
    return 0
