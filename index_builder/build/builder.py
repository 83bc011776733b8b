"""Turn documents into a snapshot: chunk, analyse + index BM25, embed, build HNSW, keep token vectors, write.

Used by ``hybridrag build`` (offline) and by the live index's background rebuilds alike.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from index_builder.build.assemble import assemble_snapshot
from index_builder.build.encodings import KEY, BuildWork, Source, Sources, chunk_keys, encoder_identity
from index_builder.build.workers import BuildWorkers, LocalWorkers, Preparer, checkpoint, identity_of
from index_builder.documents.chunking import chunk_passages
from index_builder.errors import SnapshotError
from index_builder.models.encoders import Embedder
from index_builder.models.token_encoders import TokenEncoder, make_token_encoder
from index_builder.settings import (  # noqa: F401  (BM25Config, HNSWConfig re-exported)
    STORAGES,
    AnalyzerConfig,
    BM25Config,
    BuildConfig,
    ChunkConfig,
    HNSWConfig,
)
from index_builder.snapshot.bm25_files import SPILL_FOLDER, BM25Builder
from index_builder.snapshot.format import LoadedSnapshot, SnapshotParts, SnapshotWriter, load_snapshot, write_snapshot
from index_builder.snapshot.manifest import token_settings
from index_builder.snapshot.token_store import TokenStore
from index_builder.types import Document

log = logging.getLogger(__name__)


@dataclass
class BuildSummary:
    path: Path
    documents: int
    chunks: int
    token_vectors: int
    seconds: float
    bytes_on_disk: int
    timings: dict[str, float]
    embedded: int = -1  # distinct passages embedded by this build (-1: not counted)
    reused: int = -1  # chunks whose encodings came from a source (the previous snapshot, the buffer, a checkpoint)
    # the process's anonymous memory (MiB) as each step of the assembly ends (Linux; empty elsewhere): what the
    # build holds once the batches are done, without the models' passing peaks
    memory_mib: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        counted = f", {self.embedded} passages embedded, {self.reused} chunks reused" if self.embedded >= 0 else ""
        return (f"built {self.path}: {self.documents} documents, {self.chunks} chunks, "
                f"{self.token_vectors} token vectors, {self.seconds:.1f} s, {self.bytes_on_disk / 2**20:.1f} MiB"
                f"{counted}")


DOC_BATCH = 512  # documents read, chunked and analysed at a time


def snapshot_source(snap: LoadedSnapshot, identity: bytes) -> Source | None:
    """The encodings of an existing snapshot as a source (None when it has none usable): its ``chunk_keys.npy``
    when they were made under ``identity``, else (a snapshot written before chunk keys existed, or whose keys were
    made under another rule) keys made now from its documents and chunks, if its models are ours."""
    if snap.vectors is None:
        return None
    models = snap.manifest.get("models", {})
    tokens = models.get("token_encoder")
    keys = snap.chunk_keys
    if keys is None or snap.manifest.get("chunk_keys", {}).get("identity") != identity.hex():
        embedder = {k: v for k, v in (models.get("embedder") or {}).items() if k != "providers"}
        described = None if tokens is None else {k: v for k, v in tokens.items() if k != "dtype"}
        if encoder_identity(embedder, described) != identity and encoder_identity(embedder, None) != identity:
            return None
        keys = chunk_keys(identity, chunk_passages(snap.documents, snap.chunks))
    has_tokens = snap.token_vectors is not None and snap.token_offsets is not None
    return Source(f"snapshot {snap.path.name}", np.asarray(keys), snap.vectors, snap.token_vectors,
                  None if snap.token_offsets is None else np.asarray(snap.token_offsets), snap.token_scales,
                  storage=str((tokens or {}).get("dtype", "int8")) if has_tokens else "",
                  token_groups=snap.token_groups, token_group_offsets=snap.token_group_offsets)


def _current_source(root: Path, identity: bytes) -> Source | None:
    """The snapshot ``root/CURRENT`` points at, as a source of encodings: what a rebuild must not embed again.
    Its files are checked by size, not checksum (the rows are read as they are needed)."""
    if not (Path(root) / "CURRENT").is_file():
        return None
    try:
        snap = load_snapshot(Path(root), checksums=False, dense_index=False)  # its rows, not its graph
    except Exception as e:  # noqa: BLE001 -- an unreadable previous snapshot only means embedding everything
        log.warning("the current snapshot of %s cannot be reused (%s): every chunk is embedded", root, e)
        return None
    return snapshot_source(snap, identity)


class _BuildLock:
    """One build at a time into an index root (a ``flock`` the kernel drops with the process, kill -9 included)."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / ".build.lock"

    def __enter__(self) -> _BuildLock:
        import fcntl

        self.f = open(self.path, "a+")
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.f.close()
            raise SnapshotError(f"another build is writing {self.path.parent} (it holds {self.path})") from None
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


