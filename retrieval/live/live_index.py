"""The live index: durable writes that the next query sees, over an immutable snapshot generation.

A :class:`LiveView` is what a request reads: one snapshot (:class:`SearchIndex`) plus one immutable write-buffer
state. Every write makes a new buffer state and a new view; the pipeline swaps its ``index`` reference to it, so
each request keeps the view it started with from start to end (readers never lock, never wait).

The view keeps the snapshot's index space and appends the buffer's: buffered document ``i`` is document
``n_snapshot_docs + i``, its chunks follow the snapshot's chunks, so every stage's :class:`Hits` work unchanged.

- **Tombstones**: a document id written since the snapshot (replaced or deleted) is hidden from the snapshot's
  side in every stage at once (a mask, like a filter); its current version, if any, lives in the buffer.
- **BM25 over buffered passages** is scored with the *snapshot's* statistics (IDF from its document frequencies,
  its mean length; the formula of :func:`retrieval.search.bm25.score_with_stats`, over each segment's postings), so
  buffered and indexed passages are ranked on one scale. A second BM25 index over the few buffered passages would
  use that tiny collection's IDF (a word in 1 of 3 buffered passages looks rare) and its scores could not be
  compared; RRF-merging the two lists would put the buffer's best passage near the top for any query sharing a
  word with it.
- **Dense**: exact inner product over the buffered vectors (same embedding space: scores are comparable), merged
  with the snapshot's HNSW results by score.
- **Late interaction**: token vectors of buffered passages, computed and stored (the snapshot's storage) when
  written.

The write buffer is **segmented** (a log-structured merge of write batches): a :class:`BufferState` is a tuple of
immutable :class:`Segment` s, one per encoded write batch (docs, chunks, vectors, a :class:`TokenStore` built once,
BM25 postings, sequence numbers, and the ids it deletes), plus, per segment, the rows that later writes superseded
or deleted (*dead*: masked like tombstones, never served, dropped when the segment is next merged). A write
appends one segment and marks the rows it supersedes: O(size of the write + number of segments), whatever is
buffered; the existing segments (and their arrays) are shared by the old and new state. After appending, the last
two segments are merged while the last holds more than half as many entries as the one before it (a binary
counter), so the sizes at least halve from one segment to the next: at most ``log2(entries) + 1`` segments, which
keeps the per-query loops over segments short, and each buffered row is copied O(log n) times in all (merges are
amortised). The arrays that combine the snapshot and the buffer (``chunk_doc``, ``starts``, the visibility masks)
are computed lazily, once per view, when a query first needs them: a write never pays for them.

Writes: the batch size, its bytes, the caller's deadline and each document (:func:`retrieval.live.store.validate_batch`,
the engine's writer's check too), and room in the buffer (``live.max_buffered_docs``) are checked *before* any
work; then the documents are chunked and encoded *outside* the writer lock (the slow part runs in parallel and a
failure writes nothing), then, under the lock, the deadline is checked again, the batch written to the store
(durable on return) and appended to a new buffer state, which is then published: acknowledged means durable and
visible. A write whose deadline passed before the commit is not applied (DeadlineExceeded, nothing written).

Memory between rebuilds is bounded: an upsert that would push the buffered documents past
``live.max_buffered_docs`` is refused at once with Overloaded (RESOURCE_EXHAUSTED) and the background rebuild is
started; the buffer then holds at most that many live documents, and (dead rows awaiting a merge included) at most
about twice as many rows.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any, Protocol

import numpy as np

from index_builder.build.builder import BuildSummary, build_snapshot
from index_builder.build.encodings import Source, chunk_keys
from index_builder.build.workers import identity_of
from index_builder.documents.chunking import Chunker, chunk_passages
from index_builder.models.encoders import Embedder
from index_builder.models.token_encoders import EmbedderTokens, TokenEncoder
from index_builder.settings import ChunkConfig, EmbedderConfig, TokenEncoderConfig
from index_builder.snapshot.token_store import TokenStore
from index_builder.types import Document, Hits
from rerank.late_interaction import LateInteractionReranker, Reordering, head_scores, rerank_head
from retrieval.errors import InvalidRequest, Overloaded
from retrieval.live.buffer import BufferState, Encoded, build_postings
from retrieval.live.settings import LiveConfig  # noqa: F401  (re-exported: its section)
from retrieval.live.store import MAX_BATCH, DocumentPage, DocumentStore, WriteResult, check_deadline, validate_batch
from retrieval.search.aggregate import top_docs_from_chunk_scores
from retrieval.search.filters import Filter
from retrieval.search.index import IndexSettings, SearchIndex

log = logging.getLogger(__name__)

class _Concat(Sequence[Document]):
    """Two sequences seen as one, without copying (the snapshot's documents, then the buffer's)."""

    def __init__(self, a: Sequence[Document], b: Sequence[Document]) -> None:
        self.a, self.b = a, b

    def __len__(self) -> int:
        return len(self.a) + len(self.b)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        return self.a[i] if i < len(self.a) else self.b[i - len(self.a)]


def _merge_hits(base: Hits, buf: Hits, nb: int, nbc: int, k: int) -> Hits:
    """The top ``k`` of the snapshot's and the buffer's hits by score (ties: the snapshot's first, then each list's
    own order, as one ranking over the concatenated index space would have them)."""
    doc = np.concatenate([base.doc, buf.doc + nb])
    sc = np.concatenate([base.scores, buf.scores]).astype(np.float32)
    ch = np.concatenate([base.chunk, buf.chunk + nbc])
    order = np.argsort(-sc, kind="stable")[:k]
    return Hits(doc[order], sc[order], ch[order])


class LiveView:
    """One snapshot + one buffer state, with the interface the pipeline and the server read (see the module doc).

    Making one is O(1) in the buffer's and the snapshot's size; the arrays that combine both are computed when
    a query first reads them (pure, so two threads racing on one compute the same value)."""

    in_process = True  # in-memory searches (see SearchIndex.in_process)
    backend = "local snapshot"  # what serves it (GetIndexStatus.backend)

    def __init__(self, base: SearchIndex, state: BufferState, storage: str | None = None) -> None:
        self.base = base
        self.state = state
        self.snapshot = base.snapshot
        self.n_base_docs = len(base.documents)
        self.n_base_chunks = len(base.chunks)
        self.documents = _Concat(base.documents, state.docs)
        self.filters = _LiveFilters(self)
        self.bm25 = _LiveBM25(self)
        self.dense = _LiveDense(self) if base.dense is not None else None
        self.late = _LiveLate(self) if base.late is not None else None
        self.token_encoder = base.token_encoder

    @cached_property
    def chunk_doc(self) -> np.ndarray:
        if not self.state.n_chunks:
            return self.base.chunk_doc
        return np.concatenate([self.base.chunk_doc, self.state.chunk_doc + self.n_base_docs])

    @cached_property
    def starts(self) -> np.ndarray:
        if not self.state.n_docs:
            return self.base.starts
        return np.concatenate([self.base.starts, self.state.starts + self.n_base_chunks])

    @cached_property
    def base_visible(self) -> np.ndarray:
        """bool [n_snapshot_docs]: the snapshot's documents that no buffered write hides."""
        visible = np.ones(self.n_base_docs, dtype=bool)
        for seg in self.state.segments:
            visible[seg.base_rows(self.base)] = False
        return visible

    @cached_property
    def _base_visible_chunks(self) -> np.ndarray:
        return self.base_visible[self.base.chunk_doc]

    @cached_property
    def visible_masks(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(document mask, chunk mask) of everything this view serves; None when nothing is hidden."""
        st = self.state
        if not st.segments:
            return None
        return (np.concatenate([self.base_visible, st.live_mask]),
                np.concatenate([self._base_visible_chunks, st.live_mask[st.chunk_doc]]))

    @property
    def generation(self) -> int:
        return self.base.generation

    @property
    def dense_error(self) -> str | None:
        return self.base.dense_error

    @property
    def buffered(self) -> int:
        return self.state.live_docs

    def passage(self, chunk: int) -> str:
        if chunk < self.n_base_chunks:
            return self.base.passage(chunk)
        seg, _, row = self.state.locate_chunk(chunk - self.n_base_chunks)
        c = seg.chunks[row]
        return seg.docs[c["doc"]].text[c["start"]:c["end"]]

    def passage_with_title(self, chunk: int) -> str:
        if chunk < self.n_base_chunks:
            return self.base.passage_with_title(chunk)
        seg, _, row = self.state.locate_chunk(chunk - self.n_base_chunks)
        return chunk_passages(seg.docs, seg.chunks[row].reshape(1))[0]


class _LiveFilters:
    def __init__(self, view: LiveView) -> None:
        self.view = view

    def masks(self, f: Filter) -> tuple[np.ndarray, np.ndarray] | None:
        v = self.view
        base = v.base.filters.masks(f)
        if base is None:
            return v.visible_masks
        st = v.state
        if not st.segments:
            return base
        buf = st.filter_mask(f)
        return (np.concatenate([base[0] & v.base_visible, buf]),
                np.concatenate([base[1] & v._base_visible_chunks, buf[st.chunk_doc]]))


class _LiveBM25:
    def __init__(self, view: LiveView) -> None:
        self.view = view
        self.analyzer = view.base.bm25.analyzer

    def search(self, query: str, k: int, doc_mask: np.ndarray | None = None) -> Hits:
        v = self.view
        st = v.state
        if doc_mask is None and (m := v.visible_masks) is not None:
            doc_mask = m[0]
        nb = v.n_base_docs
        base = top_docs_from_chunk_scores(v.base.bm25.chunk_scores(query), v.base.starts, k,
                                          valid=None if doc_mask is None else doc_mask[:nb], min_score=0.0)
        if not st.n_chunks:
            return base
        stats = v.base.bm25_stats
        terms = self.analyzer(query)
        idf = {t: stats.idf(t) for t in set(terms)}
        scores = np.concatenate([s.bm25(terms, idf, stats) for s in st.segments])
        buf = top_docs_from_chunk_scores(scores, st.starts, k, valid=None if doc_mask is None else doc_mask[nb:],
                                         min_score=0.0)
        return _merge_hits(base, buf, nb, v.n_base_chunks, k)


class _LiveDense:
    def __init__(self, view: LiveView) -> None:
        self.view = view

    def search(self, query_vec: np.ndarray, k: int, doc_mask: np.ndarray | None = None,
               chunk_mask: np.ndarray | None = None, *, exact: bool = False) -> Hits:
        v = self.view
        st = v.state
        assert v.base.dense is not None
        nb, nbc = v.n_base_docs, v.n_base_chunks
        if doc_mask is None and (m := v.visible_masks) is not None:
            doc_mask, chunk_mask = m
        base = v.base.dense.search(query_vec, k, None if doc_mask is None else doc_mask[:nb],
                                   None if chunk_mask is None else chunk_mask[:nbc], exact=exact)
        if not st.n_chunks:
            return base
        q = np.asarray(query_vec, dtype=np.float32)
        scores = np.concatenate([s.vectors @ q for s in st.segments])
        buf = top_docs_from_chunk_scores(scores, st.starts, k, valid=None if doc_mask is None else doc_mask[nb:])
        return _merge_hits(base, buf, nb, nbc, k)


def buffer_sources(state: BufferState, identity: bytes) -> list[Source]:
    """The write buffer's segments as sources of encodings for a rebuild (keys made from their passages)."""
    out = []
    for i, seg in enumerate(state.segments):
        if not len(seg.chunks):
            continue
        keys = chunk_keys(identity, chunk_passages(seg.docs, seg.chunks))
        t = seg.tokens
        out.append(Source(f"buffer segment {i}", keys, seg.vectors, t.vectors, t.offsets, t.scales, t.storage))
    return out


def _segment_late(tokens: TokenStore) -> LateInteractionReranker:
    return LateInteractionReranker(tokens.vectors, tokens.offsets, tokens.scales, tokens.storage, tokens.groups,
                                   tokens.group_offsets)


class _LiveLate:
    def __init__(self, view: LiveView) -> None:
        self.view = view

    def token_sims(self, query_tokens: np.ndarray, chunk: int) -> np.ndarray | None:
        """Every stored token of ``chunk`` (the snapshot's or a buffered one) against every query token: float32
        [t, q] (the cross-encoder's windows)."""
        v = self.view
        late = v.base.late
        assert late is not None
        if chunk < v.n_base_chunks:
            return late.token_sims(query_tokens, chunk)
        st = v.state
        local = chunk - v.n_base_chunks
        offsets = np.asarray(st.chunk_offsets, np.int64)
        j = int(np.searchsorted(offsets, local, side="right") - 1)
        return _segment_late(st.segments[j].tokens).token_sims(query_tokens, int(local - offsets[j]))

    def rerank(self, query_tokens: np.ndarray, chunks: np.ndarray, top_k: int, weight: float = 1.0,
               score: str = "maxsim") -> Reordering:
        v = self.view
        late = v.base.late
        assert late is not None
        head = np.asarray(chunks[:top_k], dtype=np.int64)
        per_token = np.zeros((len(head), len(query_tokens)), dtype=np.float32)
        in_base = head < v.n_base_chunks
        if in_base.any():
            per_token[in_base] = late.token_maxsims(query_tokens, head[in_base])
        buffered = np.flatnonzero(~in_base)
        if len(buffered):
            st = v.state
            local = head[buffered] - v.n_base_chunks
            offsets = np.asarray(st.chunk_offsets, np.int64)
            seg_of = np.searchsorted(offsets, local, side="right") - 1
            for j in np.unique(seg_of).tolist():
                sel = seg_of == j
                per_token[buffered[sel]] = _segment_late(st.segments[j].tokens).token_maxsims(
                    query_tokens, local[sel] - offsets[j])
        return rerank_head(head_scores(per_token, score), len(chunks), weight)


class LiveSettings(IndexSettings, Protocol):
    """The configuration sections the live index reads (``retrieval.config.AppConfig`` has them): how written
    documents are chunked and encoded, the rebuild policy, and what a rebuilt snapshot is built and loaded with."""

    @property
    def chunking(self) -> ChunkConfig: ...

    @property
    def embedder(self) -> EmbedderConfig: ...

    @property
    def late_interaction(self) -> TokenEncoderConfig: ...

    @property
    def live(self) -> LiveConfig: ...


class LiveIndex:
    """Writes through the store into a new buffer state and view; ``on_publish`` callbacks get every new view
    (the pipeline sets its ``index`` to it)."""

    def __init__(self, base: SearchIndex, store: DocumentStore, embedder: Embedder, token_encoder: TokenEncoder,
                 config: LiveSettings) -> None:
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
        self._models_lock = threading.Lock()  # makes the rebuild encoder once
        self._listeners: list[Callable[[LiveView], None]] = []
        self._write_listeners: list[Callable[[list[str]], object]] = []
        self._rebuild_listeners: list[Callable[[float, bool], None]] = []
        self._first_buffered: float | None = None
        self._rebuild_embedder: Embedder | None = None
        self._full = False  # an upsert found the buffer full: rebuild now
        self._stop = threading.Event()
        self._kick = threading.Event()  # wakes the auto-rebuild loop
        self._auto: threading.Thread | None = None
        self.rebuilds: list[dict[str, float]] = []  # seconds and covered sequence number of each rebuild
        covered = int(base.snapshot.manifest.get("covered_seq", 0))
        self.view = LiveView(base, BufferState.empty(embedder.dim, covered, token_dim=int(token_encoder.dim),
                                                     storage=self.storage))
        self.replay()

    def on_publish(self, fn: Callable[[LiveView], None]) -> None:
        self._listeners.append(fn)
        fn(self.view)

    def on_write(self, fn: Callable[[list[str]], object]) -> None:
        """``fn(ids)`` after every acknowledged write, once its view is published (the semantic cache invalidates)."""
        self._write_listeners.append(fn)

    def on_rebuild(self, fn: Callable[[float, bool], None]) -> None:
        """``fn(seconds, ok)`` after every rebuild attempt (the rebuild-duration metric)."""
        self._rebuild_listeners.append(fn)

    def _written(self, ids: list[str]) -> None:
        for fn in self._write_listeners:
            fn(ids)

    def _publish(self, state: BufferState) -> None:
        if state.segments:
            self._first_buffered = self._first_buffered or time.monotonic()
        else:
            self._first_buffered = None
        self.view = LiveView(self.base, state)
        for fn in self._listeners:
            fn(self.view)

    def encode(self, docs: Sequence[Document], *, embedder: Embedder | None = None,
               token_encoder: TokenEncoder | None = None) -> Encoded:
        """Chunk and encode documents into a segment's contents (default: the writes' encoder,
        :meth:`_write_models`)."""
        if embedder is None or token_encoder is None:
            embedder, token_encoder = self._write_models()
        chunks = self.chunker.chunk(list(docs))
        passages = chunk_passages(docs, chunks)
        same_pass = isinstance(token_encoder, EmbedderTokens)
        enc = embedder.encode(passages, with_tokens=same_pass)
        tokens = enc.token_vectors if same_pass else token_encoder.encode_documents(passages)
        assert tokens is not None
        store = TokenStore.from_lists(tokens, int(token_encoder.dim), self.storage)  # once, for the segment's life
        postings, lengths = build_postings(self.base.bm25.analyzer.batch(passages))
        return Encoded(tuple(docs), chunks, enc.embeddings, store, postings, lengths)

    def replay(self) -> int:
        """Apply the store's writes newer than what is served (start-up); returns how many were applied.
        Encodes with the serving encoder (nothing is being served yet) and is not held to ``max_buffered_docs``
        (acknowledged writes must be served); a buffer past it asks for a rebuild at once."""
        with self._lock:
            state = self._apply(self.view.state, self.store.changes_since(self.view.state.seq))
            applied = state.seq - self.view.state.seq
            if applied:
                self._publish(state)
            if state.live_docs >= self.config.live.max_buffered_docs:
                self._full = True
        if applied:
            log.info("replayed the writes up to sequence %d (%d documents buffered)", state.seq, state.live_docs)
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
            enc = self.encode([c.document for c in upserts], embedder=self.embedder, token_encoder=self.token_encoder)
            state = state.plus(enc, [c.seq for c in upserts])
        return state.with_seq(changes[-1].seq)

    def _check_room(self, state: BufferState, docs: Sequence[Document]) -> None:
        limit = self.config.live.max_buffered_docs
        if state.live_docs + state.growth(d.id for d in docs) > limit:
            self._full = True
            self._kick.set()
            raise Overloaded(f"write buffer full: {state.live_docs} documents buffered (max {limit}); a rebuild is "
                             "under way, retry later")

    def upsert(self, documents: Sequence[Document | Mapping[str, Any]], *, tenant: str | None = None,
               deadline: float | None = None) -> WriteResult:
        """Write documents (all or nothing); returns once they are durable and searchable. ``deadline``: absolute
        ``time.monotonic()`` seconds; when it passes before the commit, nothing is written (DeadlineExceeded).

        Checked before any work: the batch size, its bytes, the deadline, each document, and room in the buffer
        (Overloaded when ``live.max_buffered_docs`` would be passed)."""
        docs = validate_batch(documents, deadline)
        self._check_room(self.view.state, docs)
        encoded = self.encode(docs)  # slow part first, outside the lock; failure writes nothing
        with self._lock:
            check_deadline(deadline, "before the commit")
            state = self.view.state
            self._check_room(state, docs)  # concurrent writers may have filled it meanwhile
            result = self.store.upsert(docs, tenant=tenant)  # durable when this returns
            seqs = list(range(result.seq - len(docs) + 1, result.seq + 1))  # one per document, in order
            self._publish(state.plus(encoded, seqs))
            self._written([d.id for d in docs])
        return result

    def delete(self, ids: Sequence[str], *, tenant: str | None = None, deadline: float | None = None) -> WriteResult:
        """Delete the ids that exist (with ``tenant``: that are its); ``deadline`` as for :meth:`upsert`."""
        if len(ids) > MAX_BATCH:
            raise InvalidRequest(f"{len(ids)} ids in one delete; at most {MAX_BATCH} are allowed")
        check_deadline(deadline, "before it started")
        with self._lock:
            check_deadline(deadline, "before the commit")
            result = self.store.delete(ids, tenant=tenant)
            if result.count:  # the store numbers the deleted ids in order; read them back to tombstone exactly
                changes = [c for c in self.store.changes_since(result.seq - result.count) if c.op == "delete"]
                self._publish(self.view.state.minus({c.id: c.seq for c in changes}))
                self._written([c.id for c in changes])
        return result

    def list_documents(self, *, tenant: str | None = None, filters: Mapping[str, str] | None = None,
                       after: str = "", limit: int = MAX_BATCH) -> DocumentPage:
        """The store's documents, a page at a time (:meth:`retrieval.live.store.DocumentStore.list_page`: on a read
        connection, bounded per page)."""
        return self.store.list_page(tenant=tenant, filters=filters, after=after, limit=limit)

    # ------------------------------------------------------------------ rebuild and swap

    def rebuild(self, *, only_if_due: bool = False) -> BuildSummary | None:
        """Build a new snapshot from the store (no lock held: writes and queries go on), then swap it in: the
        buffer keeps only the writes the new snapshot does not cover. Returns None, building nothing, when the
        store is empty or the served snapshot already covers every write (a rebuild that waited for another one
        finds its work done); with ``only_if_due``, also when :meth:`rebuild_due` no longer holds once it has the
        rebuild lock (the background loop).

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
                out.append(self._rebuild_now(only_if_due=only_if_due))
            except BaseException as e:  # noqa: BLE001  (re-raised in the caller)
                errors.append(e)

        t0 = time.perf_counter()
        t = threading.Thread(target=work, name="hybridrag-rebuild-work")
        t.start()
        t.join()
        if not (out and out[0] is None):  # nothing to build: not a rebuild
            for fn in self._rebuild_listeners:
                fn(time.perf_counter() - t0, not errors)
        if errors:
            raise errors[0]
        return out[0]

    def _rebuild_now(self, *, only_if_due: bool = False) -> BuildSummary | None:
        with self._rebuild_lock:
            # Re-checked under the lock: a rebuild that waited for another one must not build the same snapshot.
            if only_if_due and not self.rebuild_due():
                return None
            covered = int(self.base.snapshot.manifest.get("covered_seq", 0))
            if self.store.last_seq() <= covered and not self.view.state.segments:
                self._full = False
                return None
            t0 = time.perf_counter()
            seq, docs = self.store.snapshot()
            if not docs:
                return None
            root = self.base.snapshot.path.parent.parent
            embedder, token_encoder = self._rebuild_models()
            # Nothing is embedded again: the snapshot's chunks are found in it by key (build_snapshot reads it
            # itself), and every buffered write was embedded when it arrived (its segments are given here).
            build = self.config.build_config()
            # the base's token storage, which the write buffer shares (a change of [late_interaction] storage
            # takes effect with an offline build: hybridrag build / index rebuild)
            build = replace(build, token_encoder=replace(build.token_encoder, storage=self.storage))
            identity = identity_of(embedder, token_encoder if build.token_vectors else None)
            summary = build_snapshot(docs, root, build, embedder, covered_seq=seq, token_encoder=token_encoder,
                                     reuse=buffer_sources(self.view.state, identity), total=len(docs))
            new_base = SearchIndex.load(root, self.config, self.embedder)
            with self._lock:
                self.base = new_base
                self._publish(self.view.state.after(seq))
                self._full = False
            seconds = time.perf_counter() - t0
            self.rebuilds.append({"seconds": seconds, "covered_seq": float(seq), "documents": float(len(docs))})
            log.info("rebuilt generation %d from the store (sequence %d, %d documents) in %.1f s; %d writes stay "
                     "buffered", new_base.generation, seq, len(docs), seconds, self.view.state.live_docs)
            return summary

    def _rebuild_models(self) -> tuple[Embedder, TokenEncoder]:
        """The rebuild's encoder: the same model with ``live.rebuild_threads`` ONNX threads (its own session, so
        a rebuild cannot take every core from the queries being served)."""
        threads = self.config.live.rebuild_threads
        if not threads:
            return self.embedder, self.token_encoder
        with self._models_lock:
            if self._rebuild_embedder is None:
                cfg = self.config.embedder
                # No CPU arena: it would keep the largest rebuild batch's activations (hundreds of MB) between
                # rebuilds; measured in docs/results/hardening.md.
                runtime = replace(cfg.runtime, intra_op_threads=threads, cpu_mem_arena=False)
                self._rebuild_embedder = Embedder(replace(cfg, runtime=runtime), files=self.embedder.files)
        tokens = EmbedderTokens(self._rebuild_embedder) if isinstance(self.token_encoder, EmbedderTokens) \
            else self.token_encoder
        return self._rebuild_embedder, tokens

    def _write_models(self) -> tuple[Embedder, TokenEncoder]:
        """The writes' encoder: the rebuild's (``live.rebuild_threads`` ONNX threads) when that is set, so a flood
        of writes cannot take every core from the queries either; else the serving one."""
        return self._rebuild_models()

    def rebuild_due(self) -> bool:
        lc = self.config.live
        state = self.view.state
        if self._full:
            return True
        if not state.pending:
            return False
        if lc.rebuild_after_writes and state.pending >= lc.rebuild_after_writes:
            return True
        age = 0.0 if self._first_buffered is None else time.monotonic() - self._first_buffered
        return bool(lc.rebuild_after_s) and age >= lc.rebuild_after_s

    def start_auto_rebuild(self) -> None:
        """A background thread that rebuilds when the buffer is large, old or full enough (``[live]`` config)."""
        def loop() -> None:
            while not self._stop.is_set():
                self._kick.wait(self.config.live.check_interval_s)
                self._kick.clear()
                if self._stop.is_set():
                    break
                try:
                    if self.rebuild_due():
                        self.rebuild(only_if_due=True)
                except Exception:  # a failed rebuild must not stop serving: the buffer still answers
                    log.exception("background rebuild failed; serving the previous generation and the buffer")
        self._auto = threading.Thread(target=loop, name="hybridrag-rebuild", daemon=True)
        self._auto.start()

    def close(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._auto is not None:
            self._auto.join()
