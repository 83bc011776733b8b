"""The first stage: BM25 and dense search (embed + HNSW), each returning its top ``candidates`` documents (best chunk
per document), fused with weighted RRF; either alone when the request names one. If the dense side is unavailable
(no HNSW index) or fails (the embedder, faiss), BM25 serves alone and the result says why (degraded).

With a runner that overlaps work, BM25 starts early (:meth:`FirstStage.start`): in the batched path before the
query is embedded, beside it; in a solo search beside the dense search (``first_stage.parallel``)."""

from __future__ import annotations

import logging
import time

import numpy as np

from index_builder.types import Hits
from retrieval.search.fusion import FusionConfig, rrf
from retrieval.search.request import FIRST_STAGES
from retrieval.search.settings import FirstStageConfig
from retrieval.search.stages.query import Query, ms_since

log = logging.getLogger(__name__)


def fuse(bm25: Hits, dense: Hits, config: FusionConfig) -> Hits:
    """RRF of two document rankings; each fused document keeps the chunk of the list that ranked it higher.

    >>> b = Hits(np.array([1, 2]), np.array([9.0, 8.0], dtype=np.float32), np.array([10, 20]))
    >>> d = Hits(np.array([2, 3]), np.array([0.9, 0.8], dtype=np.float32), np.array([21, 30]))
    >>> f = fuse(b, d, FusionConfig(k=10))
    >>> f.doc.tolist(), f.chunk.tolist()
    ([2, 1, 3], [21, 10, 30])
    """
    ids, scores = rrf([bm25.doc, dense.doc], k=config.k, weights=[config.bm25_weight, config.dense_weight])
    chunk_of: dict[int, int] = {}
    rank_of: dict[int, float] = {}
    for hits, w in ((bm25, config.bm25_weight), (dense, config.dense_weight)):
        for rank, (d, c) in enumerate(zip(hits.doc.tolist(), hits.chunk.tolist(), strict=False), start=1):
            contribution = w / (config.k + rank)
            if contribution > rank_of.get(d, -1.0):
                rank_of[d], chunk_of[d] = contribution, c
    chunks = np.array([chunk_of[d] for d in ids.tolist()], dtype=np.int64)
    return Hits(ids, scores.astype(np.float32), chunks)


class FirstStage:
    def __init__(self, config: FirstStageConfig, fusion: FusionConfig) -> None:
        self.config, self.fusion = config, fusion

    def _bm25(self, q: Query) -> tuple[Hits, float]:
        candidates = q.request.candidates
        assert candidates is not None
        with q.span("hybridrag.bm25", {"candidates": candidates}):
            t = time.perf_counter()
            return q.index.bm25.search(q.request.query, candidates, q.doc_mask), ms_since(t)

    def start(self, q: Query) -> None:
        """Begin BM25 beside what follows (the query embedding), when both sides run and the runner overlaps."""
        stages = q.request.stages or ()
        if "bm25" in stages and "dense" in stages and self.config.parallel and "bm25" not in q.pending:
            q.pending["bm25"] = q.runner.start(self._bm25, q)

    async def run(self, q: Query, *, need_tokens: bool = False) -> Hits:
        """The fused list (or the one first stage asked for); each list in ``q.result.stages``. ``need_tokens``:
        late interaction will read the embedder's token vectors, so a given query vector is not enough."""
        stages, result = q.request.stages or (), q.result
        if "bm25" in stages and "bm25" not in q.pending:
            result.stages["bm25"], result.timings_ms["bm25"] = await q.runner.call(self._bm25, q)
        if "dense" in stages:
            await self._dense(q, need_tokens)
        if "bm25" in q.pending:
            result.stages["bm25"], result.timings_ms["bm25"] = await q.pending.pop("bm25")
        ran = [s for s in FIRST_STAGES if s in result.stages]
        if len(ran) == 1:
            return result.stages[ran[0]]
        t = time.perf_counter()
        with q.span("hybridrag.fusion"):
            fused = fuse(result.stages["bm25"], result.stages["dense"], self.fusion)
        result.timings_ms["fusion"] = ms_since(t)
        result.stages["fused"] = fused
        return fused

    async def _dense(self, q: Query, need_tokens: bool) -> None:
        index, result, candidates = q.index, q.result, q.request.candidates
        assert candidates is not None
        if index.dense is None:
            q.skip("dense", f"dense index unavailable: {index.dense_error}", degraded=True)
            return
        dense = index.dense
        try:
            if q.query_vec is None or (need_tokens and q.query_tokens is None):
                await q.encode()
            vec = q.query_vec
            assert vec is not None
            result.query_vec = vec
            with q.span("hybridrag.dense", {"candidates": candidates, "exact": q.request.exact_dense}):
                t = time.perf_counter()
                result.stages["dense"] = await q.runner.call(
                    lambda: dense.search(vec, candidates, q.doc_mask, q.chunk_mask, exact=q.request.exact_dense),
                    beside=q.pending.get("bm25"))
                result.timings_ms["dense"] = ms_since(t)
        except Exception as e:  # an embedder/faiss failure degrades to BM25 instead of failing the query
            log.exception("dense search failed; BM25 serves alone")
            q.skip("dense", f"dense search failed: {e}", degraded=True)
