"""A build's last step: the snapshot's arrays filled from the encodings' sources in chunk order, the dense index,
BM25 and the manifest written (:func:`assemble_snapshot`, called by :mod:`index_builder.build.builder`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from index_builder.build.encodings import Source, Sources
from index_builder.errors import SnapshotError
from index_builder.models.encoders import Embedder
from index_builder.models.token_encoders import TokenEncoder
from index_builder.settings import BuildConfig
from index_builder.snapshot import dense_index
from index_builder.snapshot.bm25_files import BM25Builder
from index_builder.snapshot.format import SnapshotWriter
from index_builder.snapshot.manifest import index_settings, with_avgdl
from index_builder.snapshot.row_file import release_pages

COPY_BLOCK = 16_384  # chunks copied at a time into the snapshot's arrays


@dataclass
class Assembled:
    path: Path  # the snapshot written (``CURRENT`` points at it)
    token_vectors: int
    memory_mib: dict[str, float]  # anonymous memory (MiB) as each step ended (Linux; empty elsewhere)


def _anon_mib() -> float | None:
    """This process's anonymous resident memory in MiB (``RssAnon``), None where /proc does not say."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def assemble_snapshot(writer: SnapshotWriter, chunks: np.ndarray, keys: np.ndarray, n_docs: int, sources: Sources,
                      bm25: BM25Builder, config: BuildConfig, embedder: Embedder, token_encoder: TokenEncoder | None,
                      covered_seq: int, timings: dict[str, float], identity: bytes) -> Assembled:
    """Fill the snapshot's arrays from the sources, in chunk order, a block at a time; the HNSW graph as the dense
    rows arrive; BM25 scored; the manifest last. ``timings`` gets each step's seconds."""
    n = len(chunks)
    src, row = sources.find(keys)
    if (src < 0).any():
        raise SnapshotError(f"{int((src < 0).sum())} chunks have no encodings after the build (a bug)")
    t = time.perf_counter()
    writer.save_array("chunks.npy", chunks)
    writer.save_array("chunk_keys.npy", keys)
    vectors = writer.open_array("vectors.npy", np.float32, (n, embedder.dim))
    for a in range(0, n, COPY_BLOCK):
        b = min(n, a + COPY_BLOCK)
        for s in np.unique(src[a:b]).tolist():
            sel = np.flatnonzero(src[a:b] == s)
            rows = row[a:b][sel]
            order = np.argsort(rows, kind="stable")  # read the source's rows in file order
            block = np.asarray(sources.sources[s].vectors[rows[order]])
            vectors[a + sel[order]] = block
            release_pages(sources.sources[s].vectors)
        release_pages(vectors)
    writer.flush_array("vectors.npy", vectors)
    counts = {"documents": n_docs, "chunks": n, "token_vectors": 0}
    if token_encoder is not None:
        counts["token_vectors"] = _assemble_tokens(writer, src, row, sources)
    timings["copy"] = time.perf_counter() - t
    memory: dict[str, float] = {}

    def mark(step: str) -> None:
        if (mib := _anon_mib()) is not None:
            memory[step] = round(mib, 1)

    mark("copy")
    t = time.perf_counter()
    kind = dense_index.choose(config.dense_index, n)
    index = dense_index.make(kind, embedder.dim, n, config.hnsw)
    dense_index.train(index, vectors)
    for a in range(0, n, COPY_BLOCK):
        index.add(np.ascontiguousarray(vectors[a:min(n, a + COPY_BLOCK)]))
        release_pages(vectors)
    del vectors
    timings["hnsw"] = time.perf_counter() - t
    mark("dense_index")
    t = time.perf_counter()
    writer.save_index(dense_index.FILES[kind], index)
    dense: dict[str, Any] = {"index": kind, "file": dense_index.FILES[kind]}
    if isinstance(index, faiss.IndexIVF):
        dense["nlist"] = int(index.nlist)
    del index
    avgdl = bm25.avgdl()
    writer.write_bm25(bm25, config.bm25.k1, config.bm25.b)
    mark("bm25")
    settings = {**with_avgdl(index_settings(config, embedder, token_encoder), avgdl), "dense": dense,
                "chunk_keys": {"identity": identity.hex()}}
    path = writer.finish(counts=counts, dim=embedder.dim, settings=settings, covered_seq=covered_seq,
                         keep_last=config.keep_snapshots)
    timings["write"] = time.perf_counter() - t
    return Assembled(path, counts["token_vectors"], memory)


def _assemble_tokens(writer: SnapshotWriter, src: np.ndarray, row: np.ndarray, sources: Sources) -> int:
    """The token store in chunk order (offsets, vectors, scales), copied from the sources; returns the count. A
    pooled store's groups (each original token's pooled row) come too when every source keeps them (a source from
    before they were stored has none: the snapshot then has none, and its highlights and the cross-encoder's
    windows encode the passage again)."""
    total = _copy_ragged(writer, src, row, sources, "token_offsets.npy", lambda s: s.token_offsets,
                         {"token_vectors.npy": lambda s: s.token_vectors, "token_scales.npy": lambda s: s.token_scales})
    used = [sources.sources[s] for s in np.unique(src).tolist()]
    if used and all(s.token_groups is not None and s.token_group_offsets is not None for s in used):
        _copy_ragged(writer, src, row, sources, "token_group_offsets.npy", lambda s: s.token_group_offsets,
                     {"token_groups.npy": lambda s: s.token_groups})
    return total


def _copy_ragged(writer: SnapshotWriter, src: np.ndarray, row: np.ndarray, sources: Sources, offsets_name: str,
                 offsets_of: Callable[[Source], Any], arrays: dict[str, Callable[[Source], Any]]) -> int:
    """Arrays whose rows belong to chunks (chunk i of source s owns rows ``offsets_of(s)[i]:offsets_of(s)[i + 1]``)
    copied in chunk order into the snapshot, with their new offsets; an array the sources do not keep (None) is not
    written. Returns the rows written."""
    used = [sources.sources[s] for s in np.unique(src).tolist()]
    lengths = np.zeros(len(src), dtype=np.int64)
    for s in np.unique(src).tolist():
        sel = np.flatnonzero(src == s)
        o = offsets_of(sources.sources[s])
        lengths[sel] = o[row[sel] + 1] - o[row[sel]]
    offsets = np.zeros(len(src) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    out = {}
    for name, get in arrays.items():
        first = get(used[0])
        if first is not None:
            dtype = np.result_type(*[get(s).dtype for s in used])
            out[name] = (get, writer.open_array(name, dtype, (total, *first.shape[1:])))
    for i in range(len(src)):
        s = sources.sources[int(src[i])]
        o = offsets_of(s)
        lo, hi = int(o[row[i]]), int(o[row[i] + 1])
        for get, target in out.values():
            target[offsets[i]:offsets[i + 1]] = get(s)[lo:hi]
        if i % COPY_BLOCK == COPY_BLOCK - 1:
            release_pages(*(t for _, t in out.values()), *(get(u) for u in used for get, _ in out.values()))
    for name, (_, target) in out.items():
        writer.flush_array(name, target)
    writer.save_array(offsets_name, offsets)
    return total
