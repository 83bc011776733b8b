"""Reciprocal rank fusion (Cormack et al., 2009) as pure numpy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from retrieval.search.settings import FusionConfig  # noqa: F401  (its section lives with the search settings)


def rrf(rankings: Sequence[np.ndarray], k: float = 60.0, weights: Sequence[float] | None = None,
        ) -> tuple[np.ndarray, np.ndarray]:
    """Fuse ranked id lists: ``score(d) = sum_i w_i / (k + rank_i(d))`` with 1-based ranks; best first.

    Shapes: each ranking is int [n_i] (ids, best first, no repeats); returns ids int64 [m] and scores float64 [m],
    ``m`` = number of distinct ids. Ties are broken by the smaller id, so the output is deterministic.

    >>> ids, scores = rrf([np.array([7, 3, 5]), np.array([3, 9])], k=60)
    >>> ids.tolist()
    [3, 7, 9, 5]
    >>> [round(float(s), 5) for s in scores]
    [0.03252, 0.01639, 0.01613, 0.01587]
    >>> rrf([np.array([1, 2]), np.array([2, 1])], weights=[2.0, 1.0])[0].tolist()
    [1, 2]
    """
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError(f"{len(rankings)} rankings but {len(weights)} weights")
    if k <= 0:
        raise ValueError(f"rrf k must be > 0, got {k}")
    parts = [np.asarray(r, dtype=np.int64) for r in rankings]
    if not parts or sum(len(p) for p in parts) == 0:
        return np.empty(0, np.int64), np.empty(0, np.float64)
    all_ids = np.concatenate(parts)
    contrib = np.concatenate([w / (k + np.arange(1, len(p) + 1, dtype=np.float64)) for p, w in zip(parts, weights, strict=False)])
    ids, inverse = np.unique(all_ids, return_inverse=True)
    scores = np.zeros(len(ids), dtype=np.float64)
    np.add.at(scores, inverse, contrib)
    order = np.lexsort((ids, -scores))
    return ids[order], scores[order]
