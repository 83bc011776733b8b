"""The retrieval pipeline over one index generation: validate, run the stages, report timings.

First stage: BM25 and dense (embed + HNSW) run in parallel on a bounded thread pool, each returning its top-N
documents (best chunk per document), then RRF fuses them. If the dense side is unavailable (no HNSW index,
embedder failure) BM25 serves alone and the result is marked degraded with the reason.
Cascade: late interaction reorders the fused top ``li_top_k`` by MaxSim over each candidate passage's stored token
vectors, then the cross-encoder reorders the top ``ce_top_k``; everything below a stage's head keeps its order.
Scores are comparable only within the stage that produced them (``SearchResult.stages`` keeps each stage's list).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from index_builder.errors import InvalidRequest
from index_builder.models import CrossEncoder, Embedder
from index_builder.types import Hits
from rerank.cross_encoder import CrossEncoderReranker
from rerank.late_interaction import Reordering
from retrieval.config import AppConfig
from retrieval.filters import Filter
from retrieval.fusion import rrf
from retrieval.index import SearchIndex

log = logging.getLogger(__name__)

FIRST_STAGES = ("bm25", "dense")
STAGES = ("bm25", "dense", "late_interaction", "cross_encoder")
NO_FILTER = Filter()


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


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


class Pipeline:
    def __init__(self, index: SearchIndex, embedder: Embedder, config: AppConfig,
                 executor: Executor | None = None, cross_encoder: CrossEncoder | None = None) -> None:
        self.index = index
        self.embedder = embedder
        self.config = config
        self.cross_encoder = CrossEncoderReranker(cross_encoder) if cross_encoder is not None else None
        self._own_executor = executor is None
        self.executor = executor or ThreadPoolExecutor(config.first_stage.workers, thread_name_prefix="hybridrag")

    def close(self) -> None:
        if self._own_executor:
            self.executor.shutdown(wait=True)

    def validate(self, query: str, k: int, candidates: int, stages: Sequence[str]) -> None:
        fs = self.config.first_stage
        if not isinstance(query, str) or not query.strip():
            raise InvalidRequest("query is empty")
        if len(query) > fs.max_query_chars:
            raise InvalidRequest(f"query is {len(query)} characters; at most {fs.max_query_chars} are allowed")
        if not 1 <= k <= fs.max_k:
            raise InvalidRequest(f"top_k must be in [1, {fs.max_k}], got {k}")
        if not 1 <= candidates <= fs.max_candidates:
            raise InvalidRequest(f"candidates must be in [1, {fs.max_candidates}], got {candidates}")
        unknown = [s for s in stages if s not in STAGES]
        if unknown or not any(s in FIRST_STAGES for s in stages):
            raise InvalidRequest(f"unknown stages or no first stage in {list(stages)}; allowed: {list(STAGES)} "
                                 f"with at least one of {list(FIRST_STAGES)}")

    def default_stages(self) -> tuple[str, ...]:
        r = self.config.rerank
        return FIRST_STAGES + (("late_interaction",) if r.late_interaction else ()) + (
            ("cross_encoder",) if r.cross_encoder else ())

    def embed_query(self, query: str) -> np.ndarray:
        return self.embedder.embed([query])[0]

    def search(self, query: str, k: int = 10, *, filter: Filter = NO_FILTER, candidates: int | None = None,
               stages: Sequence[str] | None = None, exact_dense: bool = False,
               query_vec: np.ndarray | None = None) -> SearchResult:
        """Run the stages for one query; returns the top ``k`` documents (fused unless one first stage is asked)."""
        stages = self.default_stages() if stages is None else tuple(stages)
        candidates = candidates or max(self.config.first_stage.candidates, k)
        self.validate(query, k, candidates, stages)
        t_total = time.perf_counter()
        index = self.index  # one generation for the whole request
        result = SearchResult(hits=Hits.empty(), generation=index.generation)
        query_tokens: np.ndarray | None = None
        masks = index.filters.masks(filter)
        doc_mask, chunk_mask = masks if masks is not None else (None, None)

        def run_bm25() -> tuple[Hits, float]:
            t = time.perf_counter()
            return index.bm25.search(query, candidates, doc_mask), _ms(t)

        bm25_future = None
        if "bm25" in stages:
            if self.config.first_stage.parallel and "dense" in stages:
                bm25_future = self.executor.submit(run_bm25)
            else:
                result.stages["bm25"], result.timings_ms["bm25"] = run_bm25()

        if "dense" in stages:
            if index.dense is None:
                result.skipped["dense"] = f"dense index unavailable: {index.dense_error}"
                result.degraded = True
            else:
                try:
                    t = time.perf_counter()
                    if query_vec is not None:
                        vec = query_vec
                    elif "late_interaction" in stages and index.late is not None:
                        vec, query_tokens = self.embedder.embed_with_tokens(query)  # one encoder pass for both
                    else:
                        vec = self.embed_query(query)
                    result.timings_ms["embed"] = _ms(t)
                    t = time.perf_counter()
                    result.stages["dense"] = index.dense.search(vec, candidates, doc_mask, chunk_mask,
                                                                exact=exact_dense)
                    result.timings_ms["dense"] = _ms(t)
                except Exception as e:  # an embedder/faiss failure degrades to BM25 instead of failing the query
                    log.exception("dense search failed; BM25 serves alone")
                    result.skipped["dense"] = f"dense search failed: {e}"
                    result.degraded = True
        if bm25_future is not None:
            result.stages["bm25"], result.timings_ms["bm25"] = bm25_future.result()

        t = time.perf_counter()
        ran = [s for s in FIRST_STAGES if s in result.stages]
        if len(ran) == 1:
            current = result.stages[ran[0]]
        else:
            current = self.fuse(result.stages["bm25"], result.stages["dense"])
            result.timings_ms["fusion"] = _ms(t)
            result.stages["fused"] = current

        rr = self.config.rerank
        if "late_interaction" in stages:
            if index.late is None:
                result.skipped["late_interaction"] = "the snapshot has no token vectors"
            else:
                t = time.perf_counter()
                if query_tokens is None:
                    query_tokens = self.embedder.encode_query_tokens(query)
                current = reorder(current, index.late.rerank(query_tokens, current.chunk, rr.li_top_k))
                result.stages["late_interaction"] = current
                result.timings_ms["late_interaction"] = _ms(t)
        if "cross_encoder" in stages:
            if self.cross_encoder is None:
                result.skipped["cross_encoder"] = "no cross-encoder model configured"
            else:
                t = time.perf_counter()
                passages = [index.passage_with_title(int(c)) for c in current.chunk[: rr.ce_top_k]]
                current = reorder(current, self.cross_encoder.rerank(query, passages, len(current)))
                result.stages["cross_encoder"] = current
                result.timings_ms["cross_encoder"] = _ms(t)
        result.hits = current.top(k)
        result.timings_ms["total"] = _ms(t_total)
        return result

    def fuse(self, bm25: Hits, dense: Hits) -> Hits:
        """RRF of the two document rankings; each fused document keeps the chunk of the list that ranked it higher."""
        f = self.config.fusion
        ids, scores = rrf([bm25.doc, dense.doc], k=f.k, weights=[f.bm25_weight, f.dense_weight])
        chunk_of: dict[int, int] = {}
        rank_of: dict[int, float] = {}
        for hits, w in ((bm25, f.bm25_weight), (dense, f.dense_weight)):
            for rank, (d, c) in enumerate(zip(hits.doc.tolist(), hits.chunk.tolist(), strict=False), start=1):
                contribution = w / (f.k + rank)
                if contribution > rank_of.get(d, -1.0):
                    rank_of[d], chunk_of[d] = contribution, c
        chunks = np.array([chunk_of[d] for d in ids.tolist()], dtype=np.int64)
        return Hits(ids, scores.astype(np.float32), chunks)
