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

from index_builder.documents.corpus import check_metadata_key, check_metadata_value, check_tenant
from index_builder.types import Document
from retrieval.errors import InvalidRequest

MAX_FILTER_TERMS = 16
# The filter-mask LRU is bounded in bytes (each entry holds a bool per document and per chunk), not only entries:
# 256 masks of a 10M-chunk index would be 2.5 GB.
MASK_CACHE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Filter:
    """Restrict a query to one tenant ("" = any) and to documents whose metadata equals every given pair."""

    tenant: str = ""
    metadata: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, tenant: str = "", metadata: Mapping[str, str] | None = None) -> Filter:
        """A validated filter: the tenant and every key and value obey the same rules as stored documents
        (:mod:`index_builder.documents.corpus`), so no request can make the filter-mask cache or the semantic cache hold an
        unbounded key."""
        metadata = metadata or {}
        if len(metadata) > MAX_FILTER_TERMS:
            raise InvalidRequest(f"at most {MAX_FILTER_TERMS} metadata filters are allowed, got {len(metadata)}")
        for key, value in metadata.items():
            if not isinstance(key, str) or not key:
                raise InvalidRequest(f"metadata filter keys must be non-empty strings, got {key!r:.80}")
            if not isinstance(value, str):
                raise InvalidRequest(f"metadata filter {key!r:.80} must have a string value, got {type(value).__name__}")
            try:
                check_metadata_key(key)
                check_metadata_value(key, value)
            except ValueError as e:
                raise InvalidRequest(f"metadata filter: {e}") from None
        if not isinstance(tenant, str):
            raise InvalidRequest(f"tenant must be a string, got {type(tenant).__name__}")
        try:
            check_tenant(tenant)
        except ValueError as e:
            raise InvalidRequest(str(e)) from None
        return cls(tenant, tuple(sorted(metadata.items())))

    def __bool__(self) -> bool:
        return bool(self.tenant or self.metadata)

    @property
    def nbytes(self) -> int:
        """Roughly what this filter holds (it is part of cache keys, which are bounded in bytes)."""
        return 64 + len(self.tenant) + sum(len(k) + len(v) + 64 for k, v in self.metadata)


class FilterIndex:
    """Inverted lists over one snapshot, in two separate tables: tenant -> docs and (key, value) -> docs. Tenancy
    by construction: no metadata key, whatever its bytes, can name a tenant posting (they once shared one table,
    with the tenant under a reserved key, and a document could claim another tenant through its metadata).
    Masks are cached (LRU, bounded in entries and in bytes)."""

    def __init__(self, documents: Sequence[Document], chunk_doc: np.ndarray, cache_size: int = 256,
                 cache_bytes: int = MASK_CACHE_BYTES) -> None:
        self.n_docs = len(documents)
        self.chunk_doc = chunk_doc
        tenants: dict[str, list[int]] = defaultdict(list)
        postings: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, d in enumerate(documents):
            tenants[d.tenant].append(i)
            for kv in d.metadata.items():
                postings[kv].append(i)
        self._tenants = {t: np.asarray(v, dtype=np.int64) for t, v in tenants.items()}
        self._postings = {k: np.asarray(v, dtype=np.int64) for k, v in postings.items()}
        self._cache: OrderedDict[Filter, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        entry_bytes = self.n_docs + len(chunk_doc) + 1
        self._cache_size = max(0, min(cache_size, cache_bytes // entry_bytes))
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
        none = np.empty(0, np.int64)
        lists = ([self._tenants.get(f.tenant, none)] if f.tenant else []) + [self._postings.get(kv, none)
                                                                           for kv in f.metadata]
        doc_mask = np.ones(self.n_docs, dtype=bool)
        for rows in lists:
            allowed = np.zeros(self.n_docs, dtype=bool)
            allowed[rows] = True
            doc_mask &= allowed
        result = (doc_mask, doc_mask[self.chunk_doc])
        with self._lock:
            self._cache[f] = result
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return result
