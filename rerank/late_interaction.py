"""Late-interaction stage: reorder the top K of a ranking by MaxSim against precomputed document token vectors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rerank.maxsim import maxsim_batch


@dataclass(frozen=True)
class Reordering:
    """``order``: a permutation of the input positions (best first); ``scores``: the stage's score per position
    of ``order`` for the reranked head, NaN for the untouched tail."""

    order: np.ndarray
    scores: np.ndarray


def rerank_head(first_scores: np.ndarray, n: int) -> Reordering:
    """Order the head (by descending score, stable) and keep the tail as it was.

    >>> rerank_head(np.array([0.1, 0.9, 0.5]), 5).order.tolist()
    [1, 2, 0, 3, 4]
    """
    head = np.argsort(-first_scores, kind="stable")
    order = np.concatenate([head, np.arange(len(first_scores), n)]).astype(np.int64)
    scores = np.concatenate([first_scores[head], np.full(n - len(first_scores), np.nan)]).astype(np.float32)
    return Reordering(order, scores)


class LateInteractionReranker:
    """MaxSim over the candidate chunks' stored token vectors (``vectors`` [T, d] float16, or int8 with per-vector
    ``scales`` [T]; ``offsets`` [chunks + 1])."""

    def __init__(self, vectors: np.ndarray, offsets: np.ndarray, scales: np.ndarray | None = None) -> None:
        self.vectors = vectors
        self.offsets = offsets
        self.scales = scales

    def rerank(self, query_tokens: np.ndarray, chunks: np.ndarray, top_k: int) -> Reordering:
        """Reorder the first ``top_k`` of ``chunks`` (int [n], each candidate's passage) by MaxSim."""
        head = np.asarray(chunks[:top_k], dtype=np.int64)
        return rerank_head(maxsim_batch(query_tokens, self.vectors, self.offsets, head, self.scales), len(chunks))
