"""Encodings keyed by what they encode: never embed a passage twice.

A chunk's **key** is 16 bytes of BLAKE2b over the encoders' identity (the embedder's file hash and window, the token
encoder's identity, the token storage) and the passage text it embeds (title + chunk). The same passage under the
same models has the same key in any build, any process, any replica; a changed model changes every key.

Encodings are found by key in **sources**: the snapshot being replaced (its ``chunk_keys.npy`` beside its vectors),
the segments a build wrote before it was killed (``BuildWork``), the live index's write buffer. A build embeds only
the chunks no source holds; a rebuild of the live index embeds nothing (every write was embedded when it arrived);
a resumed build embeds only what the killed one had not written.

Arrays per source: ``keys`` (S16 [n]), ``vectors`` (float32 [n, dim], may be memory-mapped), and the token store's
``token_vectors`` [T, tdim], ``token_offsets`` [n + 1] and optional ``token_scales`` [T] (and, for a pooled store,
``token_groups`` with ``token_group_offsets``: each original token's pooled row). Lookups sort each
source's keys once: 24 bytes per chunk.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from index_builder.snapshot.format import fsync_dir

KEY = np.dtype("S16")


def encoder_identity(embedder: dict[str, Any], token_encoder: dict[str, Any] | None) -> bytes:
    """The identity every key is made under: what the embedder and the token encoder (with its storage) are."""
    return hashlib.blake2b(json.dumps([embedder, token_encoder], sort_keys=True).encode(), digest_size=16).digest()


def chunk_keys(identity: bytes, passages: Sequence[str]) -> np.ndarray:
    """Each passage's key (S16 [n]).

    >>> k = chunk_keys(b"m", ["a", "b", "a"]); k.dtype, k[0] == k[2], k[0] == k[1]
    (dtype('S16'), True, False)
    """
    out = np.empty(len(passages), dtype=KEY)
    for i, p in enumerate(passages):
        h = hashlib.blake2b(identity, digest_size=16)
        h.update(p.encode("utf-8", "surrogatepass"))
        out[i] = h.digest()
    return out


@dataclass
class Source:
    """One place that holds encodings (see the module docstring). ``name`` for messages."""

    name: str
    keys: np.ndarray
    vectors: Any
    token_vectors: Any = None
    token_offsets: np.ndarray | None = None
    token_scales: Any = None
    storage: str = ""  # the token vectors' storage (int8, float16, a codec spec); "" when it holds none
    token_groups: Any = None  # a pooled store's token -> pooled row (uint8 [tokens before pooling])
    token_group_offsets: np.ndarray | None = None
    _order: np.ndarray | None = field(default=None, repr=False)
    _sorted: np.ndarray | None = field(default=None, repr=False)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Each key's row here, -1 where absent (int64 [len(keys)])."""
        if self._order is None:
            self._order = np.argsort(self.keys, kind="stable")
            self._sorted = np.asarray(self.keys)[self._order]
        assert self._sorted is not None
        if not len(self._sorted):
            return np.full(len(keys), -1, dtype=np.int64)
        pos = np.searchsorted(self._sorted, keys)
        pos = np.minimum(pos, len(self._sorted) - 1)
        hit = self._sorted[pos] == keys
        return np.where(hit, self._order[pos], -1).astype(np.int64)

    def token_lengths(self, rows: np.ndarray) -> np.ndarray:
        assert self.token_offsets is not None
        return (self.token_offsets[rows + 1] - self.token_offsets[rows]).astype(np.int64)


