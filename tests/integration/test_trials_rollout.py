"""A version rolled forward through shadow, canary and promotion under load, on a server of
its own (docs/reliability.md): no request lost, the shadow's agreement metrics equal to what
the two versions answer in process, and each step refused with a clear message when it
cannot be taken."""

from __future__ import annotations

import os
import re
import shutil
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from bls_pipeline.flow import LocalFlow
from bls_pipeline.engines.onnx import OnnxModel
from bls_pipeline.runtime.results import ImageRequest
from bls_pipeline.serve.rollout import RolloutError, main as rollout_main, report, trial
from test_reliability import FLOW, MAIN, RECHECK_S, Load, flow_on_main_alone  # Load sends to FLOW

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def trial_repo(model_repo, tmp_path_factory) -> Path:
    """MAIN version 1 (efficientnet_lite0's shipped weights) and a flow on it alone; version 2's folder
    is added once the server runs (present at start, it alone would load)."""
    # copied, not linked: onnx refuses to read hard-linked weights (version 2 is made with onnx)
    return flow_on_main_alone(model_repo, tmp_path_factory.mktemp("trials") / "models")


# Version 2's logits are version 1's times this: the mug's top-1 score (efficientnet_lite0
# is sure of it) then moves by 0.05-0.1, inside some of the shadow's bounds and not others.
V2_SCALE = 0.8


