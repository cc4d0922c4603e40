"""Bring back models whose python stub died.

Triton 2.51 never restarts a python-backend stub that was killed (OOM killer, SIGKILL):
the model stays READY in every health API while each request fails with "Stub process
'<model>_<i>_<j>' is not healthy". Worse, a model copy that gets a request after its stub
died can never unload (the request's response factory is never freed), and tritonserver
can then not exit cleanly. So the watchdog looks first at the processes: every
`interval_s`, before each of its probes, it reads the python stubs in the server's process
group (processes.py) and remembers which instance each one serves. A stub of a READY model
that is now a zombie (Triton reaps a stub only when it unloads its copy) or gone, with no
live stub serving its instance, has died: the watchdog reloads that model at once (the
server's `reload_model`: a fresh copy loaded while the old one serves), logging loudly,
before its probe could reach the dead stub. A stub killed while no request (a probe
included) was in it then leaves nothing behind. A stub Triton found unhealthy that is still
alive (stopped, or wedged: its health check went unanswered) is killed once the fresh copy
serves, so the old copy can go and does not hold tritonserver's exit.

Then it sends each python model a small real inference (called models first), which
catches a stub that is alive but not healthy, and anything the processes cannot show.
The probes run on a thread of their own: a flow's probe can wait up to the probe timeout
while its flow retries a dead child, and the looks at the processes go on meanwhile, every
`interval_s` (with the probes' looks before each probe, one at a time).
Probe timeouts (a busy server) never trigger a reload. Probes carry the request parameter
`bls_probe: true` and the request id `bls_probe`: flow models answer them apart from users'
requests and leave them out of their bls_* metrics, bls-serve's latency histograms leave them
out (Triton's own nv_inference_* counters still count them).

A model whose probe fails (it answers an error, not a dead stub's, nor overload) stays
broken until a probe answers: it is probed again after `interval_s`, then twice as long each
time up to `backoff_max_s` (ProbeBackoff), so a model left broken with no traffic costs a
probe, and a failed request's lines in the log, every half minute, not every round; the log
says once that it fails and once that it answers again. A change in the python models READY
(one loaded, unloaded, or loaded with another config: a fixed child, say) probes the broken
ones at the next round.

Which models: the python models READY now, asked again before each round of probes (a
callable: bls-serve's reads Triton's repository index), so a model loaded later through the
repository API is probed and brought back like the others. Each probe's outcome is kept
(`outcomes`): bls-serve's /ready takes a flow whose last probe failed (500, or 503 for a
reason other than overload) as not ready; a probe refused for overload or timed out leaves
the last outcome as it was.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
from PIL import Image

from ..contract import PROBE_PARAMETER, PROBE_REQUEST_ID
from ..base.dtypes import numpy_dtype
from ..base.modelconfig import data_type
from ..base.messages import first_line
from .admin import model_ready
from .processes import model_of, stubs
from .workarounds import DEAD_STUB, PROBE_BUSY

__all__ = ["ProbeBackoff", "ProbeOutcome", "Recovery", "Watchdog", "dead_stub_model"]

log = logging.getLogger(__name__)


def dead_stub_model(message: str) -> str | None:
    """Model whose stub an error message reports dead ('<model>_<group>_<index>'), or None."""
    instance = dead_stub_instance(message)
    return (model_of(instance) or instance) if instance is not None else None


def dead_stub_instance(message: str) -> str | None:
    """The instance whose stub an error message reports dead ('<model>_<group>_<index>'), or None."""
    m = DEAD_STUB.search(message)
    return m.group("instance") if m else None


@dataclass(frozen=True)
class ProbeOutcome:
    ok: bool
    message: str  # the error's, when it failed
    at: float  # time.monotonic()


@dataclass(frozen=True)
class Recovery:
    model: str
    detected_at: float  # time.monotonic()
    recovered_at: float | None  # None: the reload failed


@dataclass
class _Failing:
    since: float  # its first failed probe, time.monotonic()
    delay: float  # from its last failed probe to its next
    next_at: float
    probes: int  # failed probes since it broke


class ProbeBackoff:
    """When to probe each model, and the one log line per change of state (pure: the time is
    given). A model probes every round while it answers; once a probe fails, after
    `interval_s`, then double that each time, up to `max_s`, until one answers."""

    def __init__(self, interval_s: float, max_s: float):
        self.interval_s, self.max_s = interval_s, max(max_s, interval_s)
        self._failing: dict[str, _Failing] = {}

    def due(self, model: str, now: float) -> bool:
        failing = self._failing.get(model)
        return failing is None or now >= failing.next_at

    def failed(self, model: str, message: str, now: float) -> str | None:
        """A probe failed: the line to log when the model was answering until now, else None."""
        failing = self._failing.get(model)
        if failing is not None:
            failing.probes += 1
            failing.delay = min(max(failing.delay * 2, self.interval_s), self.max_s)
            failing.next_at = now + failing.delay
            return None
        self._failing[model] = _Failing(now, self.interval_s, now + self.interval_s, 1)
        first = first_line(message) or "no message"
        return (f"watchdog: the probe of {model} failed: {first}; probing it again in {self.interval_s:g} s, then "
                f"twice as long each time, up to every {self.max_s:g} s, until it answers")

    def answered(self, model: str, now: float) -> str | None:
        """A probe answered: the line to log when the model was failing until now, else None."""
        failing = self._failing.pop(model, None)
        if failing is None:
            return None
        return (f"watchdog: {model} answers its probe again, after {now - failing.since:.0f} s and {failing.probes} "
                "failed probe(s)")

    def probe_soon(self, model: str | None = None) -> None:
        """Probe this failing model (every one, with None) at the next round; it stays failing."""
        for name, failing in self._failing.items():
            if model is None or name == model:
                failing.next_at, failing.delay = float("-inf"), 0.0  # the next failure waits interval_s again

    def forget(self, model: str) -> None:
        """No longer watched: nothing kept."""
        self._failing.pop(model, None)


def _tiny_jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (120, 120, 120)).save(buf, "JPEG")
    return buf.getvalue()


def _probe_inputs(tc, config) -> list:
    """A batch-1 request from a model's config: a tiny JPEG for strings, zeros otherwise."""
    inputs = []
    for spec in config.input:
        if spec.optional:
            continue
        dims = [1 if d < 0 else d for d in ([1] if config.max_batch_size > 0 else []) + list(spec.dims)]
        dtype = data_type(spec)
        if dtype == "STRING":
            tensor, data = tc.InferInput(spec.name, dims, "BYTES"), np.full(dims, _tiny_jpeg(), dtype=object)
        else:
            tensor, data = tc.InferInput(spec.name, dims, dtype), np.zeros(dims, dtype=numpy_dtype(dtype))
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs


