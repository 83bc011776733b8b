"""The suite collects every product module for its doctests (``--doctest-modules``): a framework adapter
(``retrieval/client/integrations/``) cannot be imported without its framework, an optional extra, so it is left out
of collection where that framework is not installed (its tests skip with the reason:
``tests/retrieval/client/test_adapters.py``). Registered by ``tests/conftest.py``; kept out of the product package."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # read when haystack is imported: no posthog calls

ADAPTERS = Path(__file__).resolve().parent.parent / "retrieval" / "client" / "integrations"
FRAMEWORKS = {"langchain": "langchain_core", "llamaindex": "llama_index", "haystack": "haystack"}  # module: imports


class SkipAbsentFrameworks:
    """A pytest plugin: ``pytest_ignore_collect`` for the adapters whose framework is missing."""

    def __init__(self) -> None:
        self.absent = {ADAPTERS / f"{module}.py" for module, framework in FRAMEWORKS.items()
                       if importlib.util.find_spec(framework) is None}

    def pytest_ignore_collect(self, collection_path: Path) -> bool | None:
        return True if collection_path in self.absent else None
