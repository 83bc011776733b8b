"""The layering written in docs/architecture.md holds in the code: no package imports upward, no import cycle
between modules, no door imports another, configuration loads settings modules only (scripts/import_graph.py,
the same check a developer runs by hand)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

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
    edges = {"index_builder.build.builder": {"retrieval.search.pipeline"},
             "retrieval.search.pipeline": {"index_builder.build.builder"}}
    assert any("upward import: index_builder.build.builder" in v for v in g.violations(edges))
    assert g.cycles(edges) == [["index_builder.build.builder", "retrieval.search.pipeline"]]


@pytest.mark.parametrize(("source", "target", "allowed"), [
    # index_builder's rooms: build -> snapshot -> {documents, models} -> the shared words
    ("index_builder.build.builder", "index_builder.snapshot.format", True),
    ("index_builder.snapshot.format", "index_builder.documents.chunking", True),
    ("index_builder.snapshot.manifest", "index_builder.models.encoders", True),
    ("index_builder.documents.folder", "index_builder.settings", True),
    ("index_builder.snapshot.format", "index_builder.build.builder", False),
    ("index_builder.models.token_encoders", "index_builder.snapshot.token_codes", False),
    ("index_builder.documents.chunking", "index_builder.models.encoders", False),
    ("index_builder.settings", "index_builder.documents.folder", False),
    ("index_builder.types", "index_builder.snapshot.format", False),
    # index_builder imports nothing of ours; rerank sits above it and takes the codecs, never the build
    ("index_builder.snapshot.token_codes", "rerank.maxsim", False),
    ("rerank.late_interaction", "index_builder.snapshot.token_codes", True),
    ("rerank.late_interaction", "index_builder.build.builder", False),
    # only the live index rebuilds: search, serving and engines never import the build
    ("retrieval.live.live_index", "index_builder.build.builder", True),
    ("retrieval.search.index", "index_builder.build.builder", False),
    ("retrieval.serving.core", "index_builder.build.workers", False),
    ("retrieval.engines.qdrant.engine", "index_builder.build.encodings", False),
    ("retrieval.search.index", "index_builder.snapshot.manifest", True),
    # the clients stand apart from the server: they know the wire contract only; the server never imports them
    ("retrieval.client.integrations.langchain", "retrieval.client.client", True),
    ("retrieval.client.client", "retrieval.api.retriever_pb2", True),
    ("retrieval.client.integrations.haystack", "retrieval.serving.core", False),
    ("retrieval.serving.server", "retrieval.client.client", False),
    # the engine host takes the HTTP door's guard and timeouts, not its app
    ("retrieval.engines.qdrant.host", "retrieval.serving.http.guard", True),
    ("retrieval.engines.qdrant.host", "retrieval.serving.http.timeouts", True),
    ("retrieval.engines.qdrant.host", "retrieval.serving.http.app", False),
])
def test_the_rooms_rules_are_enforced(source, target, allowed):
    """A planted import is reported exactly when the rules forbid it."""
    g = _graph_module()
    assert (g.violations({source: {target}}) == []) is allowed


def test_doors_are_siblings_and_config_loads_settings_modules_only():
    g = _graph_module()
    edges = g.graph()
    assert g.door_violations(edges) == []
    assert g.config_violations(edges) == []
    assert edges[g.CONFIG] and all(g.is_settings(t) for t in edges[g.CONFIG])


def test_the_check_catches_a_door_importing_a_door_and_config_importing_a_non_settings_module():
    g = _graph_module()
    edges = {"retrieval.serving.grpc_service": {"retrieval.serving.http.app", "retrieval.serving.core"},
             "retrieval.serving.http.guard": {"retrieval.serving.http.errors", "retrieval.serving.core"},  # one door
             "retrieval.serving.http.openai": {"retrieval.serving.front"},
             "retrieval.serving.http_extra": {"retrieval.serving.grpc_service"},  # beside the package, not in it
             "retrieval.serving.server": {"retrieval.serving.grpc_service", "retrieval.serving.http.app"},  # not a door
             "retrieval.config": {"retrieval.serving.settings", "index_builder.settings",
                                  "retrieval.serving.grpc_service"}}
    assert g.door_violations(edges) == [
        "door imports door: retrieval.serving.grpc_service -> retrieval.serving.http.app (the grpc door may not "
        "import the http door; both import the core)",
        "door imports door: retrieval.serving.http.openai -> retrieval.serving.front (the http door may not import "
        "the front door; both import the core)"]
    assert [v.split(" (")[0] for v in g.config_violations(edges)] == [
        "config imports a non-settings module: retrieval.config -> retrieval.serving.grpc_service"]


def test_loading_a_configuration_imports_no_server_model_runtime_or_index_library():
    """What the settings modules are for: ``import retrieval.config`` (every command's first step) loads no gRPC,
    FastAPI, uvicorn, ONNX Runtime or faiss (it did all five: ~650 ms on two cores, now tens of ms)."""
    heavy = ("grpc", "fastapi", "uvicorn", "onnxruntime", "faiss", "bm25s", "httpx", "opentelemetry")
    code = f"import sys, retrieval.config; print(sorted(set({heavy!r}) & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


PRODUCT = ("index_builder", "rerank", "retrieval", "hybridrag")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 500, 80


def oversized(root=REPO) -> list[str]:
    """Every product file over MAX_FILE_LINES lines and every function over MAX_FUNCTION_LINES (generated gRPC
    stubs aside): the rooms stay rooms a newcomer can read (issue 52)."""
    import ast

    found = []
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")):
                continue
            text = path.read_text(encoding="utf-8")
            rel = path.relative_to(root)
            if text.count("\n") > MAX_FILE_LINES:
                found.append(f"{rel}: {text.count(chr(10))} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append(f"{rel}: {node.name} is {length} lines")
    return found


def test_no_product_file_over_500_lines_and_no_function_over_80():
    assert oversized() == []


def test_the_size_check_catches_a_long_file_and_a_long_function(tmp_path):
    room = tmp_path / "retrieval"
    room.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (room / "long.py").write_text("def f():\n" + body + "\n" * (MAX_FILE_LINES - MAX_FUNCTION_LINES))
    for package in PRODUCT:
        (tmp_path / package).mkdir(exist_ok=True)
    assert oversized(tmp_path) == ["retrieval/long.py: 501 lines", "retrieval/long.py: f is 81 lines"]
