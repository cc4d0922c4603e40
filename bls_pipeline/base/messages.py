"""Triton's own words: the messages and log lines that tell one condition from another.

Triton 2.51 hands a BLS caller only the message of a failed child call (its status code is
lost), prefixes a request's error with its id, and says a failed reload or a fatal signal only
in its log. What reads those words (the transport's retries, the watchdog's probes, the
launcher's log reader, bls-bench's tally) reads them from here, and first_line keeps one line
of a message that runs to many; serve/workarounds.py lists the
workarounds that depend on them.
"""

from __future__ import annotations

import re

__all__ = ["BATCH_LIMIT", "BUSY", "DEAD_STUB", "LOAD_FAILED", "LOADED", "PROBE_BUSY", "QUEUE_FULL", "QUEUE_TIMEOUT",
           "REQUEST_ID", "TRITON_FATAL", "UNAVAILABLE", "first_line"]

# A request refused for overload, before any model saw it: the queue was full as it came, or
# the request waited out the queue's timeout (both 503 / UNAVAILABLE).
QUEUE_FULL = "Exceeds maximum queue size"
QUEUE_TIMEOUT = "Request timeout expired"
BUSY = re.compile(f"{QUEUE_FULL}|{QUEUE_TIMEOUT}")
# A request to a model whose stub died (or stopped answering its health check): the model
# stays READY in every health API, and each request fails with this.
DEAD_STUB = re.compile(r"Stub process '(?P<instance>[^']+)' is not healthy")
# "This model (version) cannot take a request now", as opposed to a request it took and
# failed: a dead python stub (the model still READY), a model or version that is not (or no
# longer) loaded, and one being unloaded when the request reached it.
UNAVAILABLE = re.compile(rf"{DEAD_STUB.pattern}|Request for unknown model|Model '[^']+' is not ready")
# A probe refused for overload, or that timed out: says nothing of whether the model can answer.
PROBE_BUSY = re.compile(rf"{QUEUE_FULL}|{QUEUE_TIMEOUT}|timed? ?out", re.IGNORECASE)
# A request over the model's max_batch_size, as served now: the limit and the model.
BATCH_LIMIT = re.compile(r"batch-size must be <= (\d+) for '([^']+)'")
# What core's scheduler puts before a request's error message.
REQUEST_ID = re.compile(r"^\[request id: [^\]]*\] ")
# Log lines. A load (or a reload beside a serving copy) that failed: Triton keeps the serving
# copy READY, its repository index shows nothing, and only its log says so (model_lifecycle.cc).
LOAD_FAILED = re.compile(r"failed to load '(?P<model>[^']+)' version (?P<version>-?\d+): (?P<why>.*?)\"?$")
LOADED = re.compile(r"successfully loaded '(?P<model>[^']+)'")
# What tritonserver's signal handler prints as it crashes; on 2.51 it may then deadlock while
# printing the stack (a heap already corrupted): alive, answering nothing.
TRITON_FATAL = re.compile(r"Signal \((?P<signal>\d+)\) received")


def first_line(text: str | None) -> str:
    """The first line of `text`, stripped (empty for none): what a one-line message keeps of
    an error that runs to many (a load failure with its traceback, a probe's answer)."""
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else ""
