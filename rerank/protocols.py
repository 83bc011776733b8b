"""The small interfaces the rerankers need; model runners that satisfy them are built outside this package."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class QueryTokenEncoder(Protocol):
    def encode_query_tokens(self, query: str) -> np.ndarray:
        """Unit-length query token vectors, float32 [q, d] (same space as the stored document token vectors)."""
        ...


class PairScorer(Protocol):
    def score_pairs(self, query: str, passages: Sequence[str]) -> np.ndarray:
        """One relevance score per (query, passage) pair, float32 [n]; higher is more relevant."""
        ...
