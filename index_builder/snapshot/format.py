"""The snapshot format: an immutable folder per index generation, and the ``CURRENT`` pointer.

Layout of an index root::

    ROOT/CURRENT                      text: "snapshots/gen-000007" (replaced atomically, after fsync)
    ROOT/snapshots/gen-000007/
        documents.jsonl               one document per line: id, title, text, tenant, metadata (table order)
        documents.offsets.npy         int64 [documents + 1]: each line's byte offset (read where it lies)
        chunks.npy                    structured (doc int32, start int32, end int32): chunk -> document + char span
        bm25/                         bm25s sparse index over the chunks (Lucene-like analysis, see manifest)
        vectors.npy                   float32 [chunks, dim], unit length (exact search, rebuilds without re-embedding)
        hnsw.faiss                    the dense index, inner product, same rows as vectors.npy: faiss IndexHNSWFlat;
                                      or hnsw_sq8.faiss / ivf_pq.faiss ([dense] index, manifest "dense")
        token_vectors.npy             late interaction, optional, in manifest models.token_encoder.dtype: float16
                                      [tokens, tdim] unit length; int8 [tokens, tdim]; or a codec's codes
                                      (index_builder/snapshot/token_codes.py, e.g. pool3+bins: uint8 [pooled vectors, tdim/8])
        token_offsets.npy             int64 [chunks + 1]: chunk i owns rows offsets[i]:offsets[i+1]
        token_scales.npy              per-vector scales: float32 [tokens] for int8, float16 for a codec that has them
        token_groups.npy              a pooled store: uint8 [tokens before pooling], each token's pooled row in its chunk
        token_group_offsets.npy       int64 [chunks + 1]: chunk i's tokens before pooling are groups[o[i]:o[i+1]]
        chunk_keys.npy                S16 [chunks]: what each chunk's vectors encode (model identity + passage), so
                                      a later build reuses them instead of embedding again (index_builder/build/encodings.py)
        manifest.json                 written last: format version, counts, models, settings, sha256 of every file

A folder is built under a temporary name and renamed into place once complete, so ``CURRENT`` can only ever
point at a complete snapshot. Loading verifies the manifest and refuses any mismatch, saying what differs.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bm25s
import faiss
import numpy as np

from index_builder.documents.chunking import CHUNK_DTYPE
from index_builder.errors import SnapshotError
from index_builder.models.encoders import sha256_file
from index_builder.snapshot.bm25_files import BM25Builder
from index_builder.snapshot.documents_file import DocumentFile
from index_builder.snapshot.manifest import FORMAT, FORMAT_VERSION, check_settings, read_manifest, verify_files
from index_builder.snapshot.row_file import RowFile
from index_builder.types import Document

log = logging.getLogger(__name__)

CURRENT = "CURRENT"
SNAPSHOTS = "snapshots"
# Files whose loss disables dense search but still lets BM25 serve.
DENSE_FILES = frozenset({"hnsw.faiss", "hnsw_sq8.faiss", "ivf_pq.faiss", "vectors.npy"})
_GEN_RE = re.compile(r"^gen-(\d{6,})$")


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:  # fsync works on a read-only descriptor (the files are 0444 by now)
                os.fsync(f.fileno())
    for d in sorted({p.parent for p in path.rglob("*")} | {path}, key=lambda q: -len(q.parts)):
        fsync_dir(d)


def list_generations(root: Path) -> list[int]:
    snaps = Path(root) / SNAPSHOTS
    if not snaps.is_dir():
        return []
    return sorted(int(m.group(1)) for p in snaps.iterdir() if (m := _GEN_RE.match(p.name)) and p.is_dir())


def generation_dir(root: Path, generation: int) -> Path:
    return Path(root) / SNAPSHOTS / f"gen-{generation:06d}"


def current_snapshot_dir(root: Path) -> Path:
    """The folder ``CURRENT`` points at; a clear error if there is none."""
    root = Path(root)
    pointer = root / CURRENT
    if not pointer.is_file():
        if (root / "manifest.json").is_file():  # a snapshot folder given directly
            return root
        raise SnapshotError(f"{root} is not an index: it has no {CURRENT} file (build one with 'hybridrag build')")
    rel = pointer.read_text(encoding="utf-8").strip()
    target = (root / rel).resolve()
    if not (target / "manifest.json").is_file():
        raise SnapshotError(f"{pointer} points at {rel}, which has no manifest.json")
    return target


@dataclass
class SnapshotParts:
    """Everything a snapshot holds, in memory, ready to be written."""

    documents: Sequence[Document]
    chunks: np.ndarray  # CHUNK_DTYPE
    bm25: bm25s.BM25
    vectors: np.ndarray  # float32 [chunks, dim]
    hnsw: faiss.Index
    token_vectors: np.ndarray | None  # float16 [tokens, tdim], or int8 with token_scales
    token_offsets: np.ndarray | None  # int64 [chunks + 1]
    settings: dict[str, Any]  # models, analyzer, bm25, hnsw, chunking: recorded verbatim in the manifest
    covered_seq: int = 0  # the document store's sequence number this snapshot includes (live index)
    token_scales: np.ndarray | None = None  # float32 [tokens] when token_vectors is int8
    chunk_keys: np.ndarray | None = None  # S16 [chunks]: what each chunk's encodings encode (index_builder.build.encodings)


def read_documents(path: Path) -> DocumentFile:
    """The documents of ``documents.jsonl``, read where they lie (:class:`DocumentFile`)."""
    offsets = path.with_name("documents.offsets.npy")
    return DocumentFile(path, np.load(offsets) if offsets.is_file() else None)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_tmp(root: Path) -> None:
    """Remove half-written generations left by a builder that died (kill -9 mid-build): never pointed at."""
    for tmp in (root / SNAPSHOTS).glob(".tmp-gen-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


class SnapshotWriter:
    """One new generation written piece by piece into a temporary folder (``.tmp-gen-N-PID``), then finished:
    checksums into the manifest (written last), read-only files, fsync, renamed into place, ``CURRENT`` replaced.
    Large parts are written as they are made (:meth:`open_array` gives a memory-mapped ``.npy`` to fill), so a
    build never holds a whole part in memory. Until :meth:`finish` returns, ``CURRENT`` and every earlier
    generation are untouched; :meth:`abort` removes the temporary folder. A write that fails (a full disk, a
    folder that cannot be written) raises :class:`SnapshotError` naming the file."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        try:
            (self.root / SNAPSHOTS).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SnapshotError(f"cannot write an index under {self.root}: {e.strerror or e}") from None
        if not os.access(self.root / SNAPSHOTS, os.W_OK):
            raise SnapshotError(f"cannot write an index under {self.root}: permission denied")
        _remove_stale_tmp(self.root)
        self.generation = (max(list_generations(self.root), default=0)) + 1
        self.tmp = self.root / SNAPSHOTS / f".tmp-gen-{self.generation:06d}-{os.getpid()}"
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir()
        self._doc_offsets: list[int] = [0]  # byte offset of each line of documents.jsonl, and the end

    def path(self, name: str) -> Path:
        return self.tmp / name

    def failed(self, name: str, e: OSError) -> SnapshotError:
        """The error of a write of ``name`` that failed (the previous generation still serves)."""
        current = self.root / CURRENT
        still = f"; {CURRENT} still points at {current.read_text().strip()}" if current.is_file() else ""
        return SnapshotError(f"cannot write {self.path(name)}: {e.strerror or e}{still}")

    def save_array(self, name: str, array: np.ndarray) -> None:
        try:
            np.save(self.path(name), array)
        except OSError as e:
            raise self.failed(name, e) from None

    def open_array(self, name: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        """A ``.npy`` file of ``shape`` to fill in place (memory-mapped: written pages leave memory as the kernel
        flushes them)."""
        try:
            return np.lib.format.open_memmap(self.path(name), mode="w+", dtype=dtype, shape=shape)
        except OSError as e:
            raise self.failed(name, e) from None

    def flush_array(self, name: str, array: np.ndarray) -> None:
        """Write a filled :meth:`open_array` out (a full disk shows here, not at fsync time)."""
        try:
            if isinstance(array, np.memmap):
                array.flush()
        except OSError as e:
            raise self.failed(name, e) from None

    def write_documents(self, docs: Iterable[Document], mode: str = "a") -> int:
        """Append ``docs`` to ``documents.jsonl`` (one JSON object a line, table order; each line's byte offset
        goes into ``documents.offsets.npy`` at :meth:`finish`); returns how many."""
        if mode == "w":
            self._doc_offsets = [0]
        n = 0
        try:
            with open(self.path("documents.jsonl"), mode + "b") as f:
                for d in docs:
                    line = (json.dumps({"_id": d.id, "title": d.title, "text": d.text, "tenant": d.tenant,
                                        "metadata": d.metadata}, ensure_ascii=False) + "\n").encode("utf-8",
                                                                                                  "surrogatepass")
                    f.write(line)
                    self._doc_offsets.append(self._doc_offsets[-1] + len(line))
                    n += 1
        except OSError as e:
            raise self.failed("documents.jsonl", e) from None
        return n

    def save_bm25(self, bm25: bm25s.BM25) -> None:
        try:
            bm25.save(str(self.path("bm25")), show_progress=False)
        except OSError as e:
            raise self.failed("bm25", e) from None

    def write_bm25(self, builder: BM25Builder, k1: float, b: float) -> None:
        """A streamed build's BM25 index (:meth:`BM25Builder.write`), its spilled postings removed after."""
        try:
            builder.write(self.path("bm25"), k1, b)
        except OSError as e:
            raise self.failed("bm25", e) from None
        if builder.spill is not None:
            shutil.rmtree(builder.spill, ignore_errors=True)

    def save_index(self, name: str, index: faiss.Index) -> None:
        try:
            faiss.write_index(index, str(self.path(name)))
        except (OSError, RuntimeError) as e:  # faiss raises RuntimeError for a failed write
            raise SnapshotError(f"cannot write {self.path(name)}: {e}") from None

    def finish(self, *, counts: dict[str, int], dim: int, settings: dict[str, Any], covered_seq: int = 0,
               keep_last: int = 0) -> Path:
        """Checksum every file into the manifest (written last), make the folder read-only and durable, rename it
        into place and point ``CURRENT`` at it. Returns the snapshot folder."""
        if self.path("documents.jsonl").is_file():
            self.save_array("documents.offsets.npy", np.asarray(self._doc_offsets, dtype=np.int64))
        try:
            files = {}
            for p in sorted(self.tmp.rglob("*")):
                if p.is_file():
                    files[p.relative_to(self.tmp).as_posix()] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
            manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "generation": self.generation,
                        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                        "covered_seq": covered_seq, "counts": counts, "dim": int(dim), **settings, "files": files}
            with open(self.tmp / "manifest.json", "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=1, sort_keys=True)
            for p in self.tmp.rglob("*"):
                if p.is_file():
                    p.chmod(0o444)
            _fsync_tree(self.tmp)
        except OSError as e:
            raise self.failed("manifest.json", e) from None
        final = generation_dir(self.root, self.generation)
        os.replace(self.tmp, final)
        fsync_dir(self.root / SNAPSHOTS)
        point_current(self.root, final)
        if keep_last > 0:
            prune(self.root, keep_last)
        return final

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def write_snapshot(root: Path, parts: SnapshotParts, *, keep_last: int = 0) -> Path:
    """Write a new generation under ``root`` from parts held in memory and point ``CURRENT`` at it. Returns the
    snapshot folder. ``keep_last`` > 0 removes older generations beyond the newest ``keep_last`` (never the one
    written). (The build streams its parts through :class:`SnapshotWriter` itself.)"""
    n_chunks = len(parts.chunks)
    if parts.chunks.dtype != CHUNK_DTYPE:
        raise SnapshotError(f"chunks must have dtype {CHUNK_DTYPE}, got {parts.chunks.dtype}")
    if parts.vectors.shape[0] != n_chunks or parts.hnsw.ntotal != n_chunks:
        raise SnapshotError(f"{n_chunks} chunks but {parts.vectors.shape[0]} vectors and {parts.hnsw.ntotal} HNSW rows")
    if parts.token_vectors is not None and parts.token_offsets is not None:
        if len(parts.token_offsets) != n_chunks + 1 or parts.token_offsets[-1] != len(parts.token_vectors):
            raise SnapshotError("token_offsets do not match the chunks and token vectors")
        if parts.token_scales is not None and len(parts.token_scales) != len(parts.token_vectors):
            raise SnapshotError("token_scales must have one scale per token vector")
    w = SnapshotWriter(root)
    try:
        w.write_documents(parts.documents, mode="w")
        w.save_array("chunks.npy", parts.chunks)
        if parts.chunk_keys is not None:
            w.save_array("chunk_keys.npy", parts.chunk_keys)
        w.save_bm25(parts.bm25)
        w.save_array("vectors.npy", np.ascontiguousarray(parts.vectors, dtype=np.float32))
        w.save_index(parts.settings.get("dense", {}).get("file", "hnsw.faiss"), parts.hnsw)
        counts = {"documents": len(parts.documents), "chunks": n_chunks, "token_vectors": 0}
        if parts.token_vectors is not None and parts.token_offsets is not None:
            w.save_array("token_vectors.npy", parts.token_vectors)
            w.save_array("token_offsets.npy", parts.token_offsets.astype(np.int64))
            if parts.token_scales is not None:
                w.save_array("token_scales.npy", np.asarray(parts.token_scales))  # float32 (int8), float16 (codes)
            counts["token_vectors"] = int(len(parts.token_vectors))
        return w.finish(counts=counts, dim=int(parts.vectors.shape[1]), settings=parts.settings,
                        covered_seq=parts.covered_seq, keep_last=keep_last)
    except BaseException:
        w.abort()
        raise


def point_current(root: Path, snapshot: Path) -> None:
    """Replace ``CURRENT`` atomically (write a temporary file, fsync it, ``os.replace``, fsync the folder)."""
    tmp = root / f".{CURRENT}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(snapshot.relative_to(root).as_posix() + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / CURRENT)
    fsync_dir(root)


def prune(root: Path, keep_last: int) -> list[Path]:
    """Remove all but the newest ``keep_last`` generations (never the one ``CURRENT`` points at)."""
    current = current_snapshot_dir(root)
    removed = []
    for g in list_generations(root)[:-keep_last]:
        d = generation_dir(root, g)
        if d.resolve() != current:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


@dataclass
class LoadedSnapshot:
    """A verified snapshot in memory (large arrays memory-mapped, read-only)."""

    path: Path
    manifest: dict[str, Any]
    documents: Sequence[Document]  # a DocumentFile: read from disk as asked for
    chunks: np.ndarray
    bm25: bm25s.BM25
    vectors: np.ndarray | None  # None, like hnsw, when the dense side could not be loaded
    hnsw: faiss.Index | None  # None when the dense index could not be loaded (BM25 serves alone)
    token_vectors: Any  # a RowFile (index_builder/snapshot/row_file.py): rows read with pread, never mapped
    token_offsets: np.ndarray | None
    dense_error: str | None = None
    token_scales: Any = None  # a RowFile too
    chunk_keys: np.ndarray | None = None  # S16 [chunks], memory-mapped (snapshots before format 1.1: None)
    token_groups: Any = None  # a pooled store's token -> pooled row (a RowFile), with its offsets; else None
    token_group_offsets: np.ndarray | None = None

    @property
    def generation(self) -> int:
        return int(self.manifest["generation"])


def load_snapshot(root: Path, *, expected: dict[str, Any] | None = None, checksums: bool = True,
                  dense_required: bool = False, dense_index: bool = True) -> LoadedSnapshot:
    """Load the snapshot ``CURRENT`` points at (or a snapshot folder), verifying it first.

    A missing or corrupt dense index (HNSW file) is not fatal unless ``dense_required``: the snapshot loads
    without it and ``dense_error`` says why, so BM25 can serve alone. ``dense_index=False``: the index file is
    not read at all (a build reading the snapshot's encodings needs its rows, not its graph: at a million
    passages the graph is 626 MiB of memory).
    """
    path = current_snapshot_dir(Path(root))
    manifest = read_manifest(path)
    check_settings(manifest, expected or {})
    problems = verify_files(path, manifest, checksums=checksums)
    described = "; ".join(f"{name}: {why}" for name, why in problems.items())
    if (set(problems) - DENSE_FILES) or (problems and dense_required):
        raise SnapshotError(f"snapshot {path} failed verification: {described}")
    documents = read_documents(path / "documents.jsonl")
    chunks = np.load(path / "chunks.npy")
    bm25 = bm25s.BM25.load(str(path / "bm25"), mmap=True, show_progress=False, load_vocab=True)
    vectors = None if "vectors.npy" in problems else np.load(path / "vectors.npy", mmap_mode="r")
    hnsw, dense_error = None, None
    if problems:
        dense_error = described
        log.error("dense index of %s unusable (%s): BM25 will serve alone", path, dense_error)
    elif not dense_index:
        dense_error = "not loaded (dense_index=False)"
    else:
        name = manifest.get("dense", {}).get("file", "hnsw.faiss")  # the kind built (index_builder/snapshot/dense_index.py)
        try:
            hnsw = faiss.read_index(str(path / name))
        except Exception as e:  # corrupt beyond what a checksum catches (checksums off)
            dense_error = f"{name}: {e}"
            log.error("cannot read %s/%s (%s): BM25 will serve alone", path, name, e)
    token_vectors = token_offsets = token_scales = None
    if (path / "token_vectors.npy").is_file():
        # read by rows with pread, only the head's (index_builder/snapshot/row_file.py: a mapped store's pages would count
        # in the RSS and follow the corpus)
        token_vectors = RowFile(path / "token_vectors.npy")
        token_offsets = np.load(path / "token_offsets.npy")
        if (path / "token_scales.npy").is_file():
            token_scales = RowFile(path / "token_scales.npy")
    token_groups = token_group_offsets = None
    if (path / "token_groups.npy").is_file() and (path / "token_group_offsets.npy").is_file():
        token_groups = RowFile(path / "token_groups.npy")
        token_group_offsets = np.load(path / "token_group_offsets.npy")
    chunk_keys = np.load(path / "chunk_keys.npy", mmap_mode="r") if (path / "chunk_keys.npy").is_file() else None
    counts = manifest["counts"]
    if len(documents) != counts["documents"] or len(chunks) != counts["chunks"]:
        raise SnapshotError(f"snapshot {path}: counts differ from the manifest ({counts})")
    return LoadedSnapshot(path, manifest, documents, chunks, bm25, vectors, hnsw, token_vectors, token_offsets,
                          dense_error, token_scales, chunk_keys, token_groups, token_group_offsets)
