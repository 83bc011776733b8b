"""BM25 built as a stream: passages' analysed terms are added in batches and kept as compact postings (int32 term
ids and counts, ~10 bytes per distinct term of a passage), then scored in one vectorised pass into the bm25s index
the service loads (Lucene's variant, the same score matrix bm25s computes, to float32 rounding).

bm25s's own ``index`` wants every passage's terms as Python lists at once (tens of bytes per term occurrence: at a
million passages, gigabytes) and scores them in a Python loop; this keeps the postings the matrix needs and nothing
else, so a build's BM25 memory is stated per passage (``nbytes``) and a million passages score in seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import bm25s
import numpy as np

SCORE_BLOCK = 1 << 22  # postings scored at a time in :meth:`BM25Builder.finish`


class BM25Builder:
    """Postings of the passages added so far; :meth:`finish` scores them. Passages are numbered in the order
    they are added (the snapshot's chunk order)."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self._docs: list[np.ndarray] = []  # per batch: passage number of each posting (int32)
        self._terms: list[np.ndarray] = []  # term id of each posting (int32)
        self._tf: list[np.ndarray] = []  # occurrences of the term in the passage (int32)
        self._lengths: list[np.ndarray] = []  # analysed length of each passage (int32)
        self.passages = 0

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
        self._docs.append((uniq >> 31).astype(np.int32))
        self._terms.append((uniq & ((1 << 31) - 1)).astype(np.int32))
        self._tf.append(counts.astype(np.int32))
        self._lengths.append(np.asarray(lengths, dtype=np.int32))
        self.passages += n

    @property
    def nbytes(self) -> int:
        """What the postings hold now (the vocabulary's strings aside)."""
        return sum(a.nbytes for part in (self._docs, self._terms, self._tf, self._lengths) for a in part)

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
        posting at the peak (the sort), against ~48 before."""
        n_docs, n_vocab = self.passages, len(self.vocab)
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)
        docs = np.concatenate(self._docs) if self._docs else np.zeros(0, np.int32)
        self._docs = []
        terms = np.concatenate(self._terms) if self._terms else np.zeros(0, np.int32)
        self._terms = []
        tf = np.concatenate(self._tf) if self._tf else np.zeros(0, np.int32)
        self._tf = []
        l_avg = lengths.mean() if len(lengths) else np.float64(1.0)  # np.float64, as bm25s computes it
        df = np.bincount(terms, minlength=n_vocab)
        idf = np.log(1 + (n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)
        scores = np.empty(len(docs), dtype=np.float32)
        for a in range(0, len(docs), SCORE_BLOCK):  # the same float64 arithmetic, a block at a time
            block = slice(a, a + SCORE_BLOCK)
            t = tf[block].astype(np.float32)
            l_d = lengths[docs[block]].astype(np.float64)
            tfc = t / (k1 * ((1 - b) + b * l_d / l_avg) + t)
            scores[block] = (idf[terms[block]] * tfc).astype(np.float32)
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
