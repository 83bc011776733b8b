"""hybridrag's service: search, the live index, generation, the front doors. The names most callers need are
importable from here (loaded on first use, so ``import retrieval.errors`` stays cheap)::

    from retrieval import Filter, RetrieverClient, SearchRequest, load_config, open_pipeline
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "load_config": "retrieval.config", "AppConfig": "retrieval.config", "open_pipeline": "retrieval.app",
    "Pipeline": "retrieval.search.pipeline", "SearchResult": "retrieval.search.results",
    "SearchRequest": "retrieval.search.request", "Filter": "retrieval.search.filters",
    "SearchIndex": "retrieval.search.index", "IndexView": "retrieval.search.view",
    "LiveIndex": "retrieval.live.live_index", "DocumentStore": "retrieval.live.store",
    "RetrieverClient": "retrieval.client", "AsyncRetrieverClient": "retrieval.client",
    "BackgroundServer": "retrieval.serving.server",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'retrieval' has no attribute {name!r}")
