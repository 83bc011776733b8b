"""Chunk scores to document scores: a document scores as its best chunk (MaxP)."""

from __future__ import annotations

import numpy as np

from index_builder.types import Hits


def doc_starts(chunk_doc: np.ndarray, n_docs: int) -> np.ndarray:
    """First chunk of each document; chunks are stored grouped by document, every document has >= 1 chunk.

    >>> doc_starts(np.array([0, 0, 1, 2, 2, 2]), 3).tolist()
    [0, 2, 3]
    """
    starts = np.searchsorted(chunk_doc, np.arange(n_docs), side="left")
    return starts.astype(np.int64)


def one_chunk_per_doc(starts: np.ndarray, n_chunks: int) -> bool:
    """Whether every document has exactly one chunk (``starts`` is ``0..n-1``): then a chunk's score is its
    document's, and :func:`top_docs_from_chunk_scores` skips the per-document max (``np.maximum.reduceat`` over a
    million one-chunk segments costs ~3 ms). Computed once per index, not per query.

    >>> one_chunk_per_doc(np.array([0, 1, 2]), 3), one_chunk_per_doc(np.array([0, 2]), 3)
    (True, False)
    """
    return len(starts) == n_chunks and bool(np.array_equal(starts, np.arange(n_chunks)))


PREFILTER_FROM = 1 << 16  # chunks: below this, scanning every score costs about what the prefilter does
PREFILTER_STRIDE = 16  # the prefilter's sample: every 16th chunk's score


def top_docs_from_chunk_scores(scores: np.ndarray, starts: np.ndarray, k: int, *, valid: np.ndarray | None = None,
                               min_score: float | None = None, one_per_doc: bool = False) -> Hits:
    """Best ``k`` documents from a score per chunk (all chunks): max per document, then top-k.

    Shapes: ``scores`` float [n_chunks]; ``starts`` int64 [n_docs]; ``valid`` bool [n_docs] or None.
    Documents scoring <= ``min_score`` (when given) or not ``valid`` are left out; of documents tied at the
    ``k``-th score, the lowest ids. ``one_per_doc``: the caller knows every document has one chunk
    (:func:`one_chunk_per_doc`); the answer is the same, sooner.

    Over many chunks the documents are first narrowed by :func:`_prefiltered` (the same answer, sooner).

    >>> h = top_docs_from_chunk_scores(np.array([0.1, 0.9, 0.5, 0.2]), np.array([0, 2, 3]), 2)
    >>> h.doc.tolist(), h.chunk.tolist()
    ([0, 1], [1, 2])
    >>> h = top_docs_from_chunk_scores(np.array([0.1, 0.9, 0.0]), np.arange(3), 5, min_score=0.0, one_per_doc=True)
    >>> h.doc.tolist(), h.chunk.tolist()
    ([1, 0], [1, 0])
    """
    if len(starts) == 0:
        return Hits.empty()
    narrowed = _prefiltered(scores, starts, k, valid, min_score, one_per_doc) if len(scores) >= PREFILTER_FROM \
        else None
    if narrowed is not None:
        candidates, cand_scores = narrowed
    else:
        doc_scores = scores if one_per_doc else np.maximum.reduceat(scores, starts)
        if min_score is not None:
            keep = doc_scores > min_score
            if valid is not None:
                keep &= valid
        else:
            keep = np.ones(len(doc_scores), dtype=bool) if valid is None else valid.copy()
        candidates = np.flatnonzero(keep)
        cand_scores = doc_scores[candidates]
    if len(candidates) == 0:
        return Hits.empty()
    if len(candidates) > k:  # (candidates ascend) ties at the k-th score go to the lowest document ids
        kth = -np.partition(-cand_scores, k - 1)[k - 1]
        above = np.flatnonzero(cand_scores > kth)
        part = np.concatenate([above, np.flatnonzero(cand_scores == kth)[:k - len(above)]])
        candidates, cand_scores = candidates[part], cand_scores[part]
    order = np.lexsort((candidates, -cand_scores))
    docs, top_scores = candidates[order], cand_scores[order]
    if one_per_doc:
        return Hits(docs.astype(np.int64), top_scores.astype(np.float32), docs.astype(np.int64))
    return Hits(docs.astype(np.int64), top_scores.astype(np.float32), best_chunks(scores, starts, docs))


