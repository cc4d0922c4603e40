"""Whether tritonserver still answers: its liveness endpoint over HTTP and over gRPC, each
asked with a timeout, as a Kubernetes liveness probe asks a container.

A tritonserver can stay alive and answer nothing (Triton 2.51 deadlocks in its own signal
handler after a crash: workarounds.py, "a crash that hangs"; or it is stopped, or starved).
`Liveness` asks both endpoints every `interval_s` on a thread of its own; `LivenessJudge`,
pure, says the server hangs once one protocol has had no answer for `hang_after_s`: bls-serve
then kills it with its group and starts it again, as it does one that died (cli.py). Every
call here has a timeout: the thread never waits on tritonserver longer than `timeout_s`.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Liveness", "LivenessJudge"]

log = logging.getLogger(__name__)

PROTOCOLS = ("HTTP", "gRPC")


@dataclass
class LivenessJudge:
    """Answers over time in, a verdict out. Both protocols count from `since` (when the
    server was first serving): one never answered is silent from then."""
    hang_after_s: float
    since: float
    last_ok: dict[str, float] = field(default_factory=dict)
    last_error: dict[str, str] = field(default_factory=dict)

    def record(self, protocol: str, ok: bool, now: float, error: str = "") -> None:
        if ok:
            self.last_ok[protocol] = now
            self.last_error.pop(protocol, None)
        else:
            self.last_error[protocol] = error

    def silent_s(self, now: float) -> dict[str, float]:
        """Seconds since each protocol last answered, for those that did not answer their last check."""
        return {p: now - self.last_ok.get(p, self.since) for p in PROTOCOLS if p in self.last_error}

    def hung(self, now: float) -> str | None:
        """Why the server counts as hung now ("no answer over gRPC for 10.2 s (...)"), or None."""
        silent = {p: s for p, s in self.silent_s(now).items() if s >= self.hang_after_s}
        if not silent:
            return None
        return "; ".join(f"no answer over {p} for {s:.1f} s ({self.last_error[p]})" for p, s in silent.items())

    def describe(self, now: float) -> str | None:
        """A line for the status port once a protocol has not answered for half the time that
        makes a hang (None: both answer, or not for that long yet: one slow answer on a busy
        machine does not take the server out of rotation)."""
        silent = {p: s for p, s in self.silent_s(now).items() if s >= self.hang_after_s / 2}
        if not silent:
            return None
        return "; ".join(f"{p} liveness unanswered for {s:.0f} s ({self.last_error[p]})" for p, s in silent.items())


class Liveness(threading.Thread):
    """Asks tritonserver's /v2/health/live over HTTP and gRPC every `interval_s`, each with
    `timeout_s`; `on_hung(reason)` is called once, from this thread, when the judge says so."""

    def __init__(self, http_url: str, grpc_url: str | None, on_hung: Callable[[str], None], hang_after_s: float,
                 interval_s: float = 1.0, timeout_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        super().__init__(name="bls-liveness", daemon=True)
        self._http_url, self._grpc_url = http_url, grpc_url
        self._on_hung, self._interval, self._timeout = on_hung, interval_s, timeout_s
        self._clock = clock
        self.judge = LivenessJudge(hang_after_s, clock())
        self._halt = threading.Event()
        self._grpc = None

    def stop(self, timeout_s: float = 2.0) -> None:
        self._halt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=timeout_s)

    def run(self) -> None:
        try:
            while not self._halt.wait(self._interval):
                self._check("HTTP", self._ask_http)
                if self._grpc_url is not None:
                    self._check("gRPC", self._ask_grpc)
                reason = self.judge.hung(self._clock())
                if reason and not self._halt.is_set():
                    self._halt.set()
                    self._on_hung(reason)
        finally:
            if self._grpc is not None:
                try:
                    self._grpc.close()
                except Exception:  # noqa: BLE001 - closing a channel to a dead server
                    pass

    def _check(self, protocol: str, ask: Callable[[], str | None]) -> None:
        error = ask()
        self.judge.record(protocol, error is None, self._clock(), error or "")

    def _ask_http(self) -> str | None:
        try:
            with urllib.request.urlopen(f"http://{self._http_url}/v2/health/live", timeout=self._timeout) as r:
                return None if r.status == 200 else f"HTTP {r.status}"
        except urllib.error.HTTPError as exc:
            return f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            return "timed out" if "timed out" in str(reason) else str(reason)

    def _ask_grpc(self) -> str | None:
        try:
            if self._grpc is None:
                import tritonclient.grpc as grpcclient

                self._grpc = grpcclient.InferenceServerClient(self._grpc_url)
            return None if self._grpc.is_server_live(client_timeout=self._timeout) else "not live"
        except Exception as exc:  # noqa: BLE001 - tritonclient raises its own for a deadline or a refusal
            text = str(exc)
            return ("timed out" if "Deadline" in text or "DEADLINE" in text
                    else (text.splitlines()[0] if text else type(exc).__name__))
