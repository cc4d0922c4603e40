"""When bls-serve counts tritonserver as hung (serve/liveness.py's judge): answers over time in,
a verdict out; and the checks themselves against a port that accepts and never answers."""

from __future__ import annotations

import socket
import threading
import time

from bls_pipeline.serve.liveness import Liveness, LivenessJudge


def test_a_protocol_silent_for_the_hang_timeout_is_a_hang():
    judge = LivenessJudge(hang_after_s=8.0, since=0.0)
    for t in (1.0, 2.0, 3.0):
        judge.record("HTTP", True, t)
        judge.record("gRPC", True, t)
    judge.record("HTTP", False, 6.0, "timed out")
    assert judge.hung(10.9) is None  # 7.9 s since HTTP last answered
    assert judge.hung(11.0) == "no answer over HTTP for 8.0 s (timed out)"


def test_one_answer_clears_the_silence():
    judge = LivenessJudge(hang_after_s=8.0, since=0.0)
    judge.record("gRPC", False, 5.0, "timed out")
    judge.record("gRPC", True, 7.0)
    assert judge.hung(20.0) is None and judge.describe(20.0) is None


def test_a_protocol_that_never_answered_is_silent_since_the_start():
    judge = LivenessJudge(hang_after_s=8.0, since=100.0)
    judge.record("HTTP", True, 101.0)
    judge.record("gRPC", False, 103.0, "connection refused")
    assert judge.hung(108.5) == "no answer over gRPC for 8.5 s (connection refused)"


def test_the_status_line_waits_for_half_the_hang_timeout():
    """One slow answer on a busy machine does not take the server out of rotation."""
    judge = LivenessJudge(hang_after_s=8.0, since=0.0)
    judge.record("HTTP", True, 1.0)
    judge.record("HTTP", False, 3.0, "timed out")
    assert judge.describe(4.9) is None
    assert judge.describe(5.0) == "HTTP liveness unanswered for 4 s (timed out)"


def test_a_server_that_accepts_and_never_answers_is_found_hung_within_its_timeout():
    """A listening socket nobody reads: what a SIGSTOPped tritonserver looks like from outside."""
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(64)
    port = mute.getsockname()[1]
    verdict = threading.Event()
    reasons = []

    def hung(reason):
        reasons.append(reason)
        verdict.set()
    began = time.monotonic()
    checks = Liveness(f"127.0.0.1:{port}", None, hung, hang_after_s=1.5, interval_s=0.1, timeout_s=0.5)
    checks.start()
    try:
        assert verdict.wait(timeout=10)
        took = time.monotonic() - began
        assert reasons[0].startswith("no answer over HTTP for") and "timed out" in reasons[0]
        assert 1.5 <= took < 5.0
    finally:
        checks.stop()
        mute.close()
