"""The dense index a snapshot keeps, by corpus size (``[dense] index``; what each costs is measured in
``bench/scale.py``):

- ``hnsw``: ~1.8 KB in RAM per chunk (384 dims: float32 vectors + the graph's links); HNSW over the exact vectors.
- ``hnsw_sq8``: ~0.64 KB (8-bit codes + links); HNSW over the codes, then the best ``rescore`` x candidates
  re-scored from the float vectors (memory-mapped, read for those rows only).
- ``ivf_pq``: ~70 B (48-byte product codes, list ids); ``nprobe`` inverted lists, re-scored as above.

``auto`` picks by the number of chunks (:func:`choose`). The float vectors stay in the snapshot
(``vectors.npy``) whatever the kind: exact search, rescoring and rebuilds read them.
"""

from __future__ import annotations

import math

import faiss
import numpy as np

from index_builder.settings import HNSWConfig
from index_builder.snapshot.row_file import release_pages

KINDS = ("hnsw", "hnsw_sq8", "ivf_pq")
FILES = {"hnsw": "hnsw.faiss", "hnsw_sq8": "hnsw_sq8.faiss", "ivf_pq": "ivf_pq.faiss"}
AUTO_SQ8_FROM = 250_000  # chunks: below, float HNSW (~0.45 GB of vectors at 250k); from here, 8-bit codes
AUTO_IVF_PQ_FROM = 5_000_000  # from here, IVF-PQ (a 5M HNSW-SQ8 graph is ~3 GB of RAM)
TRAIN_SAMPLE = 100_000  # vectors the quantisers are trained on (a seeded sample)
TRAIN_BLOCK = 16_384  # rows of the vectors' map read at a time for the sample
PQ_M = 48  # sub-quantisers of IVF-PQ: 384 / 48 = 8 dimensions each, one byte each


def choose(kind: str, n_chunks: int) -> str:
    """The kind to build for ``n_chunks`` (``auto`` by size).

    >>> choose("auto", 10_000), choose("auto", 1_000_000), choose("auto", 10_000_000), choose("hnsw", 10**7)
    ('hnsw', 'hnsw_sq8', 'ivf_pq', 'hnsw')
    """
    if kind == "auto":
        return "hnsw" if n_chunks < AUTO_SQ8_FROM else "hnsw_sq8" if n_chunks < AUTO_IVF_PQ_FROM else "ivf_pq"
    if kind not in KINDS:
        raise ValueError(f"dense index must be one of auto, {', '.join(KINDS)}, got {kind!r}")
    return kind


def ivf_lists(n_chunks: int) -> int:
    """Inverted lists of IVF-PQ: about 4 sqrt(n), at least 16 (faiss's guidance: 39 training points a list)."""
    return max(16, min(65_536, int(4 * math.sqrt(n_chunks)), n_chunks // 39 or 16))


def make(kind: str, dim: int, n_chunks: int, hnsw: HNSWConfig) -> faiss.Index:
    """An empty index of ``kind`` (inner product on unit vectors)."""
    if kind == "hnsw":
        flat = faiss.IndexHNSWFlat(dim, hnsw.m, faiss.METRIC_INNER_PRODUCT)
        flat.hnsw.efConstruction = hnsw.ef_construction
        return flat
    if kind == "hnsw_sq8":
        sq = faiss.IndexHNSWSQ(dim, faiss.ScalarQuantizer.QT_8bit, hnsw.m,  # type: ignore[arg-type]
                               faiss.METRIC_INNER_PRODUCT)
        sq.hnsw.efConstruction = hnsw.ef_construction
        return sq
    if kind == "ivf_pq":
        quantizer = faiss.IndexFlatIP(dim)
        m = PQ_M if dim % PQ_M == 0 else next(d for d in (32, 24, 16, 12, 8, 4, 2, 1) if dim % d == 0)
        return faiss.IndexIVFPQ(quantizer, dim, ivf_lists(n_chunks), m, 8, faiss.METRIC_INNER_PRODUCT)
    raise ValueError(f"unknown dense index kind {kind!r}")


def train(index: faiss.Index, vectors: np.ndarray, seed: int = 0) -> None:
    """Train the quantisers (``hnsw_sq8``, ``ivf_pq``) on a seeded sample of ``vectors`` (rows read from a
    memory-mapped array); nothing for ``hnsw``."""
    if index.is_trained:
        return
    n = len(vectors)
    rows = np.sort(np.random.default_rng(seed).choice(n, min(n, TRAIN_SAMPLE), replace=False))
    sample = np.empty((len(rows), vectors.shape[1]), dtype=np.float32)
    for a in range(0, n, TRAIN_BLOCK):  # a block of the map at a time, its pages dropped after (a sample spread
        sel = np.flatnonzero((rows >= a) & (rows < a + TRAIN_BLOCK))  # over the file touches all of it: at 1M,
        sample[sel] = vectors[rows[sel]]  # 1.5 GB of mapped pages at once)
        release_pages(vectors)
    index.train(sample)


def search_params(index: faiss.Index, ef_search: int, nprobe: int,
                  sel: faiss.IDSelector | None) -> faiss.SearchParameters:
    """faiss's search parameters for ``index``: ``efSearch`` for HNSW kinds, ``nprobe`` for IVF."""
    params: faiss.SearchParameters
    if isinstance(index, faiss.IndexIVF):
        ivf = faiss.SearchParametersIVF()
        ivf.nprobe = nprobe
        params = ivf
    else:
        hnsw = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]
        hnsw.efSearch = ef_search
        params = hnsw
    if sel is not None:
        params.sel = sel
    return params
