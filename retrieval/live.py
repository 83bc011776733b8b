"""The live index: durable writes that the next query sees, over an immutable snapshot generation.

A :class:`LiveView` is what a request reads: one snapshot (:class:`SearchIndex`) plus one immutable write-buffer
state. Every write makes a new buffer state and a new view; the pipeline swaps its ``index`` reference to it, so
each request keeps the view it started with from start to end (readers never lock, never wait).

The view keeps the snapshot's index space and appends the buffer's: buffered document ``i`` is document
``n_snapshot_docs + i``, its chunks follow the snapshot's chunks, so every stage's :class:`Hits` work unchanged.

- **Tombstones**: a document id written since the snapshot (replaced or deleted) is hidden from the snapshot's
  side in every stage at once (a mask, like a filter); its current version, if any, lives in the buffer.
- **BM25 over buffered passages** is scored with the *snapshot's* statistics (IDF from its document frequencies,
  its mean length; :func:`retrieval.bm25.score_with_stats`), so buffered and indexed passages are ranked on one
  scale. A second BM25 index over the few buffered passages would use that tiny collection's IDF (a word in 1 of
  3 buffered passages looks rare) and its scores could not be compared; RRF-merging the two lists would put the
  buffer's best passage near the top for any query sharing a word with it.
- **Dense**: exact inner product over the buffered vectors (same embedding space: scores are comparable), merged
  with the snapshot's HNSW results by score.
- **Late interaction**: token vectors of buffered passages, computed when written, stored like the snapshot's.

Writes: the documents are validated, chunked and encoded *before* the writer lock (the slow part runs in
parallel and a failure writes nothing), then, under the lock, written to the store (durable on return) and
applied to a new buffer state, which is then published: acknowledged means durable and visible.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from index_builder.build import BuildSummary, build_snapshot, chunk_passages
from index_builder.chunking import Chunker
from index_builder.models import Embedder
from index_builder.snapshot import CHUNK_DTYPE
from index_builder.token_encoders import EmbedderTokens, TokenEncoder, TokenStore
from index_builder.types import Document, Hits
from rerank.late_interaction import Reordering, rerank_head
from rerank.maxsim import maxsim_batch
from retrieval.aggregate import doc_starts, top_docs_from_chunk_scores
from retrieval.bm25 import score_with_stats
from retrieval.config import AppConfig
from retrieval.filters import Filter
from retrieval.index import SearchIndex
from retrieval.store import DocumentStore, WriteResult, validate_document

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Encoded:
    """Buffered documents ready to merge: chunks (doc = position in ``docs``), vectors, token vectors, terms."""

    docs: tuple[Document, ...]
    chunks: np.ndarray
    vectors: np.ndarray
    tokens: list[np.ndarray]
    terms: list[list[str]]


@dataclass(frozen=True)
class BufferState:
    """An immutable write buffer: the current version of every document written since the snapshot, and the ids
    whose snapshot version must not be served (``hidden``)."""

    docs: tuple[Document, ...]
    chunks: np.ndarray  # CHUNK_DTYPE, "doc" = position in docs
    vectors: np.ndarray  # float32 [n_chunks, dim]
    tokens: list[np.ndarray]  # per chunk, [t, tdim] (float16)
    terms: list[list[str]]  # per chunk, analysed (BM25)
    hidden: Mapping[str, int]  # id -> sequence number of its last write since the snapshot
    seq: int  # the store's sequence number this state reflects
    doc_seqs: tuple[int, ...] = ()  # per buffered document, the sequence number of its version

    @classmethod
    def empty(cls, dim: int, seq: int) -> BufferState:
        return cls((), np.zeros(0, CHUNK_DTYPE), np.zeros((0, dim), np.float32), [], [], {}, seq)

    def after(self, seq: int) -> BufferState:
        """What stays buffered once a snapshot covering ``seq`` is served: the writes after ``seq``."""
        keep = {d.id for d, s in zip(self.docs, self.doc_seqs, strict=True) if s <= seq}
        base = self.without(keep)
        return BufferState(base.docs, base.chunks, base.vectors, base.tokens, base.terms,
                           {i: s for i, s in self.hidden.items() if s > seq}, self.seq, base.doc_seqs)

    def without(self, ids: set[str]) -> BufferState:
        """This state minus the buffered documents with these ids (their chunks too)."""
        keep_docs = [i for i, d in enumerate(self.docs) if d.id not in ids]
        if len(keep_docs) == len(self.docs):
            return self
        remap = np.full(len(self.docs), -1, np.int64)
        remap[keep_docs] = np.arange(len(keep_docs))
        keep = remap[self.chunks["doc"]] >= 0 if len(self.chunks) else np.zeros(0, bool)
        chunks = self.chunks[keep].copy()
        chunks["doc"] = remap[chunks["doc"]]
        rows = np.flatnonzero(keep)
        return BufferState(tuple(self.docs[i] for i in keep_docs), chunks, self.vectors[rows],
                           [self.tokens[i] for i in rows], [self.terms[i] for i in rows], self.hidden, self.seq,
                           tuple(self.doc_seqs[i] for i in keep_docs))

    def plus(self, enc: Encoded, seqs: Sequence[int]) -> BufferState:
        """Add (or replace) documents written with these sequence numbers (one per document of ``enc``)."""
        ids = {d.id for d in enc.docs}
        base = self.without(ids)
        chunks = enc.chunks.copy()
        chunks["doc"] += len(base.docs)
        hidden = {**base.hidden, **{d.id: s for d, s in zip(enc.docs, seqs, strict=True)}}
        return BufferState(base.docs + enc.docs, np.concatenate([base.chunks, chunks]),
                           np.concatenate([base.vectors, enc.vectors]), base.tokens + enc.tokens,
                           base.terms + enc.terms, hidden, max(self.seq, max(seqs)), base.doc_seqs + tuple(seqs))

    def minus(self, deleted: Mapping[str, int]) -> BufferState:
        """Remove documents deleted at these sequence numbers (id -> seq)."""
        base = self.without(set(deleted))
        return BufferState(base.docs, base.chunks, base.vectors, base.tokens, base.terms, {**base.hidden, **deleted},
                           max(self.seq, max(deleted.values(), default=self.seq)), base.doc_seqs)


class _Concat(Sequence[Document]):
    """Two sequences seen as one, without copying (the snapshot's documents, then the buffer's)."""

    def __init__(self, a: Sequence[Document], b: Sequence[Document]) -> None:
        self.a, self.b = a, b

    def __len__(self) -> int:
        return len(self.a) + len(self.b)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        return self.a[i] if i < len(self.a) else self.b[i - len(self.a)]


class LiveView:
    """One snapshot + one buffer state, with the interface the pipeline and the server read (see the module doc)."""

    def __init__(self, base: SearchIndex, state: BufferState, storage: str) -> None:
        self.base = base
        self.state = state
        self.snapshot = base.snapshot
        self.n_base_docs = len(base.documents)
        self.n_base_chunks = len(base.chunks)
        self.documents = _Concat(base.documents, state.docs)
        self.chunk_doc = np.concatenate([base.chunk_doc, state.chunks["doc"].astype(np.int64) + self.n_base_docs])
        self.buffer_starts = doc_starts(state.chunks["doc"].astype(np.int64), len(state.docs))
        self.starts = np.concatenate([base.starts, self.buffer_starts + self.n_base_chunks]) \
            if len(state.docs) else base.starts
        visible = np.ones(self.n_base_docs, dtype=bool)
        if state.hidden:
            for doc_id in state.hidden:
                i = base.doc_index.get(doc_id)
                if i is not None:
                    visible[i] = False
        self.base_visible = visible
        self.buffer_tokens = TokenStore.from_lists(state.tokens, base.late.vectors.shape[1], storage) \
            if base.late is not None and state.tokens else None
        self.filters = _LiveFilters(self)
        self.bm25 = _LiveBM25(self)
        self.dense = _LiveDense(self) if base.dense is not None else None
        self.late = _LiveLate(self) if base.late is not None else None
        self.token_encoder = base.token_encoder

    @property
    def generation(self) -> int:
        return self.base.generation

    @property
    def dense_error(self) -> str | None:
        return self.base.dense_error

    @property
    def buffered(self) -> int:
        return len(self.state.docs)

    def passage(self, chunk: int) -> str:
        if chunk < self.n_base_chunks:
            return self.base.passage(chunk)
        c = self.state.chunks[chunk - self.n_base_chunks]
        return self.state.docs[c["doc"]].text[c["start"]:c["end"]]

    def passage_with_title(self, chunk: int) -> str:
        if chunk < self.n_base_chunks:
            return self.base.passage_with_title(chunk)
        c = self.state.chunks[chunk - self.n_base_chunks]
        return chunk_passages(self.state.docs, c.reshape(1))[0]


class _LiveFilters:
    def __init__(self, view: LiveView) -> None:
        self.view = view

    def masks(self, f: Filter) -> tuple[np.ndarray, np.ndarray] | None:
        v = self.view
        base = v.base.filters.masks(f)
        if base is None and not v.state.hidden and not v.state.docs:
            return None
        base_docs = v.base_visible if base is None else base[0] & v.base_visible
        buf = np.array([(not f.tenant or d.tenant == f.tenant) and all(d.metadata.get(k) == val for k, val in f.metadata)
                        for d in v.state.docs], dtype=bool)
        doc_mask = np.concatenate([base_docs, buf])
        return doc_mask, doc_mask[v.chunk_doc]


class _LiveBM25:
    def __init__(self, view: LiveView) -> None:
        self.view = view
        self.analyzer = view.base.bm25.analyzer

    def search(self, query: str, k: int, doc_mask: np.ndarray | None = None) -> Hits:
        v = self.view
        scores = v.base.bm25.chunk_scores(query)
        if v.state.terms:
            buffered = score_with_stats(self.analyzer(query), v.state.terms, v.base.bm25_stats)
            scores = np.concatenate([scores, buffered])
        return top_docs_from_chunk_scores(scores, v.starts, k, valid=doc_mask, min_score=0.0)


class _LiveDense:
    def __init__(self, view: LiveView) -> None:
        self.view = view

    def search(self, query_vec: np.ndarray, k: int, doc_mask: np.ndarray | None = None,
               chunk_mask: np.ndarray | None = None, *, exact: bool = False) -> Hits:
        v = self.view
        assert v.base.dense is not None
        nb, nbc = v.n_base_docs, v.n_base_chunks
        if doc_mask is None and v.state.hidden:
            doc_mask = np.concatenate([v.base_visible, np.ones(len(v.state.docs), bool)])
            chunk_mask = doc_mask[v.chunk_doc]
        base = v.base.dense.search(query_vec, k, None if doc_mask is None else doc_mask[:nb],
                                   None if chunk_mask is None else chunk_mask[:nbc], exact=exact)
        if not len(v.state.docs):
            return base
        scores = v.state.vectors @ np.asarray(query_vec, dtype=np.float32)
        buf = top_docs_from_chunk_scores(scores, v.buffer_starts, k, valid=None if doc_mask is None else doc_mask[nb:])
        doc = np.concatenate([base.doc, buf.doc + nb])
        sc = np.concatenate([base.scores, buf.scores]).astype(np.float32)
        ch = np.concatenate([base.chunk, buf.chunk + nbc])
        order = np.argsort(-sc, kind="stable")[:k]
        return Hits(doc[order], sc[order], ch[order])


class _LiveLate:
    def __init__(self, view: LiveView) -> None:
        self.view = view

    def rerank(self, query_tokens: np.ndarray, chunks: np.ndarray, top_k: int, weight: float = 1.0) -> Reordering:
        v = self.view
        late = v.base.late
        assert late is not None
        head = np.asarray(chunks[:top_k], dtype=np.int64)
        scores = np.zeros(len(head), dtype=np.float32)
        in_base = head < v.n_base_chunks
        if in_base.any():
            scores[in_base] = maxsim_batch(query_tokens, late.vectors, late.offsets, head[in_base], late.scales)
        if (~in_base).any() and v.buffer_tokens is not None:
            t = v.buffer_tokens
            scores[~in_base] = maxsim_batch(query_tokens, t.vectors, t.offsets, head[~in_base] - v.n_base_chunks, t.scales)
        return rerank_head(scores, len(chunks), weight)


class LiveIndex:
    """Writes through the store into a new buffer state and view; ``on_publish`` callbacks get every new view
    (the pipeline sets its ``index`` to it)."""

    def __init__(self, base: SearchIndex, store: DocumentStore, embedder: Embedder, token_encoder: TokenEncoder,
                 config: AppConfig) -> None:
        self.base = base
        self.store = store
        self.embedder = embedder
        self.token_encoder = token_encoder
        self.config = config
        self.chunker = Chunker(embedder.files.tokenizer_path, config.chunking)
        te = base.token_encoder or {}
        self.storage = str(te.get("dtype", config.late_interaction.storage))
        self._lock = threading.Lock()  # writers and the swap
        self._rebuild_lock = threading.Lock()  # one rebuild at a time
        self._listeners: list[Callable[[LiveView], None]] = []
        self._write_listeners: list[Callable[[list[str]], None]] = []
        self._rebuild_listeners: list[Callable[[float, bool], None]] = []
        self._first_buffered: float | None = None
        self._rebuild_embedder: Embedder | None = None
        self._stop = threading.Event()
        self._auto: threading.Thread | None = None
        self.rebuilds: list[dict[str, float]] = []  # seconds and covered sequence number of each rebuild
        covered = int(base.snapshot.manifest.get("covered_seq", 0))
        self.view = LiveView(base, BufferState.empty(embedder.dim, covered), self.storage)
        self.replay()

    def on_publish(self, fn: Callable[[LiveView], None]) -> None:
        self._listeners.append(fn)
        fn(self.view)

    def on_write(self, fn: Callable[[list[str]], None]) -> None:
        """``fn(ids)`` after every acknowledged write, once its view is published (the semantic cache invalidates)."""
        self._write_listeners.append(fn)

    def on_rebuild(self, fn: Callable[[float, bool], None]) -> None:
        """``fn(seconds, ok)`` after every rebuild attempt (the rebuild-duration metric)."""
        self._rebuild_listeners.append(fn)

    def _written(self, ids: list[str]) -> None:
        for fn in self._write_listeners:
            fn(ids)

    def _publish(self, state: BufferState) -> None:
        if state.docs or state.hidden:
            self._first_buffered = self._first_buffered or time.monotonic()
        else:
            self._first_buffered = None
        self.view = LiveView(self.base, state, self.storage)
        for fn in self._listeners:
            fn(self.view)

    def encode(self, docs: Sequence[Document]) -> Encoded:
        chunks = self.chunker.chunk(list(docs))
        passages = chunk_passages(docs, chunks)
        same_pass = isinstance(self.token_encoder, EmbedderTokens)
        enc = self.embedder.encode(passages, with_tokens=same_pass)
        tokens = enc.token_vectors if same_pass else self.token_encoder.encode_documents(passages)
        assert tokens is not None
        terms = self.base.bm25.analyzer.batch(passages)
        return Encoded(tuple(docs), chunks, enc.embeddings, [t.astype(np.float16) for t in tokens], terms)

    def replay(self) -> int:
        """Apply the store's writes newer than what is served (start-up); returns how many were applied."""
        with self._lock:
            state = self._apply(self.view.state, self.store.changes_since(self.view.state.seq))
            applied = state.seq - self.view.state.seq
            if applied:
                self._publish(state)
        if applied:
            log.info("replayed the writes up to sequence %d (%d documents buffered)", state.seq, len(state.docs))
        return applied

    def _apply(self, state: BufferState, changes: Sequence[Any]) -> BufferState:
        if not changes:
            return state
        current = {c.id: c for c in changes}  # the last change per id decides
        deleted = {i: c.seq for i, c in current.items() if c.op == "delete" or c.document is None}
        upserts = [c for c in current.values() if c.op == "upsert" and c.document is not None]
        if deleted:
            state = state.minus(deleted)
        if upserts:
            state = state.plus(self.encode([c.document for c in upserts]), [c.seq for c in upserts])
        return BufferState(state.docs, state.chunks, state.vectors, state.tokens, state.terms, state.hidden,
                           max(state.seq, changes[-1].seq), state.doc_seqs)

    def upsert(self, documents: Sequence[Document | Mapping[str, Any]], *, tenant: str | None = None) -> WriteResult:
        docs = [validate_document(d, i) for i, d in enumerate(documents)]
        encoded = self.encode(docs) if docs else None  # slow part first, outside the lock; failure writes nothing
        with self._lock:
            result = self.store.upsert(docs, tenant=tenant)  # durable when this returns
            assert encoded is not None
            seqs = list(range(result.seq - len(docs) + 1, result.seq + 1))  # one per document, in order
            self._publish(self.view.state.plus(encoded, seqs))
            self._written([d.id for d in docs])
        return result

    def delete(self, ids: Sequence[str], *, tenant: str | None = None) -> WriteResult:
        with self._lock:
            result = self.store.delete(ids, tenant=tenant)
            if result.count:  # the store numbers the deleted ids in order; read them back to tombstone exactly
                changes = [c for c in self.store.changes_since(result.seq - result.count) if c.op == "delete"]
                self._publish(self.view.state.minus({c.id: c.seq for c in changes}))
                self._written([c.id for c in changes])
        return result

    # ------------------------------------------------------------------ rebuild and swap

    def rebuild(self) -> BuildSummary | None:
        """Build a new snapshot from the store (no lock held: writes and queries go on), then swap it in: the
        buffer keeps only the writes the new snapshot does not cover. Returns None when the store is empty.

        The work runs on a fresh thread at ``live.rebuild_nice`` (Linux schedules threads by their own nice
        value), so the queries being served keep their CPU; the caller waits for it."""
        out: list[BuildSummary | None] = []
        errors: list[BaseException] = []

        def work() -> None:
            nice = self.config.live.rebuild_nice
            if nice and hasattr(os, "setpriority"):
                try:
                    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
                except OSError as e:  # not permitted here: rebuild at normal priority
                    log.warning("cannot lower the rebuild thread's priority: %s", e)
            try:
                out.append(self._rebuild_now())
            except BaseException as e:  # noqa: BLE001  (re-raised in the caller)
                errors.append(e)

        t0 = time.perf_counter()
        t = threading.Thread(target=work, name="hybridrag-rebuild-work")
        t.start()
        t.join()
        if not (out and out[0] is None):  # an empty store builds nothing: not a rebuild
            for fn in self._rebuild_listeners:
                fn(time.perf_counter() - t0, not errors)
        if errors:
            raise errors[0]
        return out[0]

    def _rebuild_now(self) -> BuildSummary | None:
        with self._rebuild_lock:
            t0 = time.perf_counter()
            seq, docs = self.store.snapshot()
            if not docs:
                return None
            root = self.base.snapshot.path.parent.parent
            embedder, token_encoder = self._rebuild_models()
            summary = build_snapshot(docs, root, self.config.build_config(), embedder, covered_seq=seq,
                                     token_encoder=token_encoder)
            new_base = SearchIndex.load(root, self.config, self.embedder)
            with self._lock:
                self.base = new_base
                self._publish(self.view.state.after(seq))
            seconds = time.perf_counter() - t0
            self.rebuilds.append({"seconds": seconds, "covered_seq": float(seq), "documents": float(len(docs))})
            log.info("rebuilt generation %d from the store (sequence %d, %d documents) in %.1f s; %d writes stay "
                     "buffered", new_base.generation, seq, len(docs), seconds, len(self.view.state.docs))
            return summary

    def _rebuild_models(self) -> tuple[Embedder, TokenEncoder]:
        """The rebuild's encoder: the same model with ``live.rebuild_threads`` ONNX threads (its own session, so
        a rebuild cannot take every core from the queries being served)."""
        threads = self.config.live.rebuild_threads
        if not threads:
            return self.embedder, self.token_encoder
        if self._rebuild_embedder is None:
            cfg = self.config.embedder
            self._rebuild_embedder = Embedder(replace(cfg, runtime=replace(cfg.runtime, intra_op_threads=threads)),
                                              files=self.embedder.files)
        tokens = EmbedderTokens(self._rebuild_embedder) if isinstance(self.token_encoder, EmbedderTokens) \
            else self.token_encoder
        return self._rebuild_embedder, tokens

    def rebuild_due(self) -> bool:
        lc = self.config.live
        state = self.view.state
        pending = len(state.hidden)
        if not pending:
            return False
        if lc.rebuild_after_writes and pending >= lc.rebuild_after_writes:
            return True
        age = 0.0 if self._first_buffered is None else time.monotonic() - self._first_buffered
        return bool(lc.rebuild_after_s) and age >= lc.rebuild_after_s

    def start_auto_rebuild(self) -> None:
        """A background thread that rebuilds when the buffer is large or old enough (``[live]`` config)."""
        def loop() -> None:
            while not self._stop.wait(self.config.live.check_interval_s):
                try:
                    if self.rebuild_due():
                        self.rebuild()
                except Exception:  # a failed rebuild must not stop serving: the buffer still answers
                    log.exception("background rebuild failed; serving the previous generation and the buffer")
        self._auto = threading.Thread(target=loop, name="hybridrag-rebuild", daemon=True)
        self._auto.start()

    def close(self) -> None:
        self._stop.set()
        if self._auto is not None:
            self._auto.join()
