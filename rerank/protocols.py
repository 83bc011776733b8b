"""The small interfaces the rerankers need; model runners that satisfy them are built outside this package."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class PairScorer(Protocol):
    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """One relevance score per (query, passage) pair, float32 [n]; higher is more relevant. Pairs may come
        from different queries."""
        ...