class _Progress:
    """Passages chunked and embedded, with passages/s and an ETA when the corpus size is known."""

    def __init__(self, total_docs: int | None, enabled: bool) -> None:
        self.bar = tqdm(total=total_docs, desc="building", unit="doc", disable=not enabled, leave=False,
                        smoothing=0.05)
        self.t0, self.embedded, self.reused = time.perf_counter(), 0, 0

    def update(self, docs: int, embedded: int = 0, reused: int = 0) -> None:
        self.embedded += embedded
        self.reused += reused
        rate = self.embedded / max(time.perf_counter() - self.t0, 1e-9)
        self.bar.set_postfix_str(f"{rate:.0f} passages/s embedded, {self.embedded} embedded, {self.reused} reused",
                                 refresh=False)
        self.bar.update(docs)

    def close(self) -> None:
        self.bar.close()


def build_snapshot(docs: Iterable[Document], root: Path, config: BuildConfig, embedder: Embedder | None = None,
                   *, progress: bool = False, covered_seq: int = 0, token_encoder: TokenEncoder | None = None,
                   reuse: Sequence[Source] = (), total: int | None = None, cluster: str | None = None) -> BuildSummary:
    """Build and write a new snapshot generation under ``root``; ``CURRENT`` points at it when this returns.

    A stream: documents are read, chunked, analysed and written as they come; only the chunks no source holds are
    embedded (:mod:`index_builder.build.encodings`: the snapshot ``CURRENT`` points at, the ``reuse`` sources such as
    the live index's write buffer, and the segments a killed build left in ``root/.build-work``), a batch at a
    time, each batch written to disk before the next (a checkpoint: a killed build resumes there, and the resumed
    snapshot equals an uninterrupted one); the snapshot's arrays are then filled from those sources block by block.
    Memory: the batches, plus what the index structures need per passage (BM25 postings, the HNSW graph, 28 bytes
    of chunk records and keys). ``total``: the number of documents, for the progress bar's ETA.

    Token vectors come from ``token_encoder`` (default: made from ``config.token_encoder``); when that is the
    embedder's own, they come out of the embedding pass itself.

    ``cluster``: a Ray cluster's address (``local`` starts one, ``auto`` joins the one this machine runs): the
    batches are chunked and analysed in Ray tasks and encoded by an actor pool that writes the checkpoint segments
    itself (:mod:`index_builder.build.ray_build`); the snapshot is assembled from them here, as from a local build's.
    """
    t0 = time.perf_counter()
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SnapshotError(f"cannot write an index under {root}: {e.strerror or e}") from None
    if not os.access(root, os.W_OK):
        raise SnapshotError(f"cannot write an index under {root}: permission denied")
    embedder = embedder or Embedder(config.embedder)
    if config.token_vectors and token_encoder is None:
        token_encoder = make_token_encoder(config.token_encoder, embedder)
    if not config.token_vectors:
        token_encoder = None
    storage = config.token_encoder.storage
    identity = identity_of(embedder, token_encoder)
    with _BuildLock(root):
        found = list(reuse) if config.reuse else []
        if config.reuse and (current := _current_source(root, identity)) is not None:
            found.append(current)
        stamp = identity + storage.encode()  # checkpoints hold tokens in this build's storage
        work = BuildWork(root / ".build-work", stamp)
        if not config.reuse:
            work.remove()  # a killed build's checkpoints are encodings too
            work = BuildWork(root / ".build-work", stamp)
        for seg in work.sources():
            seg.storage = storage
            found.append(seg)
        sources = _usable(found, storage if token_encoder is not None else None)
        writer = SnapshotWriter(root)
        try:
            summary = _build(docs, writer, config, embedder, token_encoder, identity, sources, work, progress,
                             covered_seq, total, t0, cluster)
        except BaseException:
            writer.abort()
            raise
        work.remove()  # the snapshot holds everything now
        return summary


