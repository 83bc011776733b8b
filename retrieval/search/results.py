"""What a search answers: :class:`SearchResult` (the final ranking, each stage's list, timings, skips), the
:class:`ResultView` a cached result keeps instead of the whole index view, and :func:`reorder` (a reranker's
permutation applied to hits)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from index_builder.types import Hits
from rerank.evidence import keep_certain
from rerank.highlights import Highlight
from rerank.late_interaction import Reordering
from retrieval.search.cache_check import InvalidEntry, check_result
from retrieval.search.filters import Filter
from retrieval.search.view import IndexView


def keep_evidence(hits: Hits, stages: dict[str, Hits], lead: float, rank: int) -> Hits:
    """``hits`` (a reranker's list) with BM25's best document moved back within the first ``rank`` when its lead
    is certain (:func:`rerank.evidence.keep_certain`; ``[rerank] keep_bm25_lead``); it takes the score of the
    document it displaced, so the scores stay in order. As given when BM25 did not run or the rule does not apply."""
    bm25 = stages.get("bm25")
    if bm25 is None or lead <= 0:
        return hits
    perm = keep_certain(hits.doc, bm25.doc, bm25.scores, lead, rank)
    if perm is None:
        return hits
    scores = hits.scores[perm].astype(np.float32)
    scores[rank - 1] = scores[rank]
    return Hits(hits.doc[perm], scores, hits.chunk[perm])


def reorder(hits: Hits, r: Reordering) -> Hits:
    """Apply a reranker's permutation; the head takes the reranker's scores, the tail keeps its own."""
    scores = hits.scores[r.order].astype(np.float32)
    head = ~np.isnan(r.scores)
    scores[head] = r.scores[head]
    return Hits(hits.doc[r.order], scores, hits.chunk[r.order])


@dataclass
class SearchResult:
    """Final ranking plus what each stage returned, how long it took (ms) and what was skipped and why."""

    hits: Hits
    stages: dict[str, Hits] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    degraded: bool = False
    generation: int = 0
    index: Any = None  # the index generation (or live view) that served it: resolve doc/chunk ids against this one
    query_vec: np.ndarray | None = None  # the query embedding, when the dense side ran
    cache_hit: bool = False
    cache_similarity: float = 0.0  # cosine to the cached query that answered (cache hits only)
    highlights: dict[int, list[Highlight]] = field(default_factory=dict)  # chunk -> its best sentences (requested)

    def doc_ids(self) -> list[str]:
        return [self.index.documents[d].id for d in self.hits.doc.tolist()]

    def detached(self) -> SearchResult:
        """This result with ``index`` replaced by a :class:`ResultView` of just its documents and passages: what
        the semantic cache keeps. A cached result holding the live view itself pinned that view's whole write
        buffer for the entry's lifetime (tens of MB per entry under a write load)."""
        return dataclasses.replace(self, index=ResultView(self.index, self.hits))

    def approx_bytes(self) -> int:
        """Roughly what this result holds in memory (arrays, vector, and passages when detached), for byte-bounded
        caches."""
        n = self.hits.doc.nbytes * 3 + sum(h.doc.nbytes * 3 for h in self.stages.values())
        n += 0 if self.query_vec is None else self.query_vec.nbytes
        if isinstance(self.index, ResultView):
            n += self.index.nbytes
        return n + 512


class ResultView:
    """The part of an index generation (or live view) that one result needs: the documents and passages of its
    hits, keyed by the same document and chunk numbers, so code reading ``result.index.documents[d]`` and
    ``result.index.passage(c)`` works unchanged."""

    def __init__(self, index: Any, hits: Hits) -> None:
        docs, chunks = hits.doc.tolist(), hits.chunk.tolist()
        self.documents = {d: index.documents[d] for d in docs}
        self._passages = {c: index.passage(c) for c in chunks}
        self.generation = index.generation
        self.nbytes = sum(len(p) for p in self._passages.values()) + sum(
            len(d.title) + 64 * (1 + len(d.metadata)) for d in self.documents.values())

    @property
    def passages(self) -> dict[int, str]:
        return self._passages

    def passage(self, chunk: int) -> str:
        return self._passages[chunk]


def check_cached_result(value: Any, index: IndexView, filter: Filter, k: int) -> None:
    """What a cache read from outside the process must hold to answer a search of ``k`` under ``filter`` on
    ``index`` (raises :class:`~retrieval.search.cache_check.InvalidEntry`; see
    :func:`~retrieval.search.cache_check.check_result`)."""
    if not isinstance(value, SearchResult):
        raise InvalidEntry(f"a {type(value).__name__}, not a search result")
    check_result(value, index, filter, k)
