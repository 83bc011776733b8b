"""The index contract (:mod:`retrieval.search.view`) over one Qdrant collection: what a request reads.

Document numbers and chunk numbers are the hashes of :mod:`retrieval.engines.qdrant.ids` (not positions): every
stage returns :class:`~index_builder.types.Hits` in them, and the view resolves them from the payloads its searches
returned (a bounded cache), else with one engine call.

First stage: BM25 and dense are two grouped queries (``group_by = "doc"``, one chunk per document) that the
pipeline runs in parallel and fuses with its own weighted RRF, as for the local snapshot, so quality is
comparable query for query. (Qdrant can fuse in one request with ``prefetch`` + RRF, but over points, unweighted,
with its own k: the document-level weighted fusion is what the served figures are measured with.) Late interaction
is MaxSim in the engine over the candidates (no token vectors cross the network).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from index_builder.documents.analysis import Analyzer
from index_builder.documents.chunking import chunk_passage
from index_builder.errors import ConfigError
from index_builder.snapshot.manifest import check_settings
from index_builder.types import Document, Hits
from rerank.late_interaction import Reordering, rerank_head
from retrieval.engines.qdrant.engine import FORMAT, QdrantEngine
from retrieval.engines.qdrant.ids import sparse_query
from retrieval.errors import InvalidRequest
from retrieval.search.filters import Filter

PAYLOAD_CACHE = 50_000  # chunks whose payload a view keeps from its searches (documents and passages of results)


@dataclass(frozen=True)
class EngineSnapshot:
    """What status reads of "the snapshot" on an engine backend: the collection's recorded settings."""

    manifest: dict[str, Any]
    path: str
    documents: Sequence[Any] = ()

    @property
    def generation(self) -> int:
        return int(self.manifest.get("generation", 0))


class _Payloads:
    """A bounded cache of chunk payloads seen in search results, by chunk and by document number."""

    def __init__(self, engine: QdrantEngine, size: int = PAYLOAD_CACHE) -> None:
        self.engine = engine
        self.size = size
        self._chunks: OrderedDict[int, dict] = OrderedDict()
        self._docs: OrderedDict[int, dict] = OrderedDict()
        self._lock = threading.Lock()

    def see(self, points: Sequence[Any]) -> None:
        with self._lock:
            for p in points:
                self._chunks[int(p.id)] = p.payload
                self._chunks.move_to_end(int(p.id))
                self._docs[int(p.payload["doc"])] = p.payload
                self._docs.move_to_end(int(p.payload["doc"]))
            while len(self._chunks) > self.size:
                self._chunks.popitem(last=False)
            while len(self._docs) > self.size:
                self._docs.popitem(last=False)

    def chunk(self, c: int) -> dict:
        with self._lock:
            hit = self._chunks.get(c)
        if hit is not None:
            return hit
        found = self.engine.retrieve([c])
        if not found:
            raise KeyError(f"chunk {c} is not in collection {self.engine.name!r} (deleted since it was returned)")
        self.see(found)
        return found[0].payload

    def doc(self, d: int) -> dict:
        with self._lock:
            hit = self._docs.get(d)
        if hit is not None:
            return hit
        p = self.engine.first_chunk_of_doc(d)
        if p is None:
            raise KeyError(f"document {d} is not in collection {self.engine.name!r}")
        self.see([p])
        return p.payload


def _document(payload: dict) -> Document:
    return Document(id=payload["id"], text=payload.get("text", ""), title=payload.get("title", ""),
                    tenant=payload.get("tenant", ""), metadata=dict(payload.get("meta") or {}))


class EngineDocuments:
    """``documents[d]`` by document number (the text is that of the chunk the document was hit through)."""

    def __init__(self, view: QdrantView) -> None:
        self._view = view

    def __getitem__(self, d: int) -> Document:
        return _document(self._view.payloads.doc(int(d)))

    def __len__(self) -> int:
        return self._view.engine.documents()


class EngineChunks:
    """``chunk_doc`` on an engine backend: its length (the chunk count) and a chunk's document number, read from
    the chunk's payload (the payload cache, else one engine call); never iterated."""

    def __init__(self, view: QdrantView) -> None:
        self._view = view

    def __len__(self) -> int:
        return self._view.engine.points()

    def __getitem__(self, chunk: int) -> int:
        return int(self._view.payloads.chunk(int(chunk))["doc"])


class _Filters:
    def __init__(self, engine: QdrantEngine) -> None:
        self.engine = engine

    def masks(self, f: Filter):
        """The engine's restriction for ``f`` in the place of the local (document mask, chunk mask)."""
        return None if not f else (self.engine.filter_of(f), None)


def _hits(view: QdrantView, found: list[tuple[Any, float]]) -> Hits:
    view.payloads.see([p for p, _ in found])
    return Hits(np.array([int(p.payload["doc"]) for p, _ in found], dtype=np.int64),
                np.array([s for _, s in found], dtype=np.float32),
                np.array([int(p.id) for p, _ in found], dtype=np.int64))


