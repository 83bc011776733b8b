"""Tenant and metadata equality filters, turned into boolean masks over a snapshot's documents and chunks.

Every first-stage retriever applies the mask *before* taking its top N (pre-filtering), so a filtered query
still returns k results whenever k matching documents exist: BM25 masks its score vector; dense search passes the
mask to faiss as an ``IDSelectorBitmap`` and falls back to exact search over the allowed rows when the filter
is selective (see ``dense.py``).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from threading import Lock

import numpy as np

from index_builder.errors import InvalidRequest
from index_builder.types import Document

MAX_FILTER_TERMS = 16


@dataclass(frozen=True)
class Filter:
    """Restrict a query to one tenant ("" = any) and to documents whose metadata equals every given pair."""

    tenant: str = ""
    metadata: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, tenant: str = "", metadata: Mapping[str, str] | None = None) -> Filter:
        pairs = tuple(sorted((metadata or {}).items()))
        if len(pairs) > MAX_FILTER_TERMS:
            raise InvalidRequest(f"at most {MAX_FILTER_TERMS} metadata filters are allowed, got {len(pairs)}")
        for key, value in pairs:
            if not isinstance(key, str) or not key:
                raise InvalidRequest(f"metadata filter keys must be non-empty strings, got {key!r}")
            if not isinstance(value, str):
                raise InvalidRequest(f"metadata filter {key!r} must have a string value, got {type(value).__name__}")
        if not isinstance(tenant, str):
            raise InvalidRequest(f"tenant must be a string, got {type(tenant).__name__}")
        return cls(tenant, pairs)

    def __bool__(self) -> bool:
        return bool(self.tenant or self.metadata)


class FilterIndex:
    """Inverted lists (tenant -> docs, (key, value) -> docs) over one snapshot; masks are cached (LRU)."""

    def __init__(self, documents: Sequence[Document], chunk_doc: np.ndarray, cache_size: int = 256) -> None:
        self.n_docs = len(documents)
        self.chunk_doc = chunk_doc
        postings: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, d in enumerate(documents):
            postings[("\0tenant", d.tenant)].append(i)
            for kv in d.metadata.items():
                postings[kv].append(i)
        self._postings = {k: np.asarray(v, dtype=np.int64) for k, v in postings.items()}
        self._cache: OrderedDict[Filter, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = Lock()

    def masks(self, f: Filter) -> tuple[np.ndarray, np.ndarray] | None:
        """(document mask, chunk mask) for a filter; None for "no filter" (everything allowed)."""
        if not f:
            return None
        with self._lock:
            hit = self._cache.get(f)
            if hit is not None:
                self._cache.move_to_end(f)
                return hit
        doc_mask = np.ones(self.n_docs, dtype=bool)
        terms = ([("\0tenant", f.tenant)] if f.tenant else []) + list(f.metadata)
        for term in terms:
            allowed = np.zeros(self.n_docs, dtype=bool)
            allowed[self._postings.get(term, np.empty(0, np.int64))] = True
            doc_mask &= allowed
        result = (doc_mask, doc_mask[self.chunk_doc])
        with self._lock:
            self._cache[f] = result
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return result
