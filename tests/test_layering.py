"""The layering written in docs/architecture.md holds in the code: no package imports upward, no import cycle
between modules (scripts/import_graph.py, the same check a developer runs by hand)."""

from __future__ import annotations

import importlib.util

from tests.helpers import REPO


def _graph_module():
    spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts" / "import_graph.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_upward_imports_and_no_cycles():
    g = _graph_module()
    edges = g.graph()
    assert sum(len(t) for t in edges.values()) > 200  # the graph was read (not an empty walk)
    assert g.violations(edges) == []
    assert g.cycles(edges) == []


def test_the_check_catches_an_upward_import_and_a_cycle():
    g = _graph_module()
    edges = {"index_builder.build": {"retrieval.search.pipeline"}, "retrieval.search.pipeline": {"index_builder.build"}}
    assert any("upward import: index_builder.build" in v for v in g.violations(edges))
    assert g.cycles(edges) == [["index_builder.build", "retrieval.search.pipeline"]]
