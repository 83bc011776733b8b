"""The typed search request: everything a caller can ask of one search, validated once.

A front door (gRPC, the library, evaluation, Generate) builds a :class:`SearchRequest`; :meth:`SearchRequest.resolve`
fills the configured defaults and checks every bound in one place; the pipeline runs a resolved request. Options
no longer travel as ``**options`` through the handler, the generator and the pipeline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from retrieval.errors import InvalidRequest
from retrieval.search.filters import Filter

FIRST_STAGES = ("bm25", "dense")
RERANK_STAGES = ("late_interaction", "cross_encoder")
STAGES = FIRST_STAGES + RERANK_STAGES
NO_FILTER = Filter()


def check_length(text: str, max_chars: int, what: str = "query") -> None:
    """The one bound on a text the models encode at query time (a query, a text to embed or to rerank:
    ``[first_stage] max_query_chars``), or InvalidRequest naming it.

    >>> check_length("bees", 3, "input 0")
    Traceback (most recent call last):
    retrieval.errors.InvalidRequest: input 0 is 4 characters; at most 3 are allowed
    """
    if len(text) > max_chars:
        raise InvalidRequest(f"{what} is {len(text)} characters; at most {max_chars} are allowed")


@dataclass(frozen=True)
class SearchRequest:
    """One search. ``None`` options take the configured default when resolved.

    ``k``: results; ``filter``: tenant and metadata; ``candidates``: top-N per first stage; ``stages``: a subset of
    :data:`STAGES` with a first stage; ``li_top_k`` / ``ce_top_k``: the heads the rerankers reorder;
    ``exact_dense``: exact search instead of HNSW; ``query_vec``: a precomputed query embedding; ``deadline``:
    absolute ``time.monotonic()`` seconds; ``use_cache``: read and fill the semantic cache; ``highlights``: each of the
    first passages gets the sentences late interaction's token similarities point at (``SearchResult.highlights``).
    """

    query: str
    k: int = 10
    filter: Filter = NO_FILTER
    candidates: int | None = None
    stages: tuple[str, ...] | None = None
    li_top_k: int | None = None
    ce_top_k: int | None = None
    exact_dense: bool = False
    query_vec: np.ndarray | None = field(default=None, compare=False, repr=False)
    deadline: float | None = None
    use_cache: bool = True
    highlights: bool = False
    resolved: bool = field(default=False, compare=False, repr=False)

    @classmethod
    def of(cls, query: str, k: int = 10, *, stages: Sequence[str] | None = None, **options) -> SearchRequest:
        """The keyword form the library has always taken (``pipeline.search(query, k, filter=..., stages=[...])``)."""
        return cls(query, k, stages=None if stages is None else tuple(stages), **options)

    def resolve(self, *, max_query_chars: int, max_k: int, max_candidates: int, default_candidates: int,
                max_top_k: int, default_li_top_k: int, default_ce_top_k: int,
                default_stages: tuple[str, ...]) -> SearchRequest:
        """This request with every default filled and every bound checked (InvalidRequest naming the value)."""
        if self.resolved:
            return self
        query, k = self.query, self.k
        if not isinstance(query, str) or not query.strip():
            raise InvalidRequest("query is empty")
        check_length(query, max_query_chars)
        if not 1 <= k <= max_k:
            raise InvalidRequest(f"top_k must be in [1, {max_k}], got {k}")
        stages = default_stages if self.stages is None else tuple(self.stages)
        candidates = self.candidates or max(default_candidates, k)
        li_top_k = default_li_top_k if self.li_top_k is None else self.li_top_k
        ce_top_k = default_ce_top_k if self.ce_top_k is None else self.ce_top_k
        if not 1 <= candidates <= max_candidates:
            raise InvalidRequest(f"candidates must be in [1, {max_candidates}], got {candidates}")
        for name, value in (("li_top_k", li_top_k), ("ce_top_k", ce_top_k)):
            if not 1 <= value <= max_top_k:
                raise InvalidRequest(f"{name} must be in [1, {max_top_k}], got {value}")
        if len(stages) > len(STAGES) or len(set(stages)) != len(stages):
            raise InvalidRequest(f"stages must name each stage at most once ({len(stages)} given); allowed: "
                                 f"{list(STAGES)}")
        unknown = [s for s in stages if s not in STAGES]
        if unknown or not any(s in FIRST_STAGES for s in stages):
            raise InvalidRequest(f"unknown stages or no first stage in {str(list(stages))[:200]}; allowed: "
                                 f"{list(STAGES)} with at least one of {list(FIRST_STAGES)}")
        return dataclasses.replace(self, stages=stages, candidates=candidates, li_top_k=li_top_k, ce_top_k=ce_top_k,
                                   resolved=True)