def _build(docs: Iterable[Document], writer: SnapshotWriter, config: BuildConfig, embedder: Embedder,
           token_encoder: TokenEncoder | None, identity: bytes, sources: Sources, work: BuildWork, progress: bool,
           covered_seq: int, total: int | None, t0: float, cluster: str | None = None) -> BuildSummary:
    timings = {"chunk": 0.0, "bm25": 0.0, "embed": 0.0}
    storage = config.token_encoder.storage
    preparer = Preparer(embedder.files.tokenizer_path, config.chunking, config.analyzer, identity)
    bm25 = BM25Builder(spill=writer.tmp / SPILL_FOLDER)  # postings on disk as they come (bounded memory)
    _warn_if_chunks_exceed_window(config, embedder)
    workers = _workers(cluster, config, preparer, embedder, token_encoder, identity, work)
    chunk_parts: list[np.ndarray] = []
    key_parts: list[np.ndarray] = []
    bar = _Progress(total, progress)
    embeds = _EmbedQueue(workers, sources, bar, timings)
    n_docs = 0
    try:
        for batch, prep in workers.prepared(_batches(docs, DOC_BATCH)):
            t = time.perf_counter()
            writer.write_documents(batch)
            chunks, passages, keys = np.array(prep.chunks), prep.passages, prep.keys  # Ray's arrays are read-only
            chunks["doc"] += n_docs
            timings["chunk"] += time.perf_counter() - t + prep.chunk_s
            t = time.perf_counter()
            try:
                bm25.add(prep.terms)  # its postings appended to the spill folder
            except OSError as e:
                raise writer.failed(SPILL_FOLDER, e) from None
            timings["bm25"] += time.perf_counter() - t + prep.analyse_s
            chunk_parts.append(chunks)
            key_parts.append(keys)
            found, _ = sources.find(keys)
            reused = embeds.offer(keys, passages, found)
            n_docs += len(batch)
            bar.update(len(batch), reused=reused)
            embeds.send_full(config.embed_batch)
        embeds.finish()
    finally:
        workers.close()
    bar.close()
    if isinstance(workers, LocalWorkers):
        timings["embed"] = workers.encode_s
    if not n_docs:
        raise ValueError("cannot build an index from zero documents")
    chunks = np.concatenate(chunk_parts)
    keys = np.concatenate(key_parts)
    del chunk_parts, key_parts
    if token_encoder is not None:
        t = time.perf_counter()
        if restored := _restore(keys, sources, work, storage, token_encoder.dim, config.embed_batch):
            timings["restore"] = time.perf_counter() - t
            log.info("re-stored the token vectors of %d chunks in %s (no model call)", restored, storage)
    done = assemble_snapshot(writer, chunks, keys, n_docs, sources, bm25, config, embedder, token_encoder,
                             covered_seq, timings, identity)
    size = _bytes_on_disk(done.path)
    return BuildSummary(done.path, n_docs, len(chunks), done.token_vectors, time.perf_counter() - t0, size, timings,
                        embedded=bar.embedded, reused=bar.reused, memory_mib=done.memory_mib)


def _warn_if_chunks_exceed_window(config: BuildConfig, embedder: Embedder) -> None:
    window = embedder.config.max_length - 2  # [CLS] and [SEP]
    if config.chunking.max_tokens > window:
        log.warning("chunks of up to %d word pieces exceed the embedder's window (%d): dense and token vectors see "
                    "only each chunk's first %d pieces; late interaction over such vectors lost to the fused list "
                    "(SciFact test, 480-piece chunks at max_length 128: 0.6960 against 0.7162). Set [chunking] "
                    "max_tokens <= %d (room for the title) for the full passage", config.chunking.max_tokens,
                    window + 2, window, window + 2 - 32)


