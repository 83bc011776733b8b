"""Cross-encoder stage: reorder the top K of a ranking by (query, passage) pair scores; the rest keep their order.

The scores come from outside: the service calls ``index_builder.models.encoders.CrossEncoder`` through its
cross-request batcher, so pairs of concurrent requests share one ONNX run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rerank.interpolation import standardize
from rerank.late_interaction import Reordering, rerank_head


def pairs_for(query: str, passages: Sequence[str]) -> list[tuple[str, str]]:
    return [(query, p) for p in passages]


def rerank_by_scores(scores: np.ndarray, n: int, weight: float = 1.0) -> Reordering:
    """``scores``: one per head passage (K = len(scores)); ``n``: the whole list's length; ``weight`` < 1 blends
    the scores with the head's incoming order."""
    return rerank_head(np.asarray(scores, dtype=np.float32), n, weight)


def decisive_gap(head_scores: np.ndarray) -> float:
    """How decisive a ranked head already is: the gap between its first two scores in standard deviations of the
    head (``head_scores`` float [K], best first, as the previous stage left them). The cross-encoder's gate
    (``[rerank] ce_gate_gap``) skips heads whose gap is at least its threshold; inf for a head of one.

    >>> decisive_gap(np.array([3.0, 1.0, 0.9, 0.8]))  > decisive_gap(np.array([1.1, 1.0, 0.9, 0.8]))
    True
    """
    if len(head_scores) < 2:
        return float("inf")
    z = standardize(np.asarray(head_scores, dtype=np.float32))
    return float(z[0] - z[1])
