"""Every command block in the README and docs/ is run by a test or says why it is not."""

from __future__ import annotations

import pytest

from docblocks import DOCS, REPO, commands, unmarked_blocks

# The test that runs each document's `bash run` blocks.
RUNNERS = {"README.md": "tests/integration/test_readme_commands.py", "docs/extending.md": "tests/integration/test_extending.py",
           "docs/reliability.md": "tests/integration/test_reliability_doc.py",
           "docs/performance.md": "tests/integration/test_perf_analyzer.py"}


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
