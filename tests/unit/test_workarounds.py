"""Every workaround of a Triton 2.51 defect in one place (serve/workarounds.py): each names a
test that exists, and docs/reliability.md lists each one."""

from __future__ import annotations

import re
from pathlib import Path

from bls_pipeline.serve.workarounds import WORKAROUNDS

REPO = Path(__file__).resolve().parents[2]


def test_each_workaround_names_a_test_that_exists():
    assert len({w.name for w in WORKAROUNDS}) == len(WORKAROUNDS)
    for w in WORKAROUNDS:
        path, name = w.test.split("::")
        assert (REPO / path).is_file(), w
        assert re.search(rf"^def {name}\(", (REPO / path).read_text(), re.M), w


def test_the_docs_list_every_workaround_and_what_a_newer_triton_lets_go():
    doc = (REPO / "docs" / "reliability.md").read_text()
    section = doc.split("## Triton 2.51 workarounds", 1)[1].split("\n## ", 1)[0]
    for w in WORKAROUNDS:
        row = [line for line in section.splitlines() if line.startswith(f"| {w.name} |")]
        assert len(row) == 1, f"docs/reliability.md lists no row for {w.name!r}"
        assert w.test in row[0] and w.newer.split(":")[0] in row[0], row[0]
