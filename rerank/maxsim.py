"""MaxSim (ColBERT late interaction) as pure numpy."""

from __future__ import annotations

import numpy as np


def maxsim(query: np.ndarray, doc: np.ndarray) -> float:
    """Sum over query vectors of the best dot product with any document vector.

    Shapes: ``query`` [q, d], ``doc`` [t, d] (both unit rows for cosine); returns a float (0.0 for an empty doc).

    >>> q = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> d = np.array([[0.6, 0.8], [1.0, 0.0]])
    >>> round(maxsim(q, d), 3)  # max(0.6, 1.0) + max(0.8, 0.0)
    1.8
    """
    if len(doc) == 0:
        return 0.0
    return float((query.astype(np.float32) @ doc.astype(np.float32).T).max(axis=1).sum())


def maxsim_batch(query: np.ndarray, vectors: np.ndarray, offsets: np.ndarray, rows: np.ndarray,
                 scales: np.ndarray | None = None) -> np.ndarray:
    """Per document, the sum over query tokens of :func:`token_maxsims`: float32 [m].

    >>> q = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    >>> v = np.array([[1, 0], [0.6, 0.8], [0, 1], [0.5, 0.5]], dtype=np.float16)
    >>> [round(float(s), 3) for s in maxsim_batch(q, v, np.array([0, 2, 4]), np.array([1, 0]))]
    [1.5, 1.8]
    """
    return token_maxsims(query, vectors, offsets, rows, scales).sum(axis=1)


def token_maxsims(query: np.ndarray, vectors: np.ndarray, offsets: np.ndarray, rows: np.ndarray,
                  scales: np.ndarray | None = None) -> np.ndarray:
    """MaxSim of one query against several documents stored back to back.

    Shapes: ``query`` [q, d]; ``vectors`` [T, d] (all documents' token vectors, any float dtype, or int8 with
    ``scales`` float [T] so that row t is ``vectors[t] * scales[t]``; may be a memmap); ``offsets`` int [n + 1]
    (document i owns ``vectors[offsets[i]:offsets[i + 1]]``); ``rows`` int [m], the documents to score.
    Returns float32 [m, q]: each query token's best dot product in each document (0 for an empty document).
    One matrix product over the gathered tokens, then a segmented max.
    """
    rows = np.asarray(rows, dtype=np.int64)
    out = np.zeros((len(rows), len(query)), dtype=np.float32)
    if len(rows) == 0:
        return out
    starts, ends = offsets[rows], offsets[rows + 1]
    lengths = ends - starts
    if lengths.sum() == 0:
        return out
    idx = np.concatenate([np.arange(s, e) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)])
    tokens = np.asarray(vectors[idx], dtype=np.float32)  # [sum(lengths), d]
    if scales is not None:
        tokens *= np.asarray(scales[idx], dtype=np.float32)[:, None]
    sims = tokens @ query.astype(np.float32).T  # [sum(lengths), q]: contiguous rows, one GEMM
    nonempty = lengths > 0
    seg_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])[nonempty]
    best = np.maximum.reduceat(sims, seg_starts, axis=0)  # [n_nonempty, q]
    out[nonempty] = best
    return out