class _BM25:
    name = "bm25"

    def __init__(self, view: QdrantView, analyzer: Analyzer) -> None:
        self.view = view
        self.analyzer = analyzer

    def search(self, query: str, k: int, doc_mask: Any = None) -> Hits:
        idx, val = sparse_query(self.analyzer(query))
        if not idx:
            return Hits.empty()
        q = self.view.engine.m.SparseVector(indices=idx, values=val)
        return _hits(self.view, [(p, s) for p, s in self.view.engine.grouped(q, "bm25", k, doc_mask) if s > 0.0])


class _Dense:
    name = "dense"

    def __init__(self, view: QdrantView) -> None:
        self.view = view

    def search(self, query_vec: np.ndarray, k: int, doc_mask: Any = None, chunk_mask: Any = None, *,
               exact: bool = False) -> Hits:
        vec = np.asarray(query_vec, dtype=np.float32)
        return _hits(self.view, self.view.engine.grouped(vec, "dense", k, doc_mask, exact=exact))


class _Late:
    def __init__(self, view: QdrantView) -> None:
        self.view = view

    def token_sims(self, query_tokens: np.ndarray, chunk: int) -> np.ndarray | None:
        """None: the engine scores MaxSim in place and sends no token vectors back (no cross-encoder windows)."""
        return None

    def rerank(self, query_tokens: np.ndarray, chunks: np.ndarray, top_k: int, weight: float = 1.0,
               score: str = "maxsim") -> Reordering:
        if score != "maxsim":
            raise InvalidRequest(f"late-interaction score {score!r} needs per-token similarities; the Qdrant "
                                 "backend computes MaxSim in the engine ('maxsim' only)")
        head = [int(c) for c in np.asarray(chunks[:top_k], dtype=np.int64)]
        if not head:
            return rerank_head(np.zeros(0, np.float32), len(chunks), weight)
        got = self.view.engine.maxsim(query_tokens, head)
        scores = np.array([got.get(c, 0.0) for c in head], dtype=np.float32)  # no token vectors: MaxSim 0
        return rerank_head(scores, len(chunks), weight)


class QdrantView:
    """The index contract (:class:`retrieval.search.view.IndexView`) over one Qdrant collection.

    Unlike a snapshot it is not frozen: writes land in the engine and the next request sees them. Its
    ``generation`` is the collection's (the snapshot it was made from); cache entries are also keyed by the write
    version (:mod:`retrieval.search.shared_cache`), which every acknowledged write bumps."""

    in_process = False  # its searches are engine calls (network, or the engine's own threads): never solo

    def __init__(self, engine: QdrantEngine, meta: dict[str, Any]) -> None:
        self.engine = engine
        self.meta = meta
        man = meta.get("manifest", {})
        self.snapshot = EngineSnapshot({**man, "created_at": meta.get("migrated_at", ""), "covered_seq": 0,
                                        "generation": meta.get("generation", 0)},
                                       f"qdrant:{engine.config.location}#{engine.name}")
        a = man.get("analyzer", {})
        self.analyzer = Analyzer.from_settings(a)
        self.payloads = _Payloads(engine)
        self.documents = EngineDocuments(self)
        self.chunk_doc = EngineChunks(self)
        self.filters = _Filters(engine)
        self.bm25 = _BM25(self, self.analyzer)
        self.dense = _Dense(self)
        self.token_encoder: dict | None = man.get("models", {}).get("token_encoder")
        self.late = _Late(self) if self.token_encoder else None
        self.generation = int(meta.get("generation", 0))
        self.dense_error: str | None = None
        self.buffered = 0

    @classmethod
    def open(cls, engine: QdrantEngine, expected: Mapping[str, Any]) -> QdrantView:
        """The view over ``engine``'s collection, refusing one made with another model or analyzer."""
        if not engine.exists():
            if engine.config.location == ":memory:":
                raise ConfigError("the in-process Qdrant engine ([backend] location ':memory:') starts empty: give "
                                  "--index SNAPSHOT to migrate into it, or point location at a folder or a server")
            raise ConfigError(f"Qdrant collection {engine.name!r} does not exist at {engine.config.location}; "
                              "make it with 'hybridrag migrate --index SNAPSHOT --config F' (or 'hybridrag build "
                              "--config F')")
        meta = engine.metadata()
        if meta.get("format") != FORMAT:
            raise ConfigError(f"Qdrant collection {engine.name!r} was not made by hybridrag (format "
                              f"{meta.get('format')!r}, expected {FORMAT})")
        check_settings(meta.get("manifest", {}), dict(expected))
        return cls(engine, meta)

    @property
    def backend(self) -> str:
        return self.engine.config.describe()

    def passage(self, chunk: int) -> str:
        return str(self.payloads.chunk(int(chunk)).get("text", ""))

    def passage_with_title(self, chunk: int) -> str:
        p = self.payloads.chunk(int(chunk))
        return chunk_passage(p.get("title", ""), p.get("text", ""))
