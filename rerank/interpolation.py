"""Interpolating a reranker's scores with the order it was given (the head's incoming ranks).

A reranker trained on a few hundred queries, or one with ColBERT's query augmentation on very short queries, knows
things the fused list does not, and the reverse: blending the two orders is the usual remedy when a second stage is
close to the first one in quality (score interpolation; e.g. the fused-rank interpolation in Vespa phased ranking
and in the BEIR reranking baselines). Both sides are standardised over the head (z-scores), so one weight means
the same across queries, models and score scales. The weight is a served setting (``[rerank] li_weight`` /
``ce_weight``); ``hybridrag train`` reports the weight that did best on dev.
"""

from __future__ import annotations

import numpy as np

WEIGHT_GRID = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4)  # what the trainers try on dev


def standardize(scores: np.ndarray) -> np.ndarray:
    """z-scores over one head: ``(scores - mean) / (std + 1e-6)``, float32 [K] (a flat head gives zeros)."""
    scores = np.asarray(scores, dtype=np.float32)
    return (scores - scores.mean()) / (scores.std() + 1e-6)


def blend_with_prior(scores: np.ndarray, weight: float) -> np.ndarray:
    """``weight * z(scores) + (1 - weight) * z(-position)``: one blended score per head position.

    Shapes: ``scores`` float [K], the stage's score for each head passage in the incoming order (position 0 was
    the previous stage's best); ``weight`` in [0, 1]: 1 = the stage alone (its raw scores are returned
    unchanged), 0 = the incoming order. Returns float32 [K]; sort it descending for the new order.

    >>> s = np.array([0.2, 0.9, 0.1, 0.4], dtype=np.float32)
    >>> np.argsort(-blend_with_prior(s, 1.0), kind="stable").tolist()  # the stage alone
    [1, 3, 0, 2]
    >>> np.argsort(-blend_with_prior(s, 0.0), kind="stable").tolist()  # the incoming order
    [0, 1, 2, 3]
    >>> np.argsort(-blend_with_prior(s, 0.5), kind="stable").tolist()  # position 1's big lead wins, 3's does not
    [1, 0, 3, 2]
    """
    scores = np.asarray(scores, dtype=np.float32)
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must be in [0, 1], got {weight}")
    if weight == 1.0 or len(scores) < 2:
        return scores
    z = standardize(scores)
    prior = -np.arange(len(scores), dtype=np.float32)
    zp = (prior - prior.mean()) / prior.std()
    return (weight * z + (1.0 - weight) * zp).astype(np.float32)
