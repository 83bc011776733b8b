"""Dense first-stage retriever: faiss HNSW (inner product on unit vectors) with an exact-search path.

Filters: the chunk mask goes to faiss as an ``IDSelectorBitmap`` so HNSW only returns allowed chunks. A very
selective filter starves graph search (most neighbours are filtered out), so when the allowed fraction is below
``exact_below`` -- or HNSW found fewer than k documents while more exist -- the search runs exactly over the
allowed rows instead, which is cheap precisely because they are few. A filtered query thus returns k results
whenever k exist.
"""

from __future__ import annotations

import math

import faiss
import numpy as np

from index_builder.snapshot.dense_index import search_params
from index_builder.snapshot.row_file import RowFile
from index_builder.types import Hits
from retrieval.search.aggregate import one_chunk_per_doc, top_docs_from_chunk_hits, top_docs_from_chunk_scores
from retrieval.search.settings import DenseConfig  # noqa: F401  (its section lives with the search settings)


class DenseRetriever:
    """Dense search over the snapshot's index (``index``: HNSW over float vectors, HNSW over 8-bit codes, or IVF-PQ:
    index_builder/snapshot/dense_index.py), documents scored by their best chunk. The compressed kinds re-score their
    candidates exactly from ``vectors`` (float32, memory-mapped: only those rows are read)."""

    name = "dense"

    def __init__(self, index: faiss.Index | None, vectors: np.ndarray, chunk_doc: np.ndarray, starts: np.ndarray,
                 config: DenseConfig | None = None) -> None:
        self.index = index
        self.vectors = vectors
        self.chunk_doc = chunk_doc
        self.starts = starts
        self.config = config or DenseConfig()
        self.n_chunks = len(chunk_doc)
        self.one_per_doc = one_chunk_per_doc(starts, self.n_chunks)
        self.rescores = index is not None and not isinstance(index, faiss.IndexHNSWFlat)
        # 8-bit codes rank as the float vectors do (bench/scale_recall.py: the same recall@100 at 100k and 1M
        # rescoring 1x or 4x), so HNSW-SQ8 widens its beam by ``rescore`` but rescores only the best ``want``;
        # PQ codes rank coarsely, so IVF-PQ rescores all ``rescore`` x ``want`` candidates.
        self.rescores_all = isinstance(index, faiss.IndexIVF)
        # the rows rescored are read with pread (index_builder/snapshot/row_file.py), not through the map: a mapped row
        # maps its whole page-cache folio, and after a few thousand queries the whole file (1.5 GB at 1M, 1.5 KB
        # a passage of RSS); read, they cost ~0.2 ms more a query at 1M and no RSS
        self.rows: np.ndarray | RowFile = vectors
        if self.rescores and isinstance(vectors, np.memmap) and vectors.filename:
            self.rows = RowFile(vectors.filename)

    def search(self, query_vec: np.ndarray, k: int, doc_mask: np.ndarray | None = None,
               chunk_mask: np.ndarray | None = None, *, exact: bool = False) -> Hits:
        """Top ``k`` documents for one unit query vector (float32 [dim])."""
        q = np.ascontiguousarray(query_vec, dtype=np.float32).reshape(1, -1)
        if exact or self.index is None:
            return self.exact(q[0], k, doc_mask)
        n_allowed = self.n_chunks if chunk_mask is None else int(chunk_mask.sum())
        if n_allowed == 0:
            return Hits.empty()
        if chunk_mask is not None and n_allowed < self.config.exact_below * self.n_chunks:
            return self.exact_subset(q[0], k, chunk_mask)
        want = min(n_allowed, math.ceil(k * self.config.oversample))
        sel = None
        bitmap = None  # must outlive the searches: faiss reads it through a raw pointer
        if chunk_mask is not None:
            bitmap = np.packbits(chunk_mask, bitorder="little")
            sel = faiss.IDSelectorBitmap(self.n_chunks, faiss.swig_ptr(bitmap))
        n_docs_allowed = len(self.starts) if doc_mask is None else int(doc_mask.sum())
        while True:
            fetch = min(n_allowed, math.ceil(want * self.config.rescore)) if self.rescores else want
            params = search_params(self.index, max(self.config.ef_search, fetch), self.config.nprobe, sel)
            scores, ids = self.index.search(q, fetch if self.rescores_all else want, params=params)
            ids, scores = ids[0], scores[0]
            if self.rescores:
                ids, scores = self._rescore(q[0], ids)
            hits = top_docs_from_chunk_hits(ids, scores, self.chunk_doc, k)
            if len(hits) >= min(k, n_docs_allowed) or want >= n_allowed:
                break
            want = min(n_allowed, want * 2)  # many chunks of the same documents: look further
        if len(hits) < min(k, n_docs_allowed) and chunk_mask is not None:
            return self.exact_subset(q[0], k, chunk_mask)  # graph search starved by the filter
        return hits

    def _rescore(self, q: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The candidates' exact inner products, best first (only their rows read: ``self.rows``)."""
        ids = np.sort(ids[ids >= 0])
        scores = np.asarray(self.rows[ids]) @ q
        order = np.argsort(-scores, kind="stable")
        return ids[order], scores[order]

    def exact(self, q: np.ndarray, k: int, doc_mask: np.ndarray | None = None) -> Hits:
        """Exact inner-product search over every chunk (the ground truth HNSW is measured against)."""
        scores = np.asarray(self.vectors) @ q
        return top_docs_from_chunk_scores(scores, self.starts, k, valid=doc_mask, one_per_doc=self.one_per_doc)

    def exact_subset(self, q: np.ndarray, k: int, chunk_mask: np.ndarray) -> Hits:
        rows = np.flatnonzero(chunk_mask)
        scores = np.asarray(self.vectors[rows]) @ q
        order = np.argsort(-scores, kind="stable")
        return top_docs_from_chunk_hits(rows[order], scores[order], self.chunk_doc, k)
