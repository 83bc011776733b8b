"""The live index's writer: durable writes that the next query sees, over an immutable snapshot generation, and
the background rebuild that folds them into a new one and swaps it in.

What a request reads is a :class:`~retrieval.live.view.LiveView` (a snapshot plus one immutable write-buffer state);
:class:`LiveIndex` makes a new buffer state and a new view at each write and publishes it (the pipeline swaps its
``index`` reference to it), and rebuilds (:meth:`LiveIndex.rebuild`).

The write buffer is **segmented** (:mod:`retrieval.live.buffer`, a log-structured merge of write batches): a
write appends one segment and marks the rows it supersedes, O(size of the write + number of segments) whatever
is buffered, and the existing segments (and their arrays) are shared by the old and the new state.

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
from typing import Any, Protocol

from index_builder.build.builder import BuildSummary, build_snapshot
from index_builder.build.encodings import Source, chunk_keys
from index_builder.build.workers import identity_of
from index_builder.documents.chunking import Chunker, chunk_passages
from index_builder.models.encoders import Embedder
from index_builder.models.token_encoders import EmbedderTokens, TokenEncoder
from index_builder.settings import ChunkConfig, EmbedderConfig, TokenEncoderConfig
from index_builder.snapshot.token_store import TokenStore
from index_builder.types import Document
from retrieval.errors import InvalidRequest, Overloaded
from retrieval.live.buffer import BufferState, Encoded, build_postings
from retrieval.live.settings import LiveConfig  # noqa: F401  (re-exported: its section)
from retrieval.live.store import MAX_BATCH, DocumentPage, DocumentStore, WriteResult, check_deadline, validate_batch
from retrieval.live.view import LiveView
from retrieval.search.index import IndexSettings, SearchIndex

log = logging.getLogger(__name__)


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
