"""Certain evidence: what a reranking stage may not overturn (issue 53).

BM25 is in a hybrid system for exact matches. When its best document leads the next one by a wide margin (a rare
query term, an identifier or a nonce word that no other candidate holds), that lead is evidence the reranking
stages cannot see: late interaction over the compact token store blurs the few word pieces a random identifier is
made of, and its blend with the fused *position* cannot tell a unique exact match from a near tie. The rule keeps
such a document within the first ``keep_rank`` places of the reranked list; below that margin the rerankers order
freely. It reads only BM25's own scores (every first-stage backend has them): no new index files.
"""

from __future__ import annotations

import numpy as np


def bm25_lead(scores: np.ndarray) -> float:
    """How far BM25's best document is ahead: ``1 - s2 / s1`` over its two best scores (``scores`` float [n],
    best first); 1.0 when one document alone matched, 0.0 for an empty list or a tie.

    >>> bm25_lead(np.array([3.9]))
    1.0
    >>> round(bm25_lead(np.array([4.0, 3.0, 1.0])), 3)
    0.25
    >>> bm25_lead(np.array([], dtype=np.float32))
    0.0
    """
    if len(scores) == 0 or not scores[0] > 0:
        return 0.0
    second = float(scores[1]) if len(scores) > 1 else 0.0
    return float(max(0.0, 1.0 - max(second, 0.0) / float(scores[0])))


def keep_certain(docs: np.ndarray, bm25_docs: np.ndarray, bm25_scores: np.ndarray, margin: float,
                 keep_rank: int) -> np.ndarray | None:
    """The permutation of a reranked list ``docs`` (int [n], best first) that moves BM25's best document back to
    position ``keep_rank - 1`` when its lead (:func:`bm25_lead`) is at least ``margin`` and a reranker put it
    lower; the documents it passes move down one place each. None = the list stands (no certain document, it is
    already within ``keep_rank``, or it is not in the list). ``margin`` <= 0 or > 1 turns the rule off.

    >>> keep_certain(np.array([5, 6, 7, 8]), np.array([8, 5]), np.array([4.0, 1.0]), 0.5, 1).tolist()
    [3, 0, 1, 2]
    >>> keep_certain(np.array([5, 6, 7, 8]), np.array([8, 5]), np.array([4.0, 1.0]), 0.5, 3).tolist()
    [0, 1, 3, 2]
    >>> keep_certain(np.array([5, 6, 7, 8]), np.array([8, 5]), np.array([4.0, 3.0]), 0.5, 1) is None  # a near tie
    True
    """
    if not 0.0 < margin <= 1.0 or keep_rank < 1 or len(bm25_docs) == 0:
        return None
    if bm25_lead(bm25_scores) < margin:
        return None
    where = np.flatnonzero(docs == bm25_docs[0])
    if len(where) == 0 or (p := int(where[0])) < keep_rank:
        return None
    to = keep_rank - 1
    return np.concatenate([np.arange(to), [p], np.arange(to, p), np.arange(p + 1, len(docs))]).astype(np.int64)