def _workers(cluster: str | None, config: BuildConfig, preparer: Preparer, embedder: Embedder,
             token_encoder: TokenEncoder | None, identity: bytes, work: BuildWork) -> BuildWorkers:
    """This process's workers, or a Ray cluster's when ``cluster`` names one."""
    if cluster is None:
        return LocalWorkers(preparer, embedder, token_encoder, config.token_encoder.storage, work)
    from index_builder.build.ray_build import RayWorkers  # Ray is imported only by a build that asks for it

    return RayWorkers(cluster, config, preparer, identity, work, embedder.dim)


class _EmbedQueue:
    """The passages no source holds, each distinct one embedded once, sent to the workers a checkpoint at a time;
    each segment that comes back becomes the first source (a killed build resumes from it)."""

    def __init__(self, workers: BuildWorkers, sources: Sources, bar: _Progress, timings: dict[str, float]) -> None:
        self.workers, self.sources, self.bar, self.timings = workers, sources, bar, timings
        self.queued: dict[bytes, str] = {}  # key -> passage: to embed (each distinct passage once)
        self.in_flight: set[bytes] = set()  # keys submitted whose segment has not come back yet

    def offer(self, keys: np.ndarray, passages: Sequence[str], found: np.ndarray) -> int:
        """Queue the chunks no source holds (``found`` < 0); returns how many chunks are reused."""
        reused = int((found >= 0).sum())
        for i in np.flatnonzero(found < 0).tolist():
            k = bytes(keys[i])
            if k in self.in_flight:  # being encoded (a local build would have found it in a checkpoint)
                reused += 1
            else:
                self.queued.setdefault(k, passages[i])
        return reused

    def send_full(self, size: int) -> None:
        """Submit the queue a checkpoint of ``size`` passages at a time (Embedder.encode sorts each by length)."""
        while len(self.queued) >= size:
            take = dict(itertools.islice(self.queued.items(), size))
            for k in take:
                del self.queued[k]
            self.submit(take)

    def finish(self) -> None:
        """Submit what is left and wait for every segment."""
        if self.queued:
            self.submit(self.queued)
        self.collect(wait=True)

    def collect(self, wait: bool = False) -> None:
        t = time.perf_counter()
        for keys, seg in self.workers.finished(wait):
            self.sources.sources.insert(0, seg)
            self.in_flight.difference_update(bytes(k) for k in keys)
            self.bar.update(0, embedded=len(keys))
        self.timings["embed"] += time.perf_counter() - t

    def submit(self, pending: dict[bytes, str]) -> None:
        t = time.perf_counter()
        self.in_flight.update(pending)
        self.workers.submit(np.array(list(pending), dtype=KEY), list(pending.values()))
        self.timings["embed"] += time.perf_counter() - t
        self.collect()


def _usable(found: Sequence[Source], storage: str | None) -> Sources:
    """The sources a build may take encodings from, those holding tokens in its ``storage`` first: a source in
    another form serves only if its vectors can be re-stored (float16, int8: :func:`_restore`); a compact store
    cannot be turned into another one, so its chunks are embedded again. ``storage`` None: no token vectors."""
    if storage is None:
        return Sources(found)
    same = [s for s in found if s.storage == storage]
    other = [s for s in found if s.storage != storage and s.storage in STORAGES]
    for s in found:
        if s.storage != storage and s.storage not in STORAGES:
            log.warning("%s stores token vectors as %s, which cannot be re-stored as %s: its chunks are embedded "
                        "again", s.name, s.storage, storage)
    return Sources(same + other)


