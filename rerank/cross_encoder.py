"""Cross-encoder stage: score (query, passage) pairs jointly and reorder the top K; the rest keep their order."""

from __future__ import annotations

from collections.abc import Sequence

from rerank.late_interaction import Reordering, rerank_head
from rerank.protocols import PairScorer


class CrossEncoderReranker:
    def __init__(self, scorer: PairScorer) -> None:
        self.scorer = scorer

    def rerank(self, query: str, passages: Sequence[str], n: int) -> Reordering:
        """``passages``: the texts of the first K candidates (K = len(passages)); ``n``: the whole list's length."""
        return rerank_head(self.scorer.score_pairs(query, passages), n)