def best_chunks(scores: np.ndarray, starts: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """Each of ``docs``' first best-scoring chunk (int64), over their chunks' ``scores`` at once (a loop over the
    documents cost ~3 us each: 0.3 ms a request for a hundred).

    >>> best_chunks(np.array([0.1, 0.9, 0.9, 0.2, 0.5]), np.array([0, 3, 4]), np.array([2, 0, 1])).tolist()
    [4, 1, 3]
    """
    ends = np.append(starts[1:], len(scores))[docs]
    lens = ends - starts[docs]
    offsets = np.cumsum(lens) - lens  # each document's first place in the gathered chunks
    rows = np.repeat(starts[docs] - offsets, lens) + np.arange(int(lens.sum()))
    gathered = scores[rows]
    best = np.repeat(np.maximum.reduceat(gathered, offsets), lens)
    firsts = np.flatnonzero(gathered == best)
    return rows[firsts[np.searchsorted(firsts, offsets)]].astype(np.int64)


def _prefiltered(scores: np.ndarray, starts: np.ndarray, k: int, valid: np.ndarray | None, min_score: float | None,
                 one_per_doc: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """The documents that can be in the top ``k`` and their scores, found without a pass over every document:
    ``theta`` is a score that about ``2k`` chunks reach, read from a sample of every :data:`PREFILTER_STRIDE`-th
    chunk; only chunks scoring ``>= theta`` are kept. When at least ``k`` allowed documents have such a chunk, the
    ``k``-th best document scores ``>= theta``, so every document of the top ``k`` is among them, and its best chunk
    too: the answer is exactly the full pass's. Otherwise (a sample that guessed too high, a filter, too few
    matches) None: the caller does the full pass. Over a million chunks: 0.3 ms against 0.9 (finding the nonzero
    scores and partitioning them, BM25's dense score array)."""
    sample = scores[::PREFILTER_STRIDE]
    r = -(-2 * k // PREFILTER_STRIDE)  # ~2k chunks score at least the r-th best of the sample
    if r >= len(sample):
        return None
    theta = -np.partition(-sample, r - 1)[r - 1]  # the r-th best sampled score (partitioning negated scores
    if min_score is not None and not theta > min_score:  # from the front is fast; from the back it is not)
        return None
    chunks = np.flatnonzero(scores >= theta)
    docs = chunks if one_per_doc else np.searchsorted(starts, chunks, side="right") - 1
    if valid is not None:
        keep = valid[docs]
        chunks, docs = chunks[keep], docs[keep]
    if len(docs) < k:
        return None
    if one_per_doc:
        return docs, scores[chunks]
    first = np.flatnonzero(np.diff(docs, prepend=-1))  # chunks ascend, so each document's chunks are adjacent
    if len(first) < k:
        return None
    return docs[first], np.maximum.reduceat(scores[chunks], first)


def top_docs_from_chunk_hits(chunk_ids: np.ndarray, chunk_scores: np.ndarray, chunk_doc: np.ndarray, k: int) -> Hits:
    """Best ``k`` documents from a ranked chunk list (ids best first, -1 = padding): first chunk seen per doc wins.

    >>> h = top_docs_from_chunk_hits(np.array([4, 5, 1, -1]), np.array([.9, .8, .7, 0]), np.array([0, 0, 1, 1, 2, 2]), 5)
    >>> h.doc.tolist(), h.chunk.tolist()
    ([2, 0], [4, 1])
    """
    valid = chunk_ids >= 0
    chunk_ids, chunk_scores = chunk_ids[valid], chunk_scores[valid]
    docs = chunk_doc[chunk_ids]
    _, first = np.unique(docs, return_index=True)
    first.sort()  # keep rank order
    first = first[:k]
    return Hits(docs[first].astype(np.int64), chunk_scores[first].astype(np.float32),
                chunk_ids[first].astype(np.int64))
