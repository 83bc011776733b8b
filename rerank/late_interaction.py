"""Late-interaction stage: reorder the top K of a ranking by MaxSim against precomputed document token vectors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rerank.interpolation import blend_with_prior
from rerank.maxsim import maxsim_batch


@dataclass(frozen=True)
class Reordering:
    """``order``: a permutation of the input positions (best first); ``scores``: the stage's score per position
    of ``order`` for the reranked head, NaN for the untouched tail."""

    order: np.ndarray
    scores: np.ndarray


def rerank_head(first_scores: np.ndarray, n: int, weight: float = 1.0) -> Reordering:
    """Order the head (by descending score, stable) and keep the tail as it was. ``weight`` < 1 blends the
    scores with the head's incoming order (:func:`rerank.interpolation.blend_with_prior`); the head then carries
    the blended scores.

    >>> rerank_head(np.array([0.1, 0.9, 0.5]), 5).order.tolist()
    [1, 2, 0, 3, 4]
    >>> rerank_head(np.array([0.1, 0.9, 0.5]), 5, weight=0.0).order.tolist()
    [0, 1, 2, 3, 4]
    """
    first_scores = blend_with_prior(first_scores, weight)
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

    def rerank(self, query_tokens: np.ndarray, chunks: np.ndarray, top_k: int, weight: float = 1.0) -> Reordering:
        """Reorder the first ``top_k`` of ``chunks`` (int [n], each candidate's passage) by MaxSim (blended with
        the incoming order when ``weight`` < 1)."""
        head = np.asarray(chunks[:top_k], dtype=np.int64)
        return rerank_head(maxsim_batch(query_tokens, self.vectors, self.offsets, head, self.scales), len(chunks),
                           weight)
