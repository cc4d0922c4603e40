"""Every command block in the README and docs/ is run by a test or says why it is not."""

from __future__ import annotations

import pytest

from docblocks import DOCS, REPO, commands, unmarked_blocks

# The test that runs each document's `bash run` blocks.
RUNNERS = {"README.md": "tests/integration/test_readme_commands.py",
           "docs/extending.md": "tests/integration/test_extending.py",
           "docs/reliability.md": "tests/integration/test_reliability_doc.py",
           "docs/performance.md": "tests/integration/test_perf_analyzer.py",
           "docs/deploy.md": "tests/integration/test_deploy_doc.py"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_each_block_is_run_or_says_why_not(doc):
    assert unmarked_blocks(doc) == [], f"{doc.name}: mark these blocks `bash run` or <!-- not run by the tests: why -->"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_run_blocks_have_a_test_that_runs_them(doc):
    name = str(doc.relative_to(REPO))
    if commands(doc):
        assert name in RUNNERS and (REPO / RUNNERS[name]).is_file()


def test_the_readme_is_for_users():
    assert len((REPO / "README.md").read_bytes()) < 12 * 1024


def test_the_servers_the_run_blocks_start_take_ports_of_their_own():
    """The tests run these blocks side by side (pytest-xdist workers): a bls-serve that leaves
    a port at its default clashes with the README's and exits, and the block waiting for it
    to be ready waits forever (seen with the status port, 8003)."""
    import re

    from bls_pipeline.serve.options import ServerOptions

    defaults = {"http": 8000, "grpc": 8001, "metrics": 8002, "status": 8003}
    assert {k: getattr(ServerOptions(REPO / "models"), f"{k}_port") for k in ("http", "grpc", "metrics")} == \
        {k: v for k, v in defaults.items() if k != "status"}
    taken: dict[int, str] = {}
    for doc in (d for d in DOCS if commands(d)):
        for block in commands(doc):
            for line in (ln for ln in block.splitlines() if re.match(r"\S*bls-serve\b", ln)):
                ports = {what: int(p) for what, p in re.findall(r"--(http|grpc|metrics|status)-port (\d+)", line)}
                where = f"{doc.relative_to(REPO)}: {line.split('#')[0].strip()}"
                for what, port in ({**defaults, **ports}).items():
                    assert port not in taken, f"{where}: {what} port {port} is also {taken[port]}'s"
                    taken[port] = where
