"""Upsert and Delete straight to the Qdrant engine: no local buffer, no rebuild (the engine indexes online).

A write is acknowledged when Qdrant answers ``wait=true``, i.e. the operation is in the write-ahead log of the
shard's replicas (``write_consistency_factor`` of them on a cluster) and applied to the segments, so the next query
anywhere sees it.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from index_builder.documents.chunking import Chunker, chunk_passages
from index_builder.models.encoders import Embedder
from index_builder.models.token_encoders import EmbedderTokens, TokenEncoder
from index_builder.settings import ChunkConfig
from index_builder.snapshot.token_store import TokenStore
from index_builder.types import Document
from rerank.late_interaction import LateInteractionReranker
from retrieval.engines.qdrant.view import QdrantView
from retrieval.errors import InvalidRequest, PermissionDenied
from retrieval.live.store import MAX_BATCH, WriteResult, check_deadline, validate_batch

log = logging.getLogger(__name__)


def stored_form(tokens: Sequence[np.ndarray], dim: int, storage: str) -> list[np.ndarray]:
    """Passages' token vectors as a snapshot of ``storage`` keeps them, decoded to floats (a pooled store: one
    vector per cluster of tokens): what a write puts in the engine, so that a written passage is scored as a
    migrated one. ``float32`` (a collection not made from a snapshot's store) keeps them as they are."""
    if storage == "float32" or not len(tokens):
        return [np.asarray(t, dtype=np.float32) for t in tokens]
    store = TokenStore.from_lists(tokens, dim, storage)
    late = LateInteractionReranker(store.vectors, store.offsets, store.scales, store.storage)
    return [late.decoded(i) for i in range(len(tokens))]


class EngineWriter:
    """Upsert and Delete on the engine (a :class:`retrieval.serving.core.Writer`), with the same checks and answers
    as the local live index (:class:`retrieval.live.live_index.LiveIndex`): the batch bounds
    (:func:`retrieval.live.store.validate_batch`), one tenant per id, the deadline checked before the encoding and
    again before the engine call. ``version`` numbers the writes (shared through Redis
    when the caches are, so every replica's cache keys move with any replica's write).

    After a crash (kill -9 included; tests/retrieval/engines/test_engine_crash.py): an acknowledged write is in the
    engine. On a local folder qdrant-client commits each point to SQLite (rollback journal, ``synchronous =
    FULL``) before applying it in memory, and its folder lock is a ``flock`` the kernel drops with the process,
    so the folder reopens as it was. A batch cut by the crash is *not* one transaction, on a folder as on a
    server: it is applied in order (its points, then the deletion of a shorter document's extra chunks), so a
    prefix of it survives (docs/deployment.md)."""

    def __init__(self, view: QdrantView, embedder: Embedder, token_encoder: TokenEncoder, chunking: ChunkConfig,
                 version: Callable[[], int] | None = None) -> None:
        self.view = view  # the collection as it is now (what Rebuild reports: the engine has no buffer)
        self.engine = view.engine
        self.embedder = embedder
        self.token_encoder = token_encoder
        self.chunker = Chunker(embedder.files.tokenizer_path, chunking)
        self._counter = itertools.count(1)
        self._version = version
        self._lock = threading.Lock()
        self._write_listeners: list[Callable[[list[str]], object]] = []
        meta = view.meta
        self.avgdl, self.k1, self.b = float(meta.get("avgdl", 0.0)), float(meta.get("k1", 1.5)), float(meta.get("b", 0.75))

    def on_write(self, fn: Callable[[list[str]], object]) -> None:
        """``fn(ids)`` after every acknowledged write (the in-process result cache invalidates)."""
        self._write_listeners.append(fn)

    def rebuild(self) -> None:
        """Nothing to do: the engine keeps its indexes current (Rebuild answers with the collection as it is)."""
        return None

    def list_documents(self, **_: Any) -> NoReturn:
        raise NotImplementedError("the engine backend keeps no document list to page through: ListDocuments needs "
                                  "the local backend's document store (serve --store)")

    def _bump(self) -> int:
        """The write's sequence number: the shared write version when there is one. The write is already in the
        engine here, so a Redis failure does not fail it: it is logged, and caches keep older entries until
        their TTL."""
        if self._version is None:
            return next(self._counter)
        try:
            return self._version()
        except Exception as e:  # noqa: BLE001
            log.error("the write is in the engine, but the shared cache's version could not be moved (%s): cached "
                      "results stay reachable until their TTL", e)
            return 0

    def _written(self, ids: list[str]) -> None:
        for fn in self._write_listeners:
            fn(ids)

    def upsert(self, documents: Sequence[Document | Mapping[str, Any]], *, tenant: str | None = None,
               deadline: float | None = None) -> WriteResult:
        docs = validate_batch(documents, deadline)
        for i, doc in enumerate(docs):
            if tenant is not None and doc.tenant != tenant:
                raise InvalidRequest(f"document {i} ({doc.id!r}): tenant {doc.tenant!r} is not the caller's tenant "
                                     f"{tenant!r}")
        owners = self.engine.owners([d.id for d in docs])
        for i, d in enumerate(docs):
            if d.id in owners and owners[d.id] != d.tenant:
                raise PermissionDenied(f"document {i} ({d.id!r}): this id cannot be written under tenant "
                                       f"{d.tenant!r}")
        points = self._encode(docs)  # the slow part, before the commit check
        m = self.engine.m
        parts = {p.payload["id"]: int(p.payload["parts"]) for p in points}
        stale = m.Filter(should=[m.Filter(must=[m.FieldCondition(key="id", match=m.MatchValue(value=doc_id)),
                                                m.FieldCondition(key="part", range=m.Range(gte=n))])
                                 for doc_id, n in parts.items()])
        with self._lock:
            check_deadline(deadline, "before the commit")
            self.engine.client.batch_update_points(self.engine.name, [
                m.UpsertOperation(upsert=m.PointsList(points=points)),
                m.DeleteOperation(delete=m.FilterSelector(filter=stale))], wait=True)
            seq = self._bump()
        self._written([d.id for d in docs])
        return WriteResult(seq, len(docs))

    def _encode(self, docs: Sequence[Document]) -> list[Any]:
        chunks = self.chunker.chunk(list(docs))
        passages = chunk_passages(docs, chunks)
        same = isinstance(self.token_encoder, EmbedderTokens)
        enc = self.embedder.encode(passages, with_tokens=same)
        tokens = None
        if self.view.late is not None:
            tokens = enc.token_vectors if same else self.token_encoder.encode_documents(passages)
            assert tokens is not None
            te = self.view.token_encoder or {}
            tokens = stored_form(tokens, int(te.get("dim") or enc.embeddings.shape[1]), str(te.get("dtype", "int8")))
        return self.engine.make_points(docs, chunks, enc.embeddings, tokens, self.view.analyzer, self.avgdl,
                                       self.k1, self.b)

    def delete(self, ids: Sequence[str], *, tenant: str | None = None, deadline: float | None = None) -> WriteResult:
        if len(ids) > MAX_BATCH:
            raise InvalidRequest(f"{len(ids)} ids in one delete; at most {MAX_BATCH} are allowed")
        check_deadline(deadline, "before it started")
        if not ids:
            return WriteResult(0, 0)
        owners = self.engine.owners(list(dict.fromkeys(ids)))
        mine = [i for i, t in owners.items() if tenant is None or t == tenant]
        if not mine:
            return WriteResult(0, 0)
        m = self.engine.m
        with self._lock:
            check_deadline(deadline, "before the commit")
            self.engine.client.delete(self.engine.name, m.FilterSelector(filter=m.Filter(must=[
                m.FieldCondition(key="id", match=m.MatchAny(any=mine))])), wait=True)
            seq = self._bump()
        self._written(mine)
        return WriteResult(seq, len(mine))
