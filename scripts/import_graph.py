"""The import graph of the project's packages, checked against the layering rules (docs/architecture.md).

``python scripts/import_graph.py`` prints the package-level graph (edges with how many imports make them) and
exits 1 on an upward import, a cycle between modules, a door importing another door, or a configuration import
that is not a settings module; ``--dot`` prints Graphviz instead. Imports under ``if TYPE_CHECKING:`` are
type-only and skipped; imports inside functions count (they are real dependencies). tests/test_layering.py runs
the same check in CI.

Two rules inside the packages:

- **Doors are siblings.** A door is a way into the service (:data:`DOORS`: gRPC, HTTP, the nginx front); a door
  module never imports another door's modules. Doors share the core (``retrieval/serving/core.py``) and the other
  serving modules; ``retrieval/serving/server.py`` starts them side by side.
- **Configuration loads settings only.** ``retrieval/config.py`` imports only *settings modules*: a module named
  ``settings`` (``<package>/settings.py``) holds a room's configuration dataclasses and their checks and imports no
  model runtime, index library or server, so that loading a configuration costs milliseconds.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("hybridrag", "retrieval", "index_builder", "rerank", "training", "bench")
# index_builder's rooms (docs/architecture.md): the shared words at the bottom, documents and models over them,
# the snapshot over those, the build on top. Only the live index (retrieval/live: it rebuilds), the composition roots
# and the tools above them may import the build.
SHARED = {"index_builder.types", "index_builder.errors", "index_builder.settings"}
BELOW_BUILD = SHARED | {"index_builder.documents", "index_builder.models", "index_builder.snapshot"}
INDEX = BELOW_BUILD | {"index_builder.build"}
# Which of our packages each layer may import (besides itself): the most specific row applies (layer()).
ALLOWED: dict[str, set[str]] = {
    "index_builder": set(),  # its __init__: imports nothing of ours
    **{word: SHARED for word in SHARED},
    "index_builder.documents": SHARED,
    "index_builder.models": SHARED,
    "index_builder.snapshot": SHARED | {"index_builder.documents", "index_builder.models"},
    "index_builder.build": BELOW_BUILD,
    "rerank": BELOW_BUILD,  # above index_builder: scores what the snapshot's token codecs store
    "retrieval.errors": SHARED,
    "retrieval.observability": SHARED,
    "retrieval.search": BELOW_BUILD | {"rerank", "retrieval.errors", "retrieval.observability"},
    "retrieval.live": INDEX | {"rerank", "retrieval.errors", "retrieval.search"},
    "retrieval.generation": BELOW_BUILD | {"retrieval.errors", "retrieval.search"},
    "retrieval.engines": BELOW_BUILD | {"rerank", "retrieval.errors", "retrieval.search", "retrieval.live"},
    # the development engine host is a small HTTP server: it takes the HTTP door's guard and slow-client timeouts
    "retrieval.engines.qdrant.host": {"retrieval.engines", "retrieval.serving.http.guard",
                                      "retrieval.serving.http.timeouts"},
    # a migration on Ray joins (or starts) a cluster the way a Ray build does
    "retrieval.engines.qdrant.ray_upload": BELOW_BUILD | {"retrieval.engines", "index_builder.build.ray_build"},
    "retrieval.serving": BELOW_BUILD | {"rerank", "retrieval.errors", "retrieval.search", "retrieval.live",
                                        "retrieval.generation", "retrieval.observability", "retrieval.api"},
    "retrieval.client": {"retrieval.api"},  # the clients and framework adapters: the wire contract, never the server
    "retrieval.evaluate": INDEX | {"rerank", "retrieval.errors", "retrieval.search"},
    "retrieval.config": SHARED | {"retrieval.search", "retrieval.live", "retrieval.generation", "retrieval.engines",
                                  "retrieval.serving", "retrieval.observability", "retrieval.errors"},
    "retrieval.app": INDEX | {"retrieval"},
    # the supervisor of several server processes: each worker runs app.serve
    "retrieval.processes": SHARED | {"retrieval.app", "retrieval.config", "retrieval.observability"},
    "retrieval.api": set(),
    "retrieval": INDEX | {"rerank", "retrieval"},  # retrieval/__init__.py re-exports lazily; the folder flow builds
    "training": INDEX | {"rerank", "retrieval"},
    "bench": INDEX | {"rerank", "retrieval", "training"},
    "hybridrag": INDEX | {"rerank", "retrieval", "training", "bench"},
}


# The doors, each a module or a package (a package's modules may import each other: they are one door).
DOORS: dict[str, str] = {
    "grpc": "retrieval.serving.grpc_service",
    "http": "retrieval.serving.http",
    "front": "retrieval.serving.front",
}
CONFIG = "retrieval.config"  # assembles the settings modules into AppConfig


def door(module: str) -> str | None:
    """The door ``module`` belongs to (the door's module, or a module of its package), or None."""
    return next((name for name, root in DOORS.items() if module == root or module.startswith(root + ".")), None)


def is_settings(module: str) -> bool:
    """A settings module: ``<package>.settings`` (configuration dataclasses and their checks only)."""
    return module.rsplit(".", 1)[-1] == "settings"


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
            if not any(x == a or x.startswith(a + ".") for a in allowed for x in (dst, t)):  # a layer, or one module
                out.append(f"upward import: {mod} -> {t} ({src} may import {sorted(allowed)})")
    return out


def door_violations(edges: dict[str, set[str]]) -> list[str]:
    """Imports from one door's modules into another's (doors are siblings over the core)."""
    out = []
    for mod, targets in sorted(edges.items()):
        a = door(mod)
        for t in sorted(targets):
            b = door(t)
            if a is not None and b is not None and a != b:
                out.append(f"door imports door: {mod} -> {t} (the {a} door may not import the {b} door; both "
                           "import the core)")
    return out


def config_violations(edges: dict[str, set[str]]) -> list[str]:
    """Imports of ``retrieval/config.py`` that are not settings modules."""
    return [f"config imports a non-settings module: {CONFIG} -> {t} (move the section it needs into a "
            f"settings module)" for t in sorted(edges.get(CONFIG, ())) if not is_settings(t)]


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
    bad = violations(edges) + door_violations(edges) + config_violations(edges)
    loops = cycles(edges)
    for line in bad:
        print(line, file=sys.stderr)
    for comp in loops:
        print("cycle: " + " <-> ".join(comp), file=sys.stderr)
    print(f"{sum(len(t) for t in edges.values())} module imports, {len(violations(edges))} upward, "
          f"{len(door_violations(edges))} between doors, {len(config_violations(edges))} from config to "
          f"non-settings modules, {len(loops)} cycles", file=sys.stderr)
    return 1 if bad or loops else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
