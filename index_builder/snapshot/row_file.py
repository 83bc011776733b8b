"""Rows of a ``.npy`` file read with ``pread``, not memory-mapped: what a serving process reads of a large array it
touches a few rows of per request (the token store: the head's passages).

Why not a memory map: pages of a mapped file count in the process's RSS once touched, and on this kernel (6.18,
large page-cache folios) touching one row maps its whole folio, up to 2 MB: after a few thousand queries a mapped
token store is resident in full, so the RSS follows the corpus, not what is hot (docs/results/scale.md, "File-backed
memory"). Read with ``pread``, the rows land in a buffer of the request's size; the kernel's page cache still keeps
the hot parts of the file, outside the process.

:class:`RowFile` is the small part of numpy's array interface the stages use on a token store: ``shape``,
``dtype``, ``ndim``, ``len``, integer, slice and integer-array indexing on the first axis, and ``np.asarray`` (the
whole array, read once: for a build or a migration). :func:`release_pages` is the other way, for arrays a build
reads or writes in full through a map: their pages are dropped from the process after each block.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np


class RowFile:
    """A read-only ``.npy`` array (C order) whose rows are read with ``os.pread`` on demand.

    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "a.npy"
    >>> np.save(p, np.arange(12, dtype=np.int16).reshape(6, 2))
    >>> r = RowFile(p)
    >>> r.shape, r[4].tolist(), r[1:3].tolist(), r[np.array([5, 0, 1])].tolist()
    ((6, 2), [8, 9], [[2, 3], [4, 5]], [[10, 11], [0, 1], [2, 3]])
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            self.offset = f.tell()
        if fortran:
            raise ValueError(f"{self.path}: a Fortran-ordered array cannot be read by rows")
        self.shape: tuple[int, ...] = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.ndim = len(self.shape)
        self.row_bytes = int(self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64)))
        self.nbytes = self.row_bytes * (self.shape[0] if self.shape else 0)
        self._fd: int | None = os.open(self.path, os.O_RDONLY)

    def __len__(self) -> int:
        return self.shape[0]

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)
            self._fd = None

    def _read(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` (one pread)."""
        n = max(hi - lo, 0)
        want = n * self.row_bytes
        buf = bytearray(want)
        view, got = memoryview(buf), 0
        assert self._fd is not None
        while got < want:  # pread may return short on a signal; a short read at the end is a truncated file
            k = os.preadv(self._fd, [view[got:]], self.offset + lo * self.row_bytes + got)
            if k == 0:
                raise OSError(f"{self.path}: truncated (rows {lo}:{hi} past its end)")
            got += k
        return np.frombuffer(buf, dtype=self.dtype).reshape((n, *self.shape[1:]))

    def __getitem__(self, key: Any) -> np.ndarray:
        n = self.shape[0]
        if isinstance(key, tuple):  # rows first, then the rest numpy's way
            return self[key[0]][(slice(None), *key[1:])]
        if isinstance(key, slice):
            lo, hi, step = key.indices(n)
            rows = self._read(lo, max(hi, lo)) if step == 1 else self[np.arange(lo, hi, step)]
            return rows
        if isinstance(key, int | np.integer):
            i = int(key) + (n if key < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"row {key} out of range for {n} rows")
            return self._read(i, i + 1)[0]
        idx = np.asarray(key)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64, copy=False).ravel()
        if len(idx) and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"row index out of range for {n} rows")
        idx = np.where(idx < 0, idx + n, idx)
        if not len(idx):
            return np.empty((0, *self.shape[1:]), dtype=self.dtype)
        breaks = np.flatnonzero(np.diff(idx) != 1) + 1  # runs of consecutive rows: one pread each
        los = idx[np.concatenate([[0], breaks])].tolist()
        his = (idx[np.concatenate([breaks, [len(idx)]]) - 1] + 1).tolist()
        assert self._fd is not None
        rb, base = self.row_bytes, self.offset
        # one os.pread a run, joined: 300 scattered rows in ~0.3 ms (a buffer filled per run took 0.8)
        buf = b"".join([os.pread(self._fd, (hi - lo) * rb, base + lo * rb) for lo, hi in zip(los, his, strict=True)])
        if len(buf) == len(idx) * rb:
            out = np.frombuffer(buf, dtype=self.dtype).reshape((len(idx), *self.shape[1:]))
        else:  # a short read (a signal, a truncated file): again, run by run, the careful way
            out = np.concatenate([self._read(lo, hi) for lo, hi in zip(los, his, strict=True)])
        return out.reshape((*np.shape(key), *self.shape[1:])) if np.ndim(key) > 1 else out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self._read(0, self.shape[0])
        return out if dtype is None else out.astype(dtype)


def release_pages(*arrays: Any) -> None:
    """Unmap the pages of memory-mapped arrays (``np.memmap``; others are skipped) from this process: the kernel's
    page cache keeps them (a written page is still written out), but they no longer count in the process's RSS.
    A build that reads and writes gigabytes of mapped arrays calls this after each block, so its resident memory
    does not grow with the corpus (at a million passages the mapped files had grown it by 9.6 GiB)."""
    for a in arrays:
        m = getattr(a, "_mmap", None)
        if m is not None and hasattr(m, "madvise"):
            m.madvise(mmap.MADV_DONTNEED)
