"""BM25 first-stage retriever (bm25s sparse scoring over chunks; documents score as their best chunk)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import bm25s
import numpy as np

from index_builder.documents.analysis import Analyzer
from index_builder.types import Hits
from retrieval.search.aggregate import one_chunk_per_doc, top_docs_from_chunk_scores


class BM25Retriever:
    """Lucene-variant BM25 over the snapshot's chunks. Thread-safe (read-only arrays)."""

    name = "bm25"

    def __init__(self, bm25: bm25s.BM25, analyzer: Analyzer, starts: np.ndarray) -> None:
        self.bm25 = bm25
        self.analyzer = analyzer
        self.starts = starts
        self.one_per_doc = one_chunk_per_doc(starts, int(bm25.scores["num_docs"]))

    def chunk_scores(self, query: str) -> np.ndarray:
        """BM25 score of every chunk, float32 [n_chunks] (zeros when no query term is in the vocabulary)."""
        ids = self.bm25.get_tokens_ids(self.analyzer(query))
        return self.bm25.get_scores_from_ids(ids)

    def search(self, query: str, k: int, doc_mask: np.ndarray | None = None) -> Hits:
        """Top ``k`` documents with a positive score, restricted to ``doc_mask`` (bool [n_docs]) when given."""
        return top_docs_from_chunk_scores(self.chunk_scores(query), self.starts, k, valid=doc_mask, min_score=0.0,
                                          one_per_doc=self.one_per_doc)


@dataclass(frozen=True)
class BM25Stats:
    """A snapshot's BM25 collection statistics, to score passages that are *not* in its index (the live index's
    write buffer) on the same scale as the indexed ones: scores from a second BM25 index over the few buffered
    passages would use that tiny collection's IDF and length norm, and not be comparable.

    ``df``: document frequency per vocabulary id (from the CSC score matrix: the stored entries per term column).
    """

    num_docs: int
    avgdl: float
    df: np.ndarray
    vocab: Mapping[str, int]
    k1: float
    b: float

    @classmethod
    def of(cls, bm25: bm25s.BM25, avgdl: float) -> BM25Stats:
        indptr = np.asarray(bm25.scores["indptr"])
        return cls(int(bm25.scores["num_docs"]), float(avgdl), np.diff(indptr), bm25.vocab_dict, bm25.k1, bm25.b)

    def idf(self, term: str) -> float:
        """Lucene's IDF; a term the snapshot never saw has df 0 (the rarest possible)."""
        t = self.vocab.get(term)
        df = int(self.df[t]) if t is not None and t < len(self.df) else 0
        return math.log(1 + (self.num_docs - df + 0.5) / (df + 0.5))


def score_with_stats(query_terms: Sequence[str], passages_terms: Sequence[Sequence[str]], stats: BM25Stats) -> np.ndarray:
    """Lucene BM25 of each passage (its analysed terms) for the query's analysed terms, with ``stats``:
    ``sum_t idf(t) * tf / (tf + k1 * (1 - b + b * dl / avgdl))``, repeated query terms counted each time (as bm25s
    does). Returns float32 [n_passages].

    >>> st = BM25Stats(num_docs=10, avgdl=2.0, df=np.array([1, 5]), vocab={"bee": 0, "hive": 1}, k1=0.9, b=0.4)
    >>> [round(float(x), 4) for x in score_with_stats(["bee"], [["bee", "hive"], ["hive"]], st)]
    [1.0486, 0.0]
    """
    out = np.zeros(len(passages_terms), dtype=np.float32)
    idf = {t: stats.idf(t) for t in set(query_terms)}
    for i, terms in enumerate(passages_terms):
        tf = Counter(terms)
        norm = stats.k1 * (1 - stats.b + stats.b * len(terms) / stats.avgdl)
        out[i] = sum(idf[t] * tf[t] / (tf[t] + norm) for t in query_terms if tf[t])
    return out
