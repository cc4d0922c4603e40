"""Stopping a tritonserver: the drain, the models it holds, the terminate, and its end (killed
with its group, reaped: end_process, which says how it went in a StopReport). The drain and the
terminate are pure over what they are given: Triton's admin answers, the stubs in its group, its
in-flight snapshots, the clock, the process (`Triton`, `Process`); TritonServer.stop (server.py)
hands them in (StopView: a running tritonserver), unit tests fake them.

The drain unloads callers before the models they call (repository.drain_stages): a stage's
models are done with their requests once Triton begins to destroy them, which it does only
when no request holds them any more. On 2.51 a python instance takes a little over a second
to destroy (workarounds.py, "the health-check timing"), one instance after another; the first
of a model's stubs to exit shows the destruction began, so the next stage starts then.

A model Triton 2.51 keeps from its destruction with nothing in flight (after a gRPC spike:
"the held model") would hold the drain until its limit. Once Triton has reported nothing in
flight for in_flight.QUIET_S (in_flight.py), the models still unloading whose destruction did
not begin are held by no request: the drain goes on without them, and tritonserver gets
HELD_GRACE_S after its SIGTERM before it is killed, unless a stub of a held model stirs
(only slow, then). One whose destruction began is waited for.

Everything is bounded: the drain by its deadline, and by `unanswered_s` of tritonserver not
answering (a hung server is not drained: it is killed); the terminate by the stop's deadline.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Protocol

from . import in_flight
from .admin import RepositoryAdmin
from .processes import Stubs, destruction_began, is_subreaper, model_of, reap_group, stubs
from .workarounds import HELD_GRACE_S, LEAKED_GRACE_S

__all__ = ["Drain", "StopReport", "StopView", "Terminated", "drain", "end_process", "kill_group", "report_hang",
           "stuck_copies", "terminate"]

log = logging.getLogger(__name__)

POLL_S = 0.05
ALIVE = ("READY", "UNLOADING")


class Triton(Protocol):
    """What the stop asks of the running tritonserver; a call that gets no answer raises
    OSError, ValueError or an AdminError (a RuntimeError)."""

    def states(self) -> dict[str, str]: ...
    def unload(self, model: str) -> None: ...
    def stubs(self) -> Stubs: ...
    def snapshot(self) -> in_flight.Snapshot: ...
    def exit_code(self) -> int | None: ...  # None while it runs


class StopView:
    """A running tritonserver as the stop asks it (the Triton protocol): each call with a
    short timeout. metrics_url: its metrics endpoint, None where it opened none."""

    CALL_TIMEOUT_S = 2.0

    def __init__(self, http_url: str, admin_key: str, metrics_url: str | None, proc: subprocess.Popen):
        self._http_url, self._metrics_url, self._proc = http_url, metrics_url, proc
        self._admin = RepositoryAdmin(http_url, admin_key, timeout_s=self.CALL_TIMEOUT_S)

    def states(self) -> dict[str, str]:
        return self._admin.states(timeout_s=self.CALL_TIMEOUT_S)

    def unload(self, model: str) -> None:
        self._admin.unload(model, timeout_s=self.CALL_TIMEOUT_S)

    def stubs(self) -> Stubs:
        return stubs(self._proc.pid)

    def snapshot(self) -> in_flight.Snapshot:
        return in_flight.read_snapshot(time.monotonic(), self._http_url, self._metrics_url, stubs(self._proc.pid).live)

    def exit_code(self) -> int | None:
        return self._proc.poll()


class Process(Protocol):
    pid: int

    def send_signal(self, sig: int) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...  # raises subprocess.TimeoutExpired


@dataclass(frozen=True)
class Drain:
    drained: bool  # every model unloaded, or being destroyed (those held apart): nothing in flight
    held: tuple[str, ...] = ()  # models Triton kept from unloading with nothing in flight
    reason: str = ""  # why not drained
    unanswered: bool = False  # tritonserver stopped answering (hung): kill it, no SIGTERM wait


class _Gone(Exception):
    """tritonserver did not answer for too long, or exited, while draining."""

    def __init__(self, reason: str, unanswered: bool):
        super().__init__(reason)
        self.reason, self.unanswered = reason, unanswered


class _Asker:
    """Calls into tritonserver, each retried until it answers: a call that has had no answer
    for `unanswered_s`, or tritonserver exiting, ends the drain."""

    def __init__(self, triton: Triton, clock: Callable[[], float], sleep: Callable[[float], None], unanswered_s: float,
                 deadline: float):
        self.triton, self.clock, self.sleep = triton, clock, sleep
        self.unanswered_s, self.deadline = unanswered_s, deadline

    def __call__(self, call: Callable, *args):
        failing_since = None
        while True:
            code = self.triton.exit_code()
            if code is not None:
                raise _Gone(f"tritonserver exited with code {code} while draining", False)
            asked = self.clock()
            try:
                return call(*args)
            except (OSError, ValueError, RuntimeError) as exc:
                now = self.clock()
                failing_since = asked if failing_since is None else failing_since  # a call that timed out counts whole
                if now - failing_since >= self.unanswered_s or now > self.deadline:
                    raise _Gone(f"tritonserver did not answer for {now - failing_since:.0f} s while draining ({exc})",
                                True) from None
                self.sleep(0.25)


def drain(stages: Iterable[tuple[str, ...]], triton: Triton, deadline: float, *, limit_s: float,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
          unanswered_s: float = 5.0, exit_timeout_s: float = 20.0) -> Drain:
    """Unload `stages` in order (callers first), each once its models are done with their
    requests; by `deadline` (clock()), `limit_s` being what it allowed, to name it."""
    stages = [tuple(stage) for stage in stages]
    ask = _Asker(triton, clock, sleep, unanswered_s, deadline)
    held: tuple[str, ...] = ()
    try:
        before = ask(triton.stubs).live
        for stage in stages:
            for model in stage:
                ask(triton.unload, model)
            watch = in_flight.QuietWatch(lambda: ask(triton.snapshot))  # quiet since this stage's unload, no sooner
            while not done_with_requests(stage, before, ask(triton.states), ask(triton.stubs)):
                if watch.held(clock()):
                    newly = _hold(stage, held, before, ask(triton.states), ask(triton.stubs), watch, exit_timeout_s)
                    if newly:
                        held += newly
                        break
                if clock() > deadline:
                    states = ask(triton.states)
                    busy = {m: states.get(m, "gone") for m in stage if states.get(m) in ALIVE}
                    reason = (f"models still busy after {limit_s:g} s of draining: "
                              f"{', '.join(f'{m} {s}' for m, s in busy.items()) or 'none left'}")
                    log.warning("%s: stopping anyway", reason)
                    return Drain(False, held, reason)
                sleep(POLL_S)
        if held:  # every other model is being destroyed, done with its requests: tritonserver is killed now
            return Drain(True, held)
        # Every model's destruction began (no request holds any): none left can be held.
        loaded = {m for stage in stages for m in stage}
        while True:
            left = {m: s for m, s in ask(triton.states).items() if m in loaded and s in ALIVE}
            if not left:
                return Drain(True)
            if clock() > deadline:  # the last instances (nothing in flight): then tritonserver exits at once
                reason = (f"models still unloading after {limit_s:g} s of draining: "
                          f"{', '.join(f'{m} {s}' for m, s in sorted(left.items()))}")
                log.warning("%s: stopping anyway", reason)
                return Drain(False, held, reason)
            sleep(POLL_S)
    except _Gone as gone:
        log.warning("%s: stopping it without a drain", gone.reason)
        return Drain(False, held, gone.reason, unanswered=gone.unanswered)


def done_with_requests(stage: tuple[str, ...], before: dict[int, str], states: dict[str, str], now: Stubs) -> bool:
    """Every model of `stage` unloaded, or being destroyed (processes.destruction_began)."""
    return all(destruction_began(model, before, now) for model in stage if states.get(model) in ALIVE)


def _hold(models: tuple[str, ...], held: tuple[str, ...], before: dict[int, str], states: dict[str, str], now: Stubs,
          watch: in_flight.QuietWatch, exit_timeout_s: float) -> tuple[str, ...]:
    """Which of `models` Triton keeps from unloading with nothing in flight (said once);
    one whose destruction began is not held: it is only slow."""
    newly = tuple(m for m in models if states.get(m) in ALIVE and m not in held
                  and not destruction_began(m, before, now))
    if newly:
        log.warning("%s still unloading with nothing in flight: for %.1f s since its unload Triton reported no "
                    "request pending (%s 0) and none answered, and every python stub was idle; Triton 2.51 can "
                    "keep a model so after a spike of cancelled gRPC calls, and wait out its exit timeout (%ss, "
                    "then exit code 1): not waiting for it, tritonserver is killed once the rest is drained",
                    ", ".join(newly), watch.last.at - watch.first.at, in_flight.PENDING_GAUGE, exit_timeout_s)
    return newly


def stuck_copies(dead: Iterable[int], instance_of: Callable[[int], str | None],
                 exit_timeout_s: float) -> tuple[str, ...]:
    """After a full drain: the dead stubs (zombies still in tritonserver's group) of model copies
    that can never unload, named by their instance ("pid N" if never seen alive); () when
    tritonserver can stop cleanly.

    On Triton 2.51 a copy that got a request after its stub died keeps it forever
    (workarounds.py, "the stuck copy"), and tritonserver would wait out its exit timeout on
    it. A copy that can unload reaps its dead stub about a second after its unload begins; the
    drain takes longer than that. So a dead stub still there after the drain is a stuck copy,
    and, the drain done, no request is in flight to lose."""
    names = tuple(sorted(instance_of(pid) or f"pid {pid}" for pid in dead))
    if names:
        log.warning("tritonserver cannot exit cleanly: the model copy of the dead python stub(s) %s got requests after "
                    "the stub died, and Triton 2.51 never unloads such a copy; the drain answered every request in "
                    "flight, so it is killed now instead of waiting out its exit timeout (%ss, then exit code 1)",
                    ", ".join(names), exit_timeout_s)
    return names


@dataclass(frozen=True)
class Terminated:
    exited: bool  # it exited by itself after SIGTERM
    killed_for: tuple[str, ...] = ()  # the held models it is to be killed for


def terminate(process: Process, held: tuple[str, ...], watch, deadline: float, *,
              clock: Callable[[], float] = time.monotonic, grace_s: float = HELD_GRACE_S,
              leaked: tuple[str, ...] = (), leaked_grace_s: float = LEAKED_GRACE_S) -> Terminated:
    """SIGTERM tritonserver and wait for it to exit, until `deadline` (clock()).

    With models held, it gets `grace_s`, not the rest of the stop's time; `watch`
    (in_flight.HeldStubs: .stirred() -> models) tells a held model whose stub exits or
    computes meanwhile: only slow to unload, held no more, and once none is, tritonserver
    gets until the deadline to finish cleanly. With `leaked` (models whose load failed beside
    a serving copy: Triton 2.51 keeps that copy's model object live, and waits for it until
    its exit timeout), it gets `leaked_grace_s` after a full drain, then is to be killed for
    them. Not exited by the deadline: the caller kills it."""
    process.send_signal(signal.SIGTERM)
    if leaked and not held:
        try:
            process.wait(timeout=max(0.0, min(deadline, clock() + leaked_grace_s) - clock()))
            return Terminated(True)
        except subprocess.TimeoutExpired:
            log.warning("killing tritonserver %.0f s after its SIGTERM, not waiting out its exit timeout for the live "
                        "model object Triton 2.51 keeps after a failed load of %s", leaked_grace_s, ", ".join(leaked))
            return Terminated(False, leaked)
    grace_ends = clock() + grace_s
    while held:
        try:
            process.wait(timeout=POLL_S * 2)
            return Terminated(True)
        except subprocess.TimeoutExpired:
            pass
        stirred = watch.stirred()
        slow = tuple(m for m in held if m in stirred)
        if slow:
            held = tuple(m for m in held if m not in slow)
            log.info("%s only slow to unload, not held: a stub of it exited or computed after tritonserver's "
                     "SIGTERM; %s", ", ".join(slow), "waiting for tritonserver to exit" if not held else
                     f"still held: {', '.join(held)}")
        elif clock() > grace_ends:
            log.warning("killing tritonserver %.0f s after its SIGTERM, not waiting out its exit timeout for %s",
                        grace_s, ", ".join(held))
            return Terminated(False, held)
    try:
        process.wait(timeout=max(0.0, deadline - clock()))
        return Terminated(True)
    except subprocess.TimeoutExpired:
        return Terminated(False)


@dataclass(frozen=True)
class StopReport:
    code: int | None  # tritonserver's exit status; -9 when it had to be killed
    drained: bool  # every model was unloaded (no request in flight) before SIGTERM
    # Dead python stubs (their instance, or "pid N" if never seen alive) whose model copy
    # could not unload after the drain: tritonserver was killed for them (stuck_copies).
    stuck: tuple[str, ...] = ()
    # Models Triton kept from unloading with nothing in flight (drain): the drain went on
    # without them, and tritonserver was killed for them after it.
    held: tuple[str, ...] = ()
    reason: str = ""  # why the stop was not clean: the drain's, or tritonserver's exit
    hung: bool = False  # tritonserver did not answer (the drain, or its exit after SIGTERM): killed


def end_process(proc: subprocess.Popen, result: Drain, began: float, deadline: float, *, limit_s: float,
                leaked: tuple[str, ...], instance_of: Callable[[int], str | None],
                log_file: Path | None = None) -> StopReport:
    """tritonserver's end after the drain (`result`), by `deadline` (time.monotonic()): killed at
    once for a copy a dead stub left stuck; else SIGTERM (terminate), then killed for the
    models it held, the failed loads it keeps live (`leaked`), or because it did not exit. Its
    whole group is killed after (the stubs), and reaped here when this process is their
    subreaper (bls-serve)."""
    code, stuck, held, hung, reason = None, (), (), result.unanswered, result.reason
    if proc.poll() is None:
        if result.drained:
            stuck = stuck_copies(stubs(proc.pid).dead, instance_of, limit_s)
        if not stuck:
            # A server that did not answer gets a moment to take SIGTERM, not the stop's rest.
            until = min(deadline, time.monotonic() + 2.0) if result.unanswered else deadline
            held_stubs = {pid: inst for pid, inst in stubs(proc.pid).live.items()
                          if model_of(inst) in result.held} if result.drained else {}
            ended = terminate(proc, result.held if result.drained else (), in_flight.HeldStubs(held_stubs, model_of),
                              until, leaked=leaked if result.drained else ())
            held = ended.killed_for
            if not ended.exited and not ended.killed_for:
                hung = True
                reason = reason or f"tritonserver did not exit within {until - began:.0f} s of the stop"
                report_hang(proc.pid, result.drained, deadline, log_file)
    kill_group(proc.pid)  # its stubs too, and the server itself if it hung or waited on stuck copies
    try:
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:  # a process SIGKILL does not end: nothing left to do
        log.error("tritonserver (pid %d) still there after SIGKILL", proc.pid)
    if is_subreaper():  # bls-serve: the killed stubs are its children now, and nobody else reaps them
        left = reap_group(proc.pid, timeout_s=max(0.5, min(5.0, deadline - time.monotonic())))
        if left:
            log.warning("processes of tritonserver's group still there after it was killed: %s", left)
    return StopReport(code, result.drained, stuck, held, reason if not result.drained or hung else "", hung)


def report_hang(pid: int, drained: bool, deadline: float, log_file: Path | None) -> None:
    """Say loudly that tritonserver did not exit after SIGTERM, with its threads' stacks (into
    `log_file`) if gdb is here and the stop's time allows."""
    state = ("every model was unloaded first, so no request was in flight" if drained
             else "models were still busy: their in-flight requests fail")
    stacks = ""
    left = deadline - time.monotonic() - 1.0
    if shutil.which("gdb") and log_file and left > 1.0:
        try:
            stacks = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
                                    capture_output=True, text=True, timeout=min(10.0, left)).stdout
        except (subprocess.TimeoutExpired, OSError) as exc:
            stacks = f"(gdb failed: {exc})"
        with open(log_file, "a") as f:
            f.write(f"\n--- tritonserver ignored SIGTERM; its threads:\n{stacks}\n")
    log.error("tritonserver did not exit after SIGTERM (%s): killing it%s", state,
              f"; its thread stacks are in {log_file}" if stacks else "")


def kill_group(pgid: int) -> None:
    """SIGKILL a process group (tritonserver and its stubs); one already gone is no error."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