class Sources:
    """Sources searched in order (the first that holds a key gives it)."""

    def __init__(self, sources: Sequence[Source] = ()) -> None:
        self.sources = list(sources)

    def add(self, source: Source) -> None:
        self.sources.append(source)

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source index, row) per key; source -1 where no source holds it."""
        src = np.full(len(keys), -1, dtype=np.int64)
        row = np.full(len(keys), -1, dtype=np.int64)
        for i, s in enumerate(self.sources):
            todo = np.flatnonzero(src < 0)
            if not len(todo):
                break
            r = s.find(keys[todo])
            found = r >= 0
            src[todo[found]], row[todo[found]] = i, r[found]
        return src, row


# ---------------------------------------------------------------------- a build's own segments (its checkpoints)


class BuildWork:
    """The encodings a build has made so far, one segment folder per embedded batch, written atomically
    (``seg-NNNNNN/``, renamed into place after fsync). A build killed at any point leaves whole segments only;
    the next build into the same index root finds them and embeds only the rest. Removed when a build completes.
    Segments made under another identity are ignored (a changed model makes new keys anyway)."""

    def __init__(self, folder: Path, identity: bytes) -> None:
        self.folder = Path(folder)
        self.identity = identity
        self.folder.mkdir(parents=True, exist_ok=True)
        for tmp in self.folder.glob(".tmp-seg-*"):  # a segment being written when the build died
            _remove_tree(tmp)
        stamp = self.folder / "identity"
        if stamp.is_file() and stamp.read_bytes() != identity:
            for seg in self.folder.glob("seg-*"):  # another model's work: useless now
                _remove_tree(seg)
        stamp.write_bytes(identity)
        self.segments = sorted(p for p in self.folder.glob("seg-*") if (p / "done").is_file())

    def sources(self) -> list[Source]:
        return [load_segment(p) for p in self.segments]

    def write(self, keys: np.ndarray, vectors: np.ndarray, token_vectors: np.ndarray | None,
              token_offsets: np.ndarray | None, token_scales: np.ndarray | None,
              groups: tuple[np.ndarray, np.ndarray] | None = None) -> Source:
        """Write one segment (atomically) and return it as a source."""
        final = write_segment(self.folder, f"seg-{len(self.segments) + 1:06d}", keys, vectors, token_vectors,
                              token_offsets, token_scales, groups)
        self.segments.append(final)
        return load_segment(final)

    def remove(self) -> None:
        _remove_tree(self.folder)


def segment_name(keys: np.ndarray) -> str:
    """A name for the segment of these keys that any writer would give it (a retried batch rewrites the same
    segment; concurrent writers never collide): ``seg-`` + 16 hex digits of a hash of the keys."""
    return "seg-" + hashlib.blake2b(np.ascontiguousarray(keys).tobytes(), digest_size=8).hexdigest()


def write_segment(folder: Path, name: str, keys: np.ndarray, vectors: np.ndarray, token_vectors: np.ndarray | None,
                  token_offsets: np.ndarray | None, token_scales: np.ndarray | None,
                  groups: tuple[np.ndarray, np.ndarray] | None = None) -> Path:
    """Write segment ``folder/name`` atomically: its arrays fsynced in a temporary folder of this process, renamed
    into place. A segment already complete under that name is kept (a retried writer made the same one)."""
    folder = Path(folder)
    final = folder / name
    if (final / "done").is_file():
        return final
    tmp = folder / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        _remove_tree(tmp)
    tmp.mkdir()
    arrays = {"keys": keys, "vectors": np.ascontiguousarray(vectors, dtype=np.float32)}
    if token_vectors is not None and token_offsets is not None:
        arrays |= {"token_vectors": token_vectors, "token_offsets": token_offsets.astype(np.int64)}
        if token_scales is not None:
            arrays["token_scales"] = np.asarray(token_scales)  # float32 (int8), float16 (a codec)
        if groups is not None:
            arrays["token_groups"], arrays["token_group_offsets"] = groups[0], groups[1].astype(np.int64)
    for array_name, a in arrays.items():
        with open(tmp / f"{array_name}.npy", "wb") as f:
            np.save(f, a)
            f.flush()
            os.fsync(f.fileno())
    (tmp / "done").write_bytes(b"")
    fsync_dir(tmp)
    try:
        os.replace(tmp, final)
    except OSError:  # another writer finished the same segment first (a directory cannot replace a full one)
        _remove_tree(tmp)
        if not (final / "done").is_file():
            raise
    fsync_dir(folder)
    return final


def load_segment(folder: Path) -> Source:
    def opt(name: str) -> Any:
        p = folder / f"{name}.npy"
        return np.load(p, mmap_mode="r") if p.is_file() else None

    offsets = opt("token_offsets")
    group_offsets = opt("token_group_offsets")
    return Source(folder.name, np.load(folder / "keys.npy"), np.load(folder / "vectors.npy", mmap_mode="r"),
                  opt("token_vectors"), None if offsets is None else np.asarray(offsets), opt("token_scales"),
                  token_groups=opt("token_groups"),
                  token_group_offsets=None if group_offsets is None else np.asarray(group_offsets))


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