def _restore(keys: np.ndarray, sources: Sources, work: BuildWork, storage: str, dim: int, batch: int) -> int:
    """Re-store, in this build's ``storage``, the token vectors of the chunks whose only source keeps them in
    another form (an int8 snapshot built before the storage changed): decoded per chunk, coded a batch at a time
    into checkpoints, no model call. Returns the number of chunks re-stored."""
    unique = np.unique(keys)
    src, row = sources.find(unique)
    other = np.flatnonzero([sources.sources[s].storage != storage for s in src.tolist()])
    for a in range(0, len(other), batch):
        sel = other[a:a + batch]
        per_passage, vectors = [], []
        for i in sel.tolist():
            s = sources.sources[int(src[i])]
            assert s.token_vectors is not None and s.token_offsets is not None
            plain = TokenStore(s.token_vectors, s.token_offsets, s.token_scales, s.storage)
            per_passage.append(plain.floats(int(row[i])))
            vectors.append(np.asarray(s.vectors[int(row[i])], dtype=np.float32))
        store = TokenStore.from_lists(per_passage, dim, storage)
        sources.sources.insert(0, checkpoint(work, unique[sel], np.stack(vectors), store, storage))
    return len(other)


def _batches(docs: Iterable[Document], n: int) -> Iterator[list[Document]]:
    it = iter(docs)
    while batch := list(itertools.islice(it, n)):
        yield batch


def rebuild_token_vectors(root: Path, token_encoder: TokenEncoder | None, storage: str, *, out: Path | None = None,
                          keep_snapshots: int = 0, progress: bool = False) -> BuildSummary:
    """Write a new generation equal to ``root``'s current snapshot but for its token vectors, recomputed with
    ``token_encoder`` (a new late-interaction model or another storage) without re-embedding the dense side.

    ``token_encoder=None`` re-stores the snapshot's own token vectors in ``storage`` (e.g. fp16 -> int8) with no
    model call."""
    t0 = time.perf_counter()
    snap = load_snapshot(Path(root))
    if snap.vectors is None or snap.hnsw is None:
        raise ValueError(f"snapshot {snap.path} has no usable dense index ({snap.dense_error}): rebuild it fully")
    m = snap.manifest
    t = time.perf_counter()
    if token_encoder is not None:
        per_passage = token_encoder.encode_documents(chunk_passages(snap.documents, snap.chunks), progress=progress)
        dim, tokens = token_encoder.dim, token_settings(token_encoder, storage)
    else:
        if snap.token_vectors is None or snap.token_offsets is None or not m["models"].get("token_encoder"):
            raise ValueError(f"snapshot {snap.path} has no token vectors to re-store; give a token encoder")
        if (have := m["models"]["token_encoder"].get("dtype", "int8")) not in STORAGES:
            raise ValueError(f"snapshot {snap.path} stores its token vectors as {have}, which cannot be re-stored "
                             f"in another form; give a token encoder (the model computes them again)")
        flat = np.asarray(snap.token_vectors, dtype=np.float32)
        if snap.token_scales is not None:
            flat = flat * snap.token_scales[:, None]
        off = snap.token_offsets
        per_passage = [flat[off[i]:off[i + 1]] for i in range(len(off) - 1)]
        dim, tokens = flat.shape[1], {**m["models"]["token_encoder"], "dtype": storage}
    store = TokenStore.from_lists(per_passage, dim, storage)
    encode_s = time.perf_counter() - t
    settings: dict[str, Any] = {k: m[k] for k in ("analyzer", "bm25", "hnsw", "chunking", "dense") if k in m}
    settings["models"] = {**m["models"], "token_encoder": tokens}
    t = time.perf_counter()
    parts = SnapshotParts(snap.documents, snap.chunks, snap.bm25, np.asarray(snap.vectors), snap.hnsw,
                          store.vectors, store.offsets, settings, int(m.get("covered_seq", 0)), store.scales)
    path = write_snapshot(Path(out or root), parts, keep_last=keep_snapshots)
    size = _bytes_on_disk(path)
    return BuildSummary(path, len(snap.documents), len(snap.chunks), len(store.vectors), time.perf_counter() - t0,
                        size, {"token_vectors": encode_s, "write": time.perf_counter() - t})


def _bytes_on_disk(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
