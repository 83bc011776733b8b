"""One query on its way through the stages: what every stage reads (the resolved request, the index generation that
serves it, the runner, the filter's masks) and what they share (the query's embedding and token vectors, computed
once) and report (each stage's list, timings and skips, in the :class:`~retrieval.search.results.SearchResult`
being built)."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from opentelemetry import context as otel_context
from opentelemetry.trace import Tracer

from index_builder.types import Hits
from retrieval.observability.tracing import NO_TRACER, child_span
from retrieval.search.request import SearchRequest
from retrieval.search.results import SearchResult
from retrieval.search.runner import Runner
from retrieval.search.view import IndexView


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


@dataclass
class Query:
    """``request``: resolved (every default filled). ``result``: the report the stages write into (its ``hits`` are
    set by whoever runs the stages). ``trace``: the parent of the stage spans."""

    request: SearchRequest
    index: IndexView
    runner: Runner
    result: SearchResult = field(init=False)
    tracer: Tracer = NO_TRACER
    trace: otel_context.Context | None = None
    doc_mask: np.ndarray | None = field(init=False, default=None)
    chunk_mask: np.ndarray | None = field(init=False, default=None)
    query_vec: np.ndarray | None = None  # the embedding, once computed (or given with the request)
    query_tokens: np.ndarray | None = None  # the query's token vectors, once computed
    pending: dict[str, Awaitable[Any]] = field(default_factory=dict)  # work started early, by name

    def __post_init__(self) -> None:
        assert self.request.resolved, "stages take a resolved request (Pipeline.resolve)"
        self.result = SearchResult(hits=Hits.empty(), generation=self.index.generation, index=self.index)
        masks = self.index.filters.masks(self.request.filter)
        if masks is not None:
            self.doc_mask, self.chunk_mask = masks
        if self.request.query_vec is not None:
            self.query_vec = self.request.query_vec

    def span(self, name: str, attributes: dict[str, Any] | None = None):
        return child_span(self.tracer, name, self.trace, attributes)

    def skip(self, stage: str, reason: str, *, degraded: bool = False) -> None:
        """Say why ``stage`` does not run (``degraded``: the answer is worse for it, not a policy)."""
        self.result.skipped[stage] = reason
        self.result.degraded = self.result.degraded or degraded

    async def encode(self) -> None:
        """Embed the query (and get the embedder's token vectors with it) through the runner, once."""
        with self.span("hybridrag.embed") as span:
            t = time.perf_counter()
            self.query_vec, self.query_tokens, wait = await self.runner.embed_query(self.request.query)
            self.result.timings_ms["embed_queue"] = wait
            self.result.timings_ms["embed"] = ms_since(t)
            span.set_attribute("queue_wait_ms", wait)

    def discard_pending(self) -> None:
        for pending in self.pending.values():
            self.runner.discard(pending)
        self.pending.clear()