def instance_names(model: str, config) -> set[str]:
    """The instances Triton makes of a model with KIND_CPU groups: "<model>_<group>_<index>"."""
    return {f"{model}_{g}_{i}" for g, group in enumerate(config.instance_group) if group.kind == group.KIND_CPU
            for i in range(group.count or 1)}


class Watchdog(threading.Thread):
    def __init__(self, url: str, models: Mapping | Callable[[], Mapping], reload: Callable[[str], None],
                 interval_s: float = 2.0, probe_timeout_s: float = 10.0, pgid: int | None = None,
                 backoff_max_s: float = 30.0):
        """models: {name: ModelConfig} of the python models to watch, or a callable giving them
        now (called before each round of probes), in the order to probe them. backoff_max_s:
        the longest wait between two probes of a model that stays broken."""
        super().__init__(name="bls-watchdog", daemon=True)
        import tritonclient.http as tc

        self._tc = tc
        self._url, self._timeout = url, probe_timeout_s
        self._client = tc.InferenceServerClient(url, network_timeout=probe_timeout_s,
                                                connection_timeout=probe_timeout_s)
        self._models = models if callable(models) else (lambda: models)
        self._probes: dict[str, list] = {}
        self._instances: dict[str, set[str]] = {}
        self._configs: dict[str, object] = {}  # model -> the config it was watched with
        self.backoff = ProbeBackoff(interval_s, backoff_max_s)
        self.outcomes: dict[str, ProbeOutcome] = {}  # model -> its last probe's, overload and timeouts aside
        self._pgid = pgid
        self._seen: dict[int, str] = {}  # pid -> instance of every stub seen alive, until it is gone
        self._reload = reload
        self._interval = interval_s
        self._halt = threading.Event()
        self._looking = threading.Lock()  # a look and its reloads, the looks' thread's or the probes'
        self._recovered_at: dict[str, float] = {}  # model -> when its last reload ended
        self._unhealthy: dict[str, str | None] = {}  # model -> the instance a probe found unhealthy
        self.recoveries: list[Recovery] = []
        self.rounds = 0  # rounds of probes completed, each probe after a look (a test waits for one to end)
        self._watch(self._models())
        if pgid is not None:
            self._dead_stubs()  # the stubs as they start: each one's instance is known before it can die

    def stop(self, timeout_s: float = 30.0) -> None:
        """Halt, and wait up to `timeout_s` for a probe or reload under way (each bounded by its
        own timeout) to end: a stop with a bound does not wait longer."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=timeout_s)
        if not self.is_alive():
            self._client.close()

    def instance_of(self, pid: int) -> str | None:
        """The instance a stub served when last seen alive (None: never seen)."""
        return self._seen.get(pid)

    def run(self) -> None:
        prober = threading.Thread(target=self._probe_rounds, name="bls-watchdog-probes", daemon=True)
        prober.start()
        while not self._halt.wait(self._interval):
            self._look()
        prober.join(timeout=30)

    def _look(self) -> None:
        with self._looking:
            for dead in self._dead_stubs():
                self._recover(dead)

    def _watch(self, models: Mapping) -> None:
        """Probe these models from now on (a model no longer among them: no longer)."""
        probes = {name: self._probes.get(name) or _probe_inputs(self._tc, cfg) for name, cfg in models.items()}
        instances = {name: self._instances.get(name) or instance_names(name, cfg) for name, cfg in models.items()}
        for name in models:
            if name not in self._probes and self.rounds:
                log.info("watchdog: probing %s from now on (READY since the last round)", name)
        if set(models) != set(self._configs) or any(self._configs[m] != cfg for m, cfg in models.items()):
            self.backoff.probe_soon()  # a model loaded, unloaded or changed: the broken ones may answer now
        for name in set(self._configs) - set(models):
            self.backoff.forget(name)
        with self._looking:
            self._probes, self._instances, self._configs = probes, instances, dict(models)
            # A model no longer READY keeps no outcome: loaded again, its first probe speaks for it,
            # not the failure of a copy that is gone.
            self.outcomes = {m: o for m, o in self.outcomes.items() if m in models}

    def _probe_rounds(self) -> None:
        while not self._halt.wait(self._interval):
            try:
                self._watch(self._models())
            except Exception as exc:  # noqa: BLE001 - the models watched so far still are
                log.warning("watchdog: could not list the models to probe (%s): probing the same ones", exc)
            for model, inputs in list(self._probes.items()):
                if self._halt.is_set():  # the server is being stopped: it drains, nothing is loaded again
                    return
                if not self.backoff.due(model, time.monotonic()):  # broken, and probed not long ago
                    continue
                self._look()  # before each probe: a probe into a dead stub would leave its copy stuck
                sent = time.monotonic()
                dead = self._probe(model, inputs)
                if dead is not None:
                    with self._looking:
                        if self._recovered_at.get(dead, float("-inf")) < sent:  # not reloaded since by a look
                            self._recover(dead)
            self.rounds += 1

    def _dead_stubs(self) -> list[str]:
        """READY models with a stub that died: one seen alive is now a zombie or gone (or a
        zombie never seen alive), and no live stub serves its instance. A model being
        unloaded is not READY; one being reloaded has the fresh copy's stubs alive."""
        if self._pgid is None:
            return []
        now = stubs(self._pgid)
        self._seen.update(now.live)
        alive = set(now.live.values())
        lost = [pid for pid in self._seen if pid not in now.live]
        suspects = {self._seen[pid] for pid in lost} - alive
        if now.dead - self._seen.keys():  # died before it was first seen: which instance has no live stub
            suspects |= set().union(*self._instances.values()) - alive
        for pid in lost:
            # Reaped (its copy was unloaded): forgotten after this look. One still exiting is
            # kept, or the zombie it becomes would be one never seen, its instance unknown.
            if pid not in now.dead and pid not in now.dying:
                del self._seen[pid]
        return [m for m, names in self._instances.items() if names & suspects and self._is_ready(m)]

    def _end(self, pids: set[int], instance: str | None) -> None:
        """Kill the stubs Triton found unhealthy that are still alive (stopped, or wedged), now
        that a fresh copy serves: the old copy can then go, and does not hold tritonserver's exit."""
        for pid in sorted(pids):
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                os.kill(pid, signal.SIGKILL)
            except (OSError, IndexError):  # gone meanwhile
                continue
            log.error("WATCHDOG: killed the unhealthy python stub of %s (pid %d, state %s): Triton found it not "
                      "answering its health check, and a fresh copy serves", instance, pid, state)

    def _is_ready(self, model: str) -> bool:
        # Plain HTTP, not self._client: the looks run on both threads, and the probes' client
        # (geventhttpclient) stays on the probes' thread. A server that does not answer has no
        # model to reload.
        return model_ready(self._url, model, self._timeout)

    def _probe(self, model: str, inputs: list) -> str | None:
        """Probe `model`; the model whose stub the answer reports dead, or None."""
        try:
            # Kept out of the flows' bls_* metrics (the parameter) and bls-serve's histograms (the id).
            self._client.infer(model, inputs, parameters={PROBE_PARAMETER: True}, request_id=PROBE_REQUEST_ID)
        except Exception as exc:  # noqa: BLE001 - a failed probe: its message says what
            message = str(exc)
            dead = dead_stub_model(message)
            if dead in self._probes:
                self._unhealthy[dead] = dead_stub_instance(message)
                return dead
            if not PROBE_BUSY.search(message):
                now = time.monotonic()
                self.outcomes[model] = ProbeOutcome(False, message, now)
                line = self.backoff.failed(model, message, now)
                if line:
                    log.warning("%s", line)
            return None
        now = time.monotonic()
        self.outcomes[model] = ProbeOutcome(True, "", now)
        line = self.backoff.answered(model, now)
        if line:
            log.info("%s", line)
        return None

    def _recover(self, model: str) -> None:
        detected = time.monotonic()
        instance = self._unhealthy.pop(model, None)
        unhealthy = ({pid for pid, name in stubs(self._pgid).live.items() if name == instance}
                     if instance and self._pgid is not None else set())
        log.error("WATCHDOG: the python stub of model %r is dead (Triton still reports it READY); reloading it", model)
        try:
            self._reload(model)
        except Exception as exc:  # noqa: BLE001
            log.error("WATCHDOG: reloading %r FAILED: %s", model, exc)
            self.recoveries.append(Recovery(model, detected, None))
            return
        self._end(unhealthy, instance)
        recovered = self._recovered_at[model] = time.monotonic()
        self.backoff.probe_soon(model)  # a fresh copy: probed at the next round
        log.error("WATCHDOG: model %r reloaded, serving again after %.1f s", model, recovered - detected)
        self.recoveries.append(Recovery(model, detected, recovered))
