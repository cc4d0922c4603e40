"""Code blocks of the README and docs/: parsed here, run by the tests that own them.

A ```bash block is either `bash run` (a test runs it as it stands) or preceded by a line
`<!-- not run by the tests: <reason> -->`. A block with `file=PATH` in its info string is a
file the reader writes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FILE_BLOCK = re.compile(r"```\w+ file=(\S+)\n(.*?)```", re.S)
RUN_BLOCK = re.compile(r"```bash run\n(.*?)```", re.S)
ANY_BASH = re.compile(r"(?:^(<!--[^\n]*-->)\n)?```bash( run)?\n", re.M)
NOT_RUN = re.compile(r"<!-- not run by the tests[^:]*: .+ -->")


def files(doc: Path) -> dict[str, str]:
    return dict(FILE_BLOCK.findall(doc.read_text()))


def commands(doc: Path) -> list[str]:
    return RUN_BLOCK.findall(doc.read_text())


def unmarked_blocks(doc: Path) -> list[int]:
    """Line numbers of ```bash blocks that are neither run nor marked as not run."""
    text = doc.read_text()
    return [text[:m.start(0)].count("\n") + 1 for m in ANY_BASH.finditer(text)
            if not m.group(2) and not (m.group(1) and NOT_RUN.fullmatch(m.group(1)))]


def copy_shipped_models(models: Path, dst: Path) -> Path:
    """The folders of `models` that ship in models/ (with what `models` exported into them;
    none of the test repository's variants), copied into `dst`: a reader's models/."""
    for folder in sorted(p.name for p in (REPO / "models").iterdir() if p.is_dir()):
        shutil.copytree(models / folder, dst / folder, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def user_checkout(root: Path, models: Path) -> Path:
    """A reader's checkout in `root`: copy_shipped_models of `models`, the samples and this .venv."""
    copy_shipped_models(models, root / "models")
    (root / "samples").symlink_to(REPO / "samples")
    (root / ".venv").symlink_to(REPO / ".venv")
    return root


def run_block(block: str, cwd: Path, timeout: int = 420) -> subprocess.CompletedProcess:
    """One command block through bash, as a reader would paste it; its process group (a
    server it started in the background included) is gone afterwards."""
    proc = subprocess.Popen(["bash", "-ec", block], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the block ran past {timeout} s; what it printed:\n{out[-6000:]}") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(block, proc.returncode, out)


def tables(out: str) -> list[dict[str, tuple[str, str]]]:
    """bls-classify's tables in `out`: per table, file -> (its top class, its route)."""
    found = []
    for chunk in re.split(r"^file\s+score\s+class\s+route$", out, flags=re.M)[1:]:
        rows = re.findall(r"^(\S+\.(?:jpg|png))\s+(?:\d\.\d{3}|-)\s+(.+?)\s+(\S+:\S+)$", chunk, re.M)
        found.append({name: (top, route) for name, top, route in rows})
    return found


def details(out: str) -> list[dict[str, list[str]]]:
    """bls-classify's tables in `out`: per table, file -> the lines printed under it, stripped
    (the flow's own outputs `NAME: value`, its regions `region N [x0,y0,x1,y1] ...`)."""
    found = []
    for chunk in re.split(r"^file\s+score\s+class\s+route$", out, flags=re.M)[1:]:
        table: dict[str, list[str]] = {}
        current = None
        for line in chunk.splitlines():
            row = re.match(r"^(\S+\.(?:jpg|png))\s", line)
            if row:
                current = table.setdefault(row.group(1), [])
            elif current is not None and line.startswith(" ") and line.strip():
                current.append(line.strip())
            else:
                current = None
        found.append(table)
    return found
