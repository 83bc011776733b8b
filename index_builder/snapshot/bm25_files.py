"""BM25 built as a stream: passages' analysed terms are added in batches and kept as compact postings (int32 term
ids and counts, ~12 bytes per distinct term of a passage), then scored in one vectorised pass into the bm25s index
the service loads (Lucene's variant, the same score matrix bm25s computes, to float32 rounding).

bm25s's own ``index`` wants every passage's terms as Python lists at once (tens of bytes per term occurrence: at a
million passages, gigabytes) and scores them in a Python loop; this keeps the postings the matrix needs and nothing
else, so a build's BM25 memory is stated per passage (``nbytes``) and a million passages score in seconds.

With ``spill`` (a folder: what a build passes) the postings go to disk as they are added, and :meth:`BM25Builder.write`
scores them into the index's files in passes over ranges of terms, each range's postings at most
:data:`PASS_POSTINGS`: memory then holds the vocabulary, a count per term, 4 bytes a passage and one range's matrix,
whatever the corpus (a million passages: 77.5 M postings, 1.6 KB a passage in memory before, a fixed ~200 MiB now).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import bm25s
import numpy as np

SCORE_BLOCK = 1 << 22  # postings scored at a time in :meth:`BM25Builder.finish`
PASS_POSTINGS = 1 << 24  # a spilled build's postings per pass of :meth:`BM25Builder.write` (8 bytes each held)
SPILL_FOLDER = ".bm25-postings"  # a build spills into its generation's temporary folder, removed before it is sealed
SPILLED = ("docs", "terms", "tf")  # the spill folder's files: int32 each, one value a posting, in passage order
FILES = {"data": "data.csc.index.npy", "indices": "indices.csc.index.npy", "indptr": "indptr.csc.index.npy",
         "vocab": "vocab.index.json", "params": "params.index.json"}  # bm25s's names (BM25.save / BM25.load)


def _scores(tf: np.ndarray, dl: np.ndarray, idf: np.ndarray, k1: float, b: float, l_avg: np.floating) -> np.ndarray:
    """Lucene's ``idf * tf / (k1 * (1 - b + b * dl / avgdl) + tf)`` of postings, in float64 as bm25s computes it,
    rounded to float32 (``idf``: the postings' terms' idf, float32)."""
    t = tf.astype(np.float32)
    tfc = t / (k1 * ((1 - b) + b * dl.astype(np.float64) / l_avg) + t)
    return (idf * tfc).astype(np.float32)


class BM25Builder:
    """Postings of the passages added so far; :meth:`finish` scores them. Passages are numbered in the order
    they are added (the snapshot's chunk order)."""

    def __init__(self, spill: Path | None = None) -> None:
        self.vocab: dict[str, int] = {}
        self._docs: list[np.ndarray] = []  # per batch: passage number of each posting (int32)
        self._terms: list[np.ndarray] = []  # term id of each posting (int32)
        self._tf: list[np.ndarray] = []  # occurrences of the term in the passage (int32)
        self._lengths: list[np.ndarray] = []  # analysed length of each passage (int32)
        self._df = np.zeros(0, dtype=np.int64)  # passages holding each term (kept as postings come)
        self.passages = 0
        self.postings = 0
        self.spill = Path(spill) if spill is not None else None
        if self.spill is not None:
            self.spill.mkdir(parents=True, exist_ok=True)
            for name in SPILLED:
                (self.spill / name).write_bytes(b"")

    def add(self, passages_terms: Iterable[Sequence[str]]) -> None:
        """Add the next passages (each its analysed terms, in order)."""
        ids: list[int] = []
        owners: list[int] = []
        lengths: list[int] = []
        vocab = self.vocab
        for i, terms in enumerate(passages_terms):
            lengths.append(len(terms))
            for t in terms:
                tid = vocab.get(t)
                if tid is None:
                    tid = vocab[t] = len(vocab)
                ids.append(tid)
            owners.extend([self.passages + i] * len(terms))
        n = len(lengths)
        if not ids:
            self._lengths.append(np.asarray(lengths, dtype=np.int32))
            self.passages += n
            return
        key = np.asarray(owners, dtype=np.int64) * (1 << 31) + np.asarray(ids, dtype=np.int64)
        uniq, counts = np.unique(key, return_counts=True)  # one posting per (passage, term)
        posting_docs = (uniq >> 31).astype(np.int32)
        posting_terms = (uniq & ((1 << 31) - 1)).astype(np.int32)
        tf = counts.astype(np.int32)
        df = np.bincount(posting_terms, minlength=len(vocab))
        df[:len(self._df)] += self._df
        self._df = df
        if self.spill is not None:
            for name, values in zip(SPILLED, (posting_docs, posting_terms, tf), strict=True):
                with open(self.spill / name, "ab") as f:
                    f.write(values.tobytes())
        else:
            self._docs.append(posting_docs)
            self._terms.append(posting_terms)
            self._tf.append(tf)
        self._lengths.append(np.asarray(lengths, dtype=np.int32))
        self.passages += n
        self.postings += len(posting_docs)

    @property
    def nbytes(self) -> int:
        """What the postings hold in memory now (the vocabulary's strings aside; spilled postings are on disk)."""
        return sum(a.nbytes for part in (self._docs, self._terms, self._tf, self._lengths) for a in part) \
            + self._df.nbytes

    def avgdl(self) -> float:
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)
        return float(lengths.mean()) if len(lengths) else 0.0

    def finish(self, k1: float, b: float) -> bm25s.BM25:
        """The bm25s index (method ``lucene``): ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``,
        ``tfc = tf / (k1 * (1 - b + b * dl / avgdl) + tf)``, each posting ``idf * tfc`` in float32, stored as the
        CSC matrix bm25s reads (a column per term).

        Memory: the postings' arrays are joined one at a time (each batch list freed as it goes), the scores are
        computed in blocks of :data:`SCORE_BLOCK` postings (the float64 arithmetic of the whole matrix at once was
        ~30 bytes a posting more), and each array is dropped once the next no longer needs it: about 28 bytes a
        posting at the peak (the sort), against ~48 before. Held in memory: a builder with a spill folder writes
        its index with :meth:`write` instead."""
        if self.spill is not None:
            raise ValueError("a spilled BM25 build is written to a folder (BM25Builder.write), not held in memory")
        n_docs, n_vocab = self.passages, len(self.vocab)
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)
        docs = np.concatenate(self._docs) if self._docs else np.zeros(0, np.int32)
        self._docs = []
        terms = np.concatenate(self._terms) if self._terms else np.zeros(0, np.int32)
        self._terms = []
        tf = np.concatenate(self._tf) if self._tf else np.zeros(0, np.int32)
        self._tf = []
        l_avg = lengths.mean() if len(lengths) else np.float64(1.0)  # np.float64, as bm25s computes it
        df = self._df
        idf = self._idf()
        scores = np.empty(len(docs), dtype=np.float32)
        for a in range(0, len(docs), SCORE_BLOCK):  # the same float64 arithmetic, a block at a time
            block = slice(a, a + SCORE_BLOCK)
            scores[block] = _scores(tf[block], lengths[docs[block]], idf[terms[block]], k1, b, l_avg)
        del tf
        # by term, then passage (CSC): postings were added in passage order, so a stable sort by term is enough
        if len(docs) > 1 and bool((docs[1:] < docs[:-1]).any()):
            order = np.lexsort((docs, terms))
        else:
            order = np.argsort(terms, kind="stable")
        del terms
        indptr = np.zeros(n_vocab + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        data = scores[order]
        del scores
        indices = docs[order].astype(np.int32, copy=False)
        del docs, order
        bm = bm25s.BM25(k1=k1, b=b, method="lucene")
        bm.scores = {"data": data, "indices": indices, "indptr": indptr, "num_docs": n_docs}
        bm.vocab_dict = dict(self.vocab)
        bm.nonoccurrence_array = None  # (lucene has none; bm25s sets it in index())
        return bm

    def _idf(self) -> np.ndarray:
        """Lucene's idf of every term, float32 (``ln(1 + (N - df + 0.5) / (df + 0.5))``)."""
        df = self._df
        return np.log(1 + (self.passages - df + 0.5) / (df + 0.5)).astype(np.float32)

    def write(self, folder: Path, k1: float, b: float) -> None:
        """The bm25s index's files in ``folder`` (what ``bm25s.BM25.save`` writes for :meth:`finish`'s index, and
        ``bm25s.BM25.load`` reads). Held postings: :meth:`finish` and bm25s's own ``save``. Spilled postings: the
        CSC matrix written a range of terms at a time; each pass reads the spilled postings in blocks of
        :data:`SCORE_BLOCK` and places its range's postings by a counting sort (passage order kept within a term),
        so the files equal the held build's, byte for byte. Raises OSError (a full disk, an unwritable folder)."""
        folder = Path(folder)
        if self.spill is None:
            self.finish(k1, b).save(str(folder), show_progress=False)
            return
        folder.mkdir(parents=True, exist_ok=True)
        df, n_postings = self._df, self.postings
        indptr = np.zeros(len(df) + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        np.save(folder / FILES["indptr"], indptr)
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)
        l_avg = lengths.mean() if len(lengths) else np.float64(1.0)
        idf = self._idf()
        with open(folder / FILES["data"], "wb") as data, open(folder / FILES["indices"], "wb") as indices:
            np.lib.format.write_array_header_1_0(data, {"descr": "<f4", "fortran_order": False,
                                                        "shape": (n_postings,)})
            np.lib.format.write_array_header_1_0(indices, {"descr": "<i4", "fortran_order": False,
                                                           "shape": (n_postings,)})
            for t0, t1 in self._term_ranges(indptr):
                lo = int(indptr[t0])
                out_data = np.empty(int(indptr[t1]) - lo, dtype=np.float32)
                out_docs = np.empty(len(out_data), dtype=np.int32)
                cursor = indptr[t0:t1] - lo  # the next free slot of each term of the range
                for docs, terms, tf in self._spilled_blocks():
                    sel = np.flatnonzero((terms >= t0) & (terms < t1))
                    if not len(sel):
                        continue
                    docs, terms, tf = docs[sel], terms[sel] - t0, tf[sel]
                    order = np.argsort(terms, kind="stable")  # by term, passage order kept
                    terms = terms[order]
                    first = np.flatnonzero(np.diff(terms, prepend=-1))  # each term's first place in the block
                    counts = np.diff(np.append(first, len(terms)))
                    pos = cursor[terms] + np.arange(len(terms)) - np.repeat(first, counts)
                    out_data[pos] = _scores(tf[order], lengths[docs[order]], idf[terms + t0], k1, b, l_avg)
                    out_docs[pos] = docs[order]
                    cursor[terms[first]] += counts
                data.write(out_data.tobytes())
                indices.write(out_docs.tobytes())
                del out_data, out_docs
            for f in (data, indices):
                f.flush()
                os.fsync(f.fileno())
        ref = bm25s.BM25(k1=k1, b=b, method="lucene")  # the parameters bm25s records, from bm25s itself
        params = {"k1": ref.k1, "b": ref.b, "delta": ref.delta, "method": ref.method, "idf_method": ref.idf_method,
                  "dtype": ref.dtype, "int_dtype": ref.int_dtype, "num_docs": self.passages,
                  "version": bm25s.__version__, "backend": ref.backend}
        (folder / FILES["vocab"]).write_text(json.dumps(self.vocab, ensure_ascii=False), encoding="utf-8")
        (folder / FILES["params"]).write_text(json.dumps(params, indent=4), encoding="utf-8")

    def _term_ranges(self, indptr: np.ndarray) -> list[tuple[int, int]]:
        """Consecutive term ranges of at most :data:`PASS_POSTINGS` postings each (a longer term alone)."""
        ranges, t0, n = [], 0, len(indptr) - 1
        while t0 < n:
            t1 = int(np.searchsorted(indptr, indptr[t0] + PASS_POSTINGS, side="right")) - 1
            t1 = min(n, max(t1, t0 + 1))
            ranges.append((t0, t1))
            t0 = t1
        return ranges

    def _spilled_blocks(self) -> Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The spilled postings, :data:`SCORE_BLOCK` at a time, read (not mapped: the page cache keeps them, the
        process does not)."""
        assert self.spill is not None
        files = [open(self.spill / name, "rb") for name in SPILLED]  # noqa: SIM115 (closed below)
        try:
            while True:
                block = [np.fromfile(f, dtype=np.int32, count=SCORE_BLOCK) for f in files]
                if not len(block[0]):
                    return
                yield block[0], block[1], block[2]
        finally:
            for f in files:
                f.close()
