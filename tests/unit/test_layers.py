"""The folders are the layers: each imports only the ones under it, and nothing imports in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bls_pipeline"
# Lowest first; a module may import its own layer and the ones before it.
LAYERS = ["base", "contract", "stages", "engines", "runtime", "flow", "adapter", "serve", "tools"]


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports() -> dict[str, set[str]]:
    """bls_pipeline module -> the bls_pipeline modules it imports (at any depth, lazily too)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        package = name if rel.name == "__init__" else name.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.startswith("bls_pipeline"):
                    found.add(target)
                    found.update(f"{target}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("bls_pipeline"))
        graph[name] = found
    return {m: {t for t in targets if t in graph and t != m} for m, targets in graph.items()}


def test_each_layer_imports_only_the_layers_under_it():
    wrong = []
    for module, targets in _imports().items():
        if _layer(module) not in LAYERS:
            continue
        for target in targets:
            if _layer(target) in LAYERS and LAYERS.index(_layer(target)) > LAYERS.index(_layer(module)):
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_no_import_cycles():
    graph = {m: {t for t in ts if not t.endswith("__init__")} for m, ts in _imports().items()}
    cycles = []

    def visit(node, path):
        for nxt in graph.get(node, ()):
            if nxt in path:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif len(path) < 12:
                visit(nxt, path + [nxt])

    for module in graph:
        visit(module, [module])
    assert cycles == []


def test_test_files_have_unique_names():
    """pytest imports test files by basename (no packages): two of one name stop collection."""
    names = [p.name for p in (Path(__file__).resolve().parents[1]).rglob("test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def test_engine_build_stands_below_serving():
    """engine_build (a build step) may use the pure layers, never the server, client or tools."""
    wrong = []
    for path in (PACKAGE.parent / "engine_build").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            wrong += [f"{path.name} imports {n}" for n in names if _layer(n) in ("adapter", "serve", "tools")
                      and n.startswith("bls_pipeline")]
    assert wrong == []
