"""BM25 first-stage retriever (bm25s sparse scoring over chunks; documents score as their best chunk)."""

from __future__ import annotations

import bm25s
import numpy as np

from index_builder.analysis import Analyzer
from index_builder.types import Hits
from retrieval.aggregate import top_docs_from_chunk_scores


class BM25Retriever:
    """Lucene-variant BM25 over the snapshot's chunks. Thread-safe (read-only arrays)."""

    name = "bm25"

    def __init__(self, bm25: bm25s.BM25, analyzer: Analyzer, starts: np.ndarray) -> None:
        self.bm25 = bm25
        self.analyzer = analyzer
        self.starts = starts

    def chunk_scores(self, query: str) -> np.ndarray:
        """BM25 score of every chunk, float32 [n_chunks] (zeros when no query term is in the vocabulary)."""
        ids = self.bm25.get_tokens_ids(self.analyzer(query))
        return self.bm25.get_scores_from_ids(ids)

    def search(self, query: str, k: int, doc_mask: np.ndarray | None = None) -> Hits:
        """Top ``k`` documents with a positive score, restricted to ``doc_mask`` (bool [n_docs]) when given."""
        return top_docs_from_chunk_scores(self.chunk_scores(query), self.starts, k, valid=doc_mask, min_score=0.0)
