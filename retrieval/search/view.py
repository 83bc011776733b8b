"""The index contract: what the pipeline, the server and evaluation read of an index generation.

Three implementations: :class:`retrieval.search.index.SearchIndex` (one immutable snapshot),
:class:`retrieval.live.view.LiveView` (a snapshot plus the write buffer) and
:class:`retrieval.engines.qdrant.view.QdrantView` (a Qdrant collection). Every stage returns
:class:`~index_builder.types.Hits` in the view's document and chunk numbers and the view resolves them
(``documents[d]``, ``passage(c)``): positions in the snapshot and its chunk space (``chunk_doc``) for the local
views, 63-bit hashes of the ids for the engine (the same in every replica). ``filters.masks`` returns what the
view's own retrievers understand as a restriction: boolean (document, chunk) masks locally, an engine filter on
Qdrant; the pipeline only passes it on. On an engine, ``chunk_doc`` and ``documents`` are read for their
lengths (status) and by number, never iterated.

A local view is immutable: a request reads one view from start to end, and the live index publishes a new one
through :meth:`retrieval.search.pipeline.Pipeline.publish`. An engine view is the collection as it is now
(writes are visible to the next engine call); caches key its results by the write version.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from index_builder.types import Document, Hits
from rerank.late_interaction import Reordering
from retrieval.search.filters import Filter


class FilterMasks(Protocol):
    def masks(self, f: Filter) -> tuple[np.ndarray, np.ndarray] | None:
        """(document mask, chunk mask) of what ``f`` allows; None = everything."""


class KeywordSearch(Protocol):
    def search(self, query: str, k: int, doc_mask: np.ndarray | None = None) -> Hits:
        """Top ``k`` documents by BM25 (best chunk per document), within ``doc_mask``."""


class VectorSearch(Protocol):
    def search(self, query_vec: np.ndarray, k: int, doc_mask: np.ndarray | None = None,
               chunk_mask: np.ndarray | None = None, *, exact: bool = False) -> Hits:
        """Top ``k`` documents by inner product with ``query_vec`` (best chunk per document)."""


class LateInteraction(Protocol):
    def rerank(self, query_tokens: np.ndarray, chunks: np.ndarray, top_k: int, weight: float = 1.0,
               score: str = "maxsim") -> Reordering:
        """MaxSim of the first ``top_k`` of ``chunks`` against the query's token vectors."""

    def token_sims(self, query_tokens: np.ndarray, chunk: int) -> np.ndarray | None:
        """Every stored token of ``chunk`` against every query token, float32 [t, q] (where the cross-encoder's
        windows go); None where the index cannot say (an engine that scores in place)."""


class IndexView(Protocol):
    """One immutable generation as the request path sees it. ``in_process``: its searches are in-memory compute in
    this process (a solo search may run them on its own thread); an engine's are calls out."""

    in_process: bool

    @property
    def documents(self) -> Sequence[Document]: ...

    @property
    def chunk_doc(self) -> np.ndarray: ...

    @property
    def snapshot(self) -> Any:
        """The LoadedSnapshot it is built on (manifest, path)."""

    @property
    def filters(self) -> FilterMasks: ...

    @property
    def bm25(self) -> KeywordSearch: ...

    @property
    def dense(self) -> VectorSearch | None:
        """None: BM25 serves alone (``dense_error`` says why)."""

    @property
    def late(self) -> LateInteraction | None:
        """None: the snapshot has no token vectors."""

    @property
    def token_encoder(self) -> dict | None:
        """Which model made the stored token vectors."""

    @property
    def generation(self) -> int: ...

    @property
    def backend(self) -> str:
        """What serves it: 'local snapshot', or the engine's description (``GetIndexStatus.backend``)."""

    @property
    def dense_error(self) -> str | None: ...

    @property
    def buffered(self) -> int:
        """Documents written since the snapshot (0 for a bare snapshot)."""

    def passage(self, chunk: int) -> str: ...

    def passage_with_title(self, chunk: int) -> str: ...
