"""A snapshot's documents read where they lie (``documents.jsonl`` memory-mapped, with ``documents.offsets.npy``:
the byte offset of every line), so a serving process holds a document's text only while it is being read: the
texts of a million passages stay on disk (and in the page cache, as hot as they are), not in the process's heap.

``documents[i]`` parses line ``i`` (a small cache keeps the most recent ones: a result's passages are read a few
times in a row); iteration parses in order without caching. Snapshots written before the offsets file existed
get their offsets from one vectorised scan for newlines at open.
"""

from __future__ import annotations

import json
import mmap
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import overload

import numpy as np

from index_builder.types import Document

CACHE = 1024  # parsed documents kept (a few KB each)


def _parse(line: bytes) -> Document:
    o = json.loads(line)
    return Document(id=o["_id"], title=o["title"], text=o["text"], tenant=o["tenant"], metadata=o["metadata"])


def line_offsets(buf: mmap.mmap | bytes) -> np.ndarray:
    """Start of every line and the end of the last, int64 [lines + 1] (one scan, in numpy)."""
    a = np.frombuffer(buf, dtype=np.uint8) if len(buf) else np.zeros(0, np.uint8)
    ends = np.flatnonzero(a == 10) + 1
    return np.concatenate([[0], ends]).astype(np.int64)


class DocumentFile(Sequence[Document]):
    """``documents.jsonl`` as a sequence of :class:`Document` (see the module docstring). Thread-safe."""

    def __init__(self, path: Path, offsets: np.ndarray | None = None) -> None:
        self.path = Path(path)
        self._f = open(self.path, "rb")
        size = self.path.stat().st_size
        self._mm: mmap.mmap | bytes = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self.offsets = np.asarray(offsets, dtype=np.int64) if offsets is not None else line_offsets(self._mm)
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
        doc = _parse(self._mm[int(self.offsets[i]):int(self.offsets[i + 1])])
        with self._lock:
            self._cache[i] = doc
            if len(self._cache) > CACHE:
                self._cache.popitem(last=False)
        return doc

    def __iter__(self) -> Iterator[Document]:
        for i in range(len(self)):
            yield _parse(self._mm[int(self.offsets[i]):int(self.offsets[i + 1])])

    def close(self) -> None:
        if isinstance(self._mm, mmap.mmap):
            self._mm.close()
        self._f.close()
