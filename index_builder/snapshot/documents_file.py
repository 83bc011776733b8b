"""A snapshot's documents read where they lie (``documents.jsonl`` read with ``pread``, with
``documents.offsets.npy``: the byte offset of every line), so a serving process holds a document's text only while
it is being read: the texts of a million passages stay on disk (and in the page cache, as hot as they are), not in
the process's heap, nor in its RSS (a memory map's touched pages would count there, and the load reads every
document once: index_builder/snapshot/row_file.py says why).

``documents[i]`` parses line ``i`` (a small cache keeps the most recent ones: a result's passages are read a few
times in a row); iteration parses in order without caching. Snapshots written before the offsets file existed
get their offsets from one vectorised scan for newlines at open.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import overload

import numpy as np

from index_builder.types import Document

CACHE = 1024  # parsed documents kept (a few KB each)
BLOCK = 4 << 20  # bytes read at a time when iterating


def _parse(line: bytes) -> Document:
    o = json.loads(line)
    return Document(id=o["_id"], title=o["title"], text=o["text"], tenant=o["tenant"], metadata=o["metadata"])


def line_offsets(buf: bytes) -> np.ndarray:
    """Start of every line and the end of the last, int64 [lines + 1] (one scan, in numpy)."""
    a = np.frombuffer(buf, dtype=np.uint8) if len(buf) else np.zeros(0, np.uint8)
    ends = np.flatnonzero(a == 10) + 1
    return np.concatenate([[0], ends]).astype(np.int64)


class DocumentFile(Sequence[Document]):
    """``documents.jsonl`` as a sequence of :class:`Document` (see the module docstring). Thread-safe."""

    def __init__(self, path: Path, offsets: np.ndarray | None = None) -> None:
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_RDONLY)
        if offsets is None:  # a snapshot written before the offsets file: one scan of the whole file
            offsets = line_offsets(self.path.read_bytes())
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self._cache: OrderedDict[int, Document] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, i: int) -> Document: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Document]: ...

    def __getitem__(self, i: int | slice) -> Document | Sequence[Document]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"document {i} of {n}")
        with self._lock:
            doc = self._cache.get(i)
            if doc is not None:
                self._cache.move_to_end(i)
                return doc
        doc = _parse(self._read(int(self.offsets[i]), int(self.offsets[i + 1])))
        with self._lock:
            self._cache[i] = doc
            if len(self._cache) > CACHE:
                self._cache.popitem(last=False)
        return doc

    def _read(self, lo: int, hi: int) -> bytes:
        assert self._fd is not None, f"{self.path} is closed"
        out = os.pread(self._fd, hi - lo, lo)
        while len(out) < hi - lo:  # short reads: a signal, or a truncated file
            more = os.pread(self._fd, hi - lo - len(out), lo + len(out))
            if not more:
                raise OSError(f"{self.path}: truncated (bytes {lo}:{hi} past its end)")
            out += more
        return out

    def __iter__(self) -> Iterator[Document]:
        """In order, read a block of lines at a time (no cache)."""
        n, off = len(self), self.offsets
        i = 0
        while i < n:
            j = int(np.searchsorted(off, off[i] + BLOCK, side="right")) - 1  # whole lines within one block
            j = min(max(j, i + 1), n)
            block, base = self._read(int(off[i]), int(off[j])), int(off[i])
            for k in range(i, j):
                yield _parse(block[int(off[k]) - base:int(off[k + 1]) - base])
            i = j

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()
