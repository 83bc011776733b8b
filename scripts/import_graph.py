"""The import graph of the project's packages, checked against the layering rules (docs/architecture.md).

``python scripts/import_graph.py`` prints the package-level graph (edges with how many imports make them) and
exits 1 on an upward import or a cycle between modules; ``--dot`` prints Graphviz instead. Imports under
``if TYPE_CHECKING:`` are type-only and skipped; imports inside functions count (they are real dependencies).
tests/test_layering.py runs the same check in CI.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("hybridrag", "retrieval", "index_builder", "rerank", "training", "bench")
# Which of our packages each layer may import (besides itself). Sub-packages of retrieval have their own rows.
ALLOWED: dict[str, set[str]] = {
    "index_builder": set(),
    "rerank": set(),
    "retrieval.errors": {"index_builder"},
    "retrieval.observability": {"index_builder"},
    "retrieval.search": {"index_builder", "rerank", "retrieval.errors", "retrieval.observability"},
    "retrieval.live": {"index_builder", "rerank", "retrieval.errors", "retrieval.search"},
    "retrieval.generation": {"index_builder", "retrieval.errors", "retrieval.search"},
    "retrieval.engines": {"index_builder", "rerank", "retrieval.errors", "retrieval.search", "retrieval.live"},
    "retrieval.serving": {"index_builder", "rerank", "retrieval.errors", "retrieval.search", "retrieval.live",
                          "retrieval.generation", "retrieval.observability", "retrieval.api"},
    "retrieval.integrations": {"retrieval.serving", "retrieval.api"},  # framework adapters over the client
    "retrieval.evaluate": {"index_builder", "rerank", "retrieval.errors", "retrieval.search"},
    "retrieval.config": {"index_builder", "retrieval.search", "retrieval.live", "retrieval.generation", "retrieval.engines",
                         "retrieval.serving", "retrieval.observability", "retrieval.errors"},
    "retrieval.app": {"index_builder", "retrieval"},
    "retrieval.api": set(),
    "retrieval": {"index_builder", "rerank", "retrieval"},  # retrieval/__init__.py re-exports lazily
    "training": {"index_builder", "rerank", "retrieval"},
    "bench": {"index_builder", "rerank", "retrieval", "training"},
    "hybridrag": {"index_builder", "rerank", "retrieval", "training", "bench"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str:
    """The most specific row of ALLOWED that ``module`` falls under."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in ALLOWED:
            return ".".join(parts[:n])
    return parts[0]


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return [m for m in out if m.split(".")[0] in ROOTS]


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for root in ROOTS for p in (REPO / root).rglob("*.py")}
    edges: dict[str, set[str]] = defaultdict(set)
    for mod, path in modules.items():
        for target in imports(path):
            while target not in modules and "." in target:  # "pkg.mod.Name" -> "pkg.mod"
                target = target.rsplit(".", 1)[0]
            if target in modules and target != mod:
                edges[mod].add(target)
    return edges


def violations(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for mod, targets in sorted(edges.items()):
        src = layer(mod)
        for t in sorted(targets):
            dst = layer(t)
            if dst == src or t.startswith(src + ".") or src == "retrieval.app" and t.startswith("retrieval"):
                continue
            allowed = ALLOWED.get(src, set())
            if not any(dst == a or dst.startswith(a + ".") for a in allowed):
                out.append(f"upward import: {mod} -> {t} ({src} may import {sorted(allowed)})")
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), excluding package __init__ re-exports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def main(argv: list[str]) -> int:
    edges = graph()
    pkg: Counter[tuple[str, str]] = Counter()
    for mod, targets in edges.items():
        for t in targets:
            a, b = layer(mod), layer(t)
            if a != b:
                pkg[(a, b)] += 1
    if "--dot" in argv:
        print("digraph imports {")
        for (a, b), n in sorted(pkg.items()):
            print(f'  "{a}" -> "{b}" [label={n}];')
        print("}")
    else:
        for (a, b), n in sorted(pkg.items()):
            print(f"{a:24} -> {b:24} {n}")
    bad = violations(edges)
    loops = cycles(edges)
    for line in bad:
        print(line, file=sys.stderr)
    for comp in loops:
        print("cycle: " + " <-> ".join(comp), file=sys.stderr)
    print(f"{sum(len(t) for t in edges.values())} module imports, {len(bad)} upward, {len(loops)} cycles",
          file=sys.stderr)
    return 1 if bad or loops else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