def _add_version_2(repo: Path) -> Path:
    """Version 2: version 1's graph with its logits scaled by V2_SCALE. Same ranking (top-1
    and top-5 agree on every image), softer probabilities (the top-1 score moves by a known
    amount)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(repo / MAIN / "1" / "model.onnx"))  # its external weights too
    graph = model.graph
    (out,) = graph.output
    graph.initializer.append(numpy_helper.from_array(np.array(V2_SCALE, np.float32), "v2_scale"))
    graph.node.append(helper.make_node("Mul", [out.name + "_v1", "v2_scale"], [out.name]))
    for node in graph.node[:-1]:
        node.output[:] = [out.name + "_v1" if o == out.name else o for o in node.output]
    v2 = repo / MAIN / "2"
    shutil.copytree(repo / MAIN / "1", v2, copy_function=os.link, ignore=shutil.ignore_patterns("model.onnx*"))
    onnx.save(model, str(v2 / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    return v2


def _known_shadow(repo: Path, image: bytes):
    """What the shadow counts for `image` twice, the two versions run in process."""
    def runner(version: str):
        session = OnnxModel(repo / MAIN / version / "model.onnx", ["input"], ["output"])
        return lambda batch: session.run({"input": batch})["output"]

    with LocalFlow(repo / FLOW, {MAIN: runner("1"), f"{MAIN}@2": runner("2")},
                   parameters={"shadow": f"{MAIN}={MAIN}@2"}) as flow:
        _, timings = flow.run([ImageRequest([image, image])])
    (stats,) = timings.trials.values()
    return stats


def srv_config(server, key: str) -> dict:
    from bls_pipeline.serve.admin import RepositoryAdmin

    return RepositoryAdmin(server.http_url, key).config(FLOW)


def _shadow_counts(server) -> dict[str, float]:
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for name, labels, value in re.findall(r"^(bls_shadow_\w+)\{(.*)\} (\S+)$", text, re.M):
        tags = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if tags.get("model") == FLOW and tags.get("candidate") == f"{MAIN}@2":
            key = name + "".join(f":{tags[t]}" for t in ("outcome", "side", "le") if t in tags)
            out[key] = out.get(key, 0.0) + float(value)
    return out


def test_shadow_then_canary_then_promotion_under_load(trial_repo, server_factory, tmp_path, sample_images):
    srv = server_factory(trial_repo, tmp_path, models=(FLOW, MAIN), watchdog_interval_s=1.0, exit_timeout_s=5)
    key, mug = srv.options.admin_key, sample_images["mug"]
    v1, v2 = f"{MAIN}:direct", f"{MAIN}@2:direct"
    try:
        # Refused: version 2 is not loaded, so no canary yet; nor a flow that is not there.
        with pytest.raises(RolloutError, match=f"model {MAIN} version 2 is not loaded: start with --shadow"):
            trial(srv.http_url, key, MAIN, 2, flow=FLOW, canary=0.1)
        with pytest.raises(RolloutError, match="flow model classify_bls is not READY"):
            trial(srv.http_url, key, MAIN, 2, shadow=1.0)
        # A shadow of a version with no folder: its load fails, and the flow's trials go back.
        with pytest.raises(RolloutError, match=f"model {MAIN} version 3 is not READY after its load"):
            trial(srv.http_url, key, MAIN, 3, flow=FLOW, shadow=1.0)
        assert not {k for k in srv_config(srv, key)["parameters"] if k.startswith(("shadow", "canary"))}
        _add_version_2(trial_repo)
        known = _known_shadow(trial_repo, mug)
        with Load(srv, mug) as load:
            load.wait_for(4)
            trial(srv.http_url, key, MAIN, 2, flow=FLOW, shadow=1.0, say=print)
            shadow_on = time.monotonic()
            deadline = time.monotonic() + 120
            while (counts := _shadow_counts(srv)).get("bls_shadow_rows_total", 0) < 20:
                assert time.monotonic() < deadline, counts
                time.sleep(0.5)
            said = report(srv.metrics_url, FLOW)
            print(said)
            assert re.search(rf"{MAIN}@2 shadowing {MAIN}: \d+ calls compared, 0 failed", said), said
            assert "top-1 agreement" in said and "mean seconds per call" in said
            # The flow's copy with the canary is swapped in before trial() returns: answers from it
            # can come before canary_on, none before canary_asked.
            canary_asked = time.monotonic()
            trial(srv.http_url, key, MAIN, 2, flow=FLOW, canary=0.5, say=print)
            canary_on = time.monotonic()
            load.wait_for(20, sent_after=canary_on + RECHECK_S)
            assert rollout_main([MAIN, "2", "--url", srv.http_url, "--admin-key", key, "--flow", FLOW]) == 0  # promote
            promoted = time.monotonic()
            load.wait_for(8, sent_after=promoted + RECHECK_S)
        summary = load.summary("shadow -> canary -> promotion")
        assert summary["failed"] == {}  # nothing lost at any step
        records = load.records
        # The shadow never answered: until the canary, every answer is version 1's.
        assert {r.route for r in records if r.answered < canary_asked} == {v1}
        during_canary = [r.route for r in records if canary_on + RECHECK_S < r.sent and r.answered < promoted]
        assert v1 in during_canary and v2 in during_canary, during_canary
        assert {r.route for r in records if r.sent > promoted + RECHECK_S} == {v2}
        # The agreement the server counted is what the two versions answer in process: the
        # same top-1 and top-5 on every row, and the top-1 score moved by the same amount.
        rows = counts["bls_shadow_rows_total"]
        assert known.top1_agree == known.top5_overlap == known.rows == 2
        assert counts["bls_shadow_top1_agree_total"] == counts["bls_shadow_top5_overlap_total"] == rows
        server_moves = [counts[f"bls_shadow_score_diff_total:{le}"] / rows
                        for le in ("0.001", "0.01", "0.05", "0.1", "0.25", "0.5")]
        assert server_moves == [n / known.rows for n in known.score_diff[:6]]
        assert 0 < server_moves.count(0.0) < 6, server_moves  # it moved: not within the smallest bounds
        # Calls drawn before version 2 was READY were not mirrored; none failed.
        assert counts["bls_shadow_calls_total:compared"] > 0 and counts["bls_shadow_calls_total:failed"] == 0
        assert counts["bls_shadow_seconds_total:candidate"] > 0 and counts["bls_shadow_seconds_total:stable"] > 0
        assert shadow_on < canary_on
    finally:
        srv.stop()
