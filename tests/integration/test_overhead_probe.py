"""bls-overhead measures the paths it names: each request really crosses its hops."""

import re
import time

import pytest

from bls_pipeline.tools import overhead

pytestmark = pytest.mark.integration

HOLD_MS = 5
REQUESTS, ROUNDS, WARMUP = 10, 2, 30  # WARMUP: measure()'s default, which bls-overhead uses


def _inferences(url: str, model: str) -> int:
    import tritonclient.grpc as tc

    client = tc.InferenceServerClient(url)
    try:
        return int(client.get_inference_statistics(model, as_json=True)["model_stats"][0]["inference_count"])
    finally:
        client.close()


def test_command_line_crosses_each_paths_hops(monkeypatch, capsys):
    """bls-overhead as a user runs it (one server of its own): while its server is up, the
    statistics API counts every request on each hop of its path."""
    counted = {}
    per_path = ROUNDS * (REQUESTS + WARMUP)
    expected = {"probe_classifier": 3 * per_path,  # direct, bls and ensemble reach it
                "probe_bls": per_path, "probe_prep": per_path, "probe_stub": per_path}

    def measure_and_count(url, *args, **kwargs):
        p50 = real_measure(url, *args, **kwargs)
        # Triton counts a request when it releases it, which can come a moment after the
        # client has its response: read the statistics until they settle (or 5 s pass).
        deadline = time.monotonic() + 5
        while True:
            counted.update({model: _inferences(url, model) for model in expected})
            if counted == expected or time.monotonic() > deadline:
                return p50
            time.sleep(0.1)

    real_measure = overhead.measure
    monkeypatch.setattr(overhead, "measure", measure_and_count)
    assert (overhead.main(["--requests", str(REQUESTS), "--rounds", str(ROUNDS), "--hold-ms", str(HOLD_MS),
                           "--hold-mode", "stream"]) == 0)
    assert counted == expected

    out = capsys.readouterr().out
    rows = {path: [float(v) for v in values.split(" | ")] for path, values in
            re.findall(r"^\| (direct|stub|bls|ensemble) \| ([\d. |]+) \|$", out, re.M)}
    # median, then each round
    assert set(rows) == set(overhead.PATHS) and all(len(v) == 1 + ROUNDS for v in rows.values())
    for path in ("direct", "bls", "ensemble"):  # the classifier stand-in held each of them
        assert min(rows[path]) >= HOLD_MS
    assert max(rows["stub"]) < HOLD_MS
    assert ("| bls - stub - hold (one BLS child call) |" in out
            and "| ensemble - stub - hold (one ensemble hop) |" in out)
