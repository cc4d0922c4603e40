"""bls-bench's per-region baselines do read_text's work: served from the bench's own
repository on a real tritonserver, they read samples/sign.png and the rendered pages to the
same TEXT and count the same lines as read_text, so a regions/s ratio compares batching alone."""

from __future__ import annotations

import shutil

import pytest

from bls_pipeline.serve.client import ClassifyClient
from bls_pipeline.tools.bench_targets import HANDWRITTEN, HANDWRITTEN_CALLS, bench_repository
from bls_pipeline.tools.bench_images import region_pages

pytestmark = pytest.mark.integration
BASELINES = ("read_text_per_region", HANDWRITTEN)


@pytest.fixture(scope="module")
def bench_server(repo_root, tmp_path_factory, server_factory):
    from engine_build.ocr import build_ocr_models

    tmp = tmp_path_factory.mktemp("bench_repo")
    src = tmp / "src"
    shutil.copytree(repo_root / "models", src,
                    ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", "*.onnx.json", "*.plan", "*.xml", "*.bin",
                                                  "__pycache__"))
    build_ocr_models(src)  # cached under build/
    bench_repository(src, tmp / "models", keep_branches=False)
    server = server_factory(tmp / "models", tmp, models=("read_text", *BASELINES, *HANDWRITTEN_CALLS))
    yield server
    server.stop()


def _read(server, model: str, pages: list[bytes]) -> dict:
    client = ClassifyClient(server.url("grpc"), "grpc", model=model)
    try:
        return client.classify(pages)
    finally:
        client.close()


@pytest.mark.parametrize("baseline", BASELINES)
def test_a_baseline_reads_what_read_text_reads(bench_server, repo_root, baseline):
    pages = region_pages(repo_root / "samples")
    batched, single = _read(bench_server, "read_text", pages), _read(bench_server, baseline, pages)
    assert batched["TEXT"][0, 0] == b"TRITON AVE\nBLS 2026\nFRAGILE"  # the sign, its last line upside down
    assert single["TEXT"][:, 0].tolist() == batched["TEXT"][:, 0].tolist()
    assert single["REGION_COUNT"][:, 0].tolist() == batched["REGION_COUNT"][:, 0].tolist()
    assert batched["REGION_COUNT"][:, 0].tolist()[0] == 3 and (batched["REGION_COUNT"] > 0).all()
