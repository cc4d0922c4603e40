"""Waiting for what a server shows a little later than the answer that caused it: a metric
flushed, a state reached, an alert firing; and reading a status endpoint for it."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections import defaultdict
from typing import Callable, TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], what: str = "the condition", timeout_s: float = 20.0, every_s: float = 0.2) -> T:
    """check() every `every_s` until it returns something true, and return that; fail, naming
    `what`, once `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(every_s)


def get(url: str) -> tuple[int, str]:
    """An HTTP GET's status and body, an error status included (bls-serve's /ready answers 503)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(metrics_url: str, metric: str, model: str) -> dict[str, float]:
    """One metric of one model from a Prometheus text endpoint: {its other labels as
    "k=v,...": the value summed over instances}."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        m = re.match(rf"^{metric}\{{(.*)\}} (\S+)$", line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("model") != model:
            continue
        key = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("model", "instance"))
        out[key] += float(m.group(2))
    return dict(out)
