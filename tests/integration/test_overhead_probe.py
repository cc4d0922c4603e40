"""bls-overhead measures the paths it names: each request really crosses its hops."""

import re

import pytest

from bls_pipeline.tools import overhead

pytestmark = pytest.mark.integration

HOLD_MS = 5


def _inferences(server, model: str) -> int:
    import tritonclient.http as tc

    client = tc.InferenceServerClient(server.http_url)
    try:
        return int(client.get_inference_statistics(model)["model_stats"][0]["inference_count"])
    finally:
        client.close()


def test_each_path_crosses_its_hops(tmp_path, server_factory):
    server = server_factory(overhead.probe_repository(tmp_path, hold_ms=HOLD_MS), tmp_path)
    try:
        p50 = overhead.measure(server.grpc_url, requests=10, rounds=2, warmup=2)
        per_path = 2 * (10 + 2)
        assert _inferences(server, "probe_classifier") == 3 * per_path  # direct, bls and ensemble reach it
        assert _inferences(server, "probe_bls") == _inferences(server, "probe_prep") == per_path
    finally:
        server.stop()
    assert set(p50) == set(overhead.PATHS) and all(len(v) == 2 for v in p50.values())
    for path in ("direct", "bls", "ensemble"):  # the classifier stand-in held each of them
        assert min(p50[path]) >= HOLD_MS
    assert max(p50["stub"]) < HOLD_MS
    table = overhead.report(p50, HOLD_MS)
    assert "| bls - stub - hold (one BLS child call) |" in table and "| ensemble - stub - hold (one ensemble hop) |" in table


def test_command_line_prints_the_table(capsys):
    assert overhead.main(["--requests", "3", "--rounds", "1", "--hold-ms", "2", "--hold-mode", "stream"]) == 0
    out = capsys.readouterr().out
    rows = dict(re.findall(r"^\| (direct|stub|bls|ensemble) \| ([\d.]+) \|", out, re.M))
    assert set(rows) == set(overhead.PATHS) and all(float(v) > 0 for v in rows.values())
