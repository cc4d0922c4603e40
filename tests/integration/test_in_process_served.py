"""A flow running its classifier in its own process (run_in_process), on a real tritonserver:
it answers as LocalFlow does, the flow's metrics count the calls Triton's do not see, the
classifier's own model stays on standby, and Triton's readiness still decides (unload the
classifier and the flow says UNAVAILABLE; load it back and it answers)."""

from __future__ import annotations

import re
import shutil
import time
import urllib.request

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from bls_pipeline.runtime.local import LocalFlow
from bls_pipeline.base.modelconfig import config_variant
from bls_pipeline.serve.client import ClassifyClient
from bls_pipeline.tools.footprint import measure

from polling import eventually

pytestmark = pytest.mark.integration

FLOW, CHILD = "classify_bls", "efficientnet_lite0_onnx"
PARAMS = {"cascade_classifiers": "none", "classifiers": CHILD, "tta_threshold": "0", "run_in_process": CHILD,
          "child_retry_s": "1", "route_recheck_s": "1"}


@pytest.fixture(scope="module")
def repo(model_repo, tmp_path_factory):
    """classify_bls on efficientnet_lite0 alone, run in process, and the classifier's folder."""
    repo = tmp_path_factory.mktemp("in_process") / "models"
    for model in (FLOW, CHILD):
        shutil.copytree(model_repo / model, repo / model, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / FLOW / "config.pbtxt").write_text(config_variant(repo / FLOW, FLOW, PARAMS))
    return repo


def _metric(server, metric: str, **labels) -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    total = 0.0
    for m in re.finditer(rf"^{metric}\{{(.*)\}} (\S+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def _private_mib(server, process: str) -> float:
    (row,) = [r for r in measure(server) if r.process == process]
    return row.private_mib


def test_the_flow_runs_its_classifier_in_process_and_says_so_everywhere(repo, server_factory, tmp_path, sample_images):
    srv = server_factory(repo, tmp_path)
    try:
        assert srv.plan().standby == {CHILD: f"run in process by {FLOW}"}
        log = srv.options.log_file.read_text()
        assert f"{FLOW} runs {CHILD} version 1 in process (model.onnx" in log

        images = [sample_images["mug"], sample_images["chelsea"]]
        expected = LocalFlow(repo / FLOW).classify(images, topk=5)
        for protocol in ("http", "grpc"):
            out = ClassifyClient(srv.url(protocol), protocol, model=FLOW).classify(images, topk=5)
            np.testing.assert_array_equal(out["CLASS_IDS"], expected.class_ids)
            np.testing.assert_allclose(out["SCORES"], expected.scores, atol=1e-5)
            assert set(out["ROUTE"].reshape(-1)) == {f"{CHILD}:direct".encode()}

        # The flow counts the calls (4 images in 2 requests); Triton's classifier saw none.
        deadline = time.monotonic() + 5
        while _metric(srv, "bls_child_images_total", model=FLOW, child=CHILD) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _metric(srv, "bls_child_images_total", model=FLOW, child=CHILD) == 4
        assert _metric(srv, "nv_inference_count", model=CHILD) == 0
        # The classifier's model holds no engine (standby); the flow instance that answered holds one.
        flows = [_private_mib(srv, f"{FLOW}_0_{i}") for i in (0, 1)]
        assert max(flows) > _private_mib(srv, f"{CHILD}_0_0") + 40, flows

        # Triton's readiness still decides: the classifier unloaded, the flow has no candidate.
        srv.unload_model(CHILD)
        deadline = time.monotonic() + 30
        while srv.admin.states().get(CHILD) in ("READY", "UNLOADING"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # The flow looks again within route_recheck_s: its requests are refused from then on.
        refused = eventually(lambda: _outcome(srv, images[:1]), "a request refused with the classifier gone",
                             timeout_s=10)
        assert isinstance(refused, InferenceServerException) and CHILD in refused.message(), refused
        assert refused.status() == "503"
        srv.load_model(CHILD)
        out = eventually(lambda: (lambda o: o if isinstance(o, dict) else None)(_outcome(srv, images[:1],
                                                                                         expect_error=False)),
                         "an answer with the classifier back", timeout_s=10)
        np.testing.assert_array_equal(out["CLASS_IDS"], expected.class_ids[:1])
    finally:
        srv.stop()


def _outcome(srv, images, expect_error: bool = True):
    """One request to the flow: its outputs, or the InferenceServerException it failed with;
    None while it is not yet what the caller waits for (an answer while an error is awaited,
    or the other way round)."""
    client = ClassifyClient(srv.http_url, "http", model=FLOW)
    try:
        out = client.classify(images, topk=5)
    except InferenceServerException as exc:
        return exc if expect_error else None
    finally:  # an exception's traceback holds the client: an open connection holds tritonserver's exit
        client.close()
    return None if expect_error else out
