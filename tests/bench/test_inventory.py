"""The bench room's rules, checked on the source (issue #40): every script is registered for ``hybridrag bench``,
has a row in bench/README.md and a smoke test here; measurements go through the harness (no script computes its own
percentiles or spawns its own server); pipelines are opened the one way the service opens them; no product test
imports bench."""

import ast
import re

import pytest

from bench import SCRIPTS
from tests.helpers import REPO

BENCH = REPO / "bench"
SCRIPT_FILES = sorted(p for p in [*BENCH.glob("*.py"), *(BENCH / "studies").glob("*.py")] if p.name != "__init__.py")
README = (BENCH / "README.md").read_text()
SMOKE = "\n".join(p.read_text() for p in (REPO / "tests" / "bench").glob("test_*.py") if p.name != "test_inventory.py")


def _module(path):
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def test_every_script_is_registered_with_a_readme_row_and_a_smoke_test():
    modules = {_module(p) for p in SCRIPT_FILES if "def main(" in p.read_text()}
    assert modules == {m for m, _ in SCRIPTS.values()}
    for name, (module, _) in SCRIPTS.items():
        assert f"`python -m {module}" in README or f"`hybridrag bench {name}" in README, f"no README row: {module}"
        assert re.search(rf"from {re.escape(module)} import", SMOKE), f"no smoke test imports {module}"


@pytest.mark.parametrize("path", SCRIPT_FILES, ids=lambda p: _module(p))
def test_scripts_measure_through_the_harness(path):
    text = path.read_text()
    assert "np.percentile" not in text and "np.median" not in text, \
        "percentiles come from bench.harness (percentiles, median)"
    assert "subprocess.Popen" not in text and "BackgroundServer" not in text, \
        "servers are spawned by bench.harness.server"
    assert not re.search(r"\bPipeline(\(|\.open\b|\.over\b)", text), \
        "a pipeline is opened by retrieval.app.open_pipeline (bench.harness.pipelines.opened)"


def test_no_product_test_imports_bench():
    offenders = []
    for path in (REPO / "tests").rglob("*.py"):
        if (REPO / "tests" / "bench") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "bench" or n.startswith("bench.") for n in names):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []
