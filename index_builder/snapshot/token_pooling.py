"""Hierarchical token pooling at build (Clavie et al. 2024): each passage's token vectors clustered by Ward's method
into ``t // factor`` clusters, each replaced by its renormalised mean. A build-time transform of the token store,
before any codec quantises it (:mod:`index_builder.snapshot.token_codes`, ``poolN`` specs); positions are lost. Pure numpy, scipy
for the linkage."""

from __future__ import annotations

import numpy as np

from index_builder.settings import POOL_METHODS  # noqa: F401  (the methods, named in the codec spec)


def pool_passage(vectors: np.ndarray, factor: int, method: str = "ward") -> np.ndarray:
    """:func:`pool_passage_groups` without the groups.

    >>> v = np.array([[1, 0], [0.99, 0.14], [0, 1], [0.1, 0.99]], dtype=np.float32)
    >>> pool_passage(v, 2).astype(np.float64).round(2).tolist()  # the two near-duplicate pairs merge
    [[1.0, 0.07], [0.05, 1.0]]
    """
    return pool_passage_groups(vectors, factor, method)[0]


def pool_passage_groups(vectors: np.ndarray, factor: int, method: str = "ward") -> tuple[np.ndarray, np.ndarray]:
    """One passage's token vectors [t, d] pooled into ``max(t // factor, 1)`` unit rows (float32 [t', d], in order
    of each cluster's first token): Ward linkage, clusters cut by count (``fcluster maxclust``), each replaced by
    its mean, renormalised. ``method``: ``ward`` over the unit vectors themselves; ``colbert`` over the rows of
    ``1 - cosine`` (what Stanford ColBERT's ``pool_embeddings_hierarchical`` passes to scipy).

    Also each token's pooled row (int64 [t]): the group it joined, so a similarity of a pooled row can be given
    back to the tokens (and their characters) it stands for (highlights, the cross-encoder's windows).

    >>> v = np.array([[1, 0], [0, 1], [0.99, 0.14], [0.1, 0.99]], dtype=np.float32)
    >>> pool_passage_groups(v, 2)[1].tolist()  # tokens 0 and 2 share a row, tokens 1 and 3 the other
    [0, 1, 0, 1]
    """
    x = np.asarray(vectors, dtype=np.float32)
    t = len(x)
    if factor <= 1 or t <= 1:
        return x.copy(), np.arange(t, dtype=np.int64)
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    unit32 = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    gram = (unit32 @ unit32.T).astype(np.float64)  # float32 GEMM (~14x faster than float64 here), float64 after
    if method == "ward":  # Euclidean distances between unit vectors, from one product: sqrt(2 - 2 cos)
        dist = np.sqrt(np.maximum(2.0 - 2.0 * gram, 0.0))
    else:  # the rows of 1 - cos taken as observations, as Stanford ColBERT does
        rows = 1.0 - gram
        sq = (rows * rows).sum(axis=1)
        dist = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * rows @ rows.T, 0.0))
    np.fill_diagonal(dist, 0.0)
    z = linkage(squareform(dist, checks=False), method="ward")
    labels = fcluster(z, t=max(t // factor, 1), criterion="maxclust")
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # clusters in order of their first token
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    cluster = rank[inverse.ravel()]
    members = np.argsort(cluster, kind="stable")  # tokens grouped by cluster, in token order within each
    starts = np.searchsorted(cluster[members], np.arange(len(order)))
    sums = np.add.reduceat(unit32[members].astype(np.float64), starts, axis=0)
    pooled = (sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)).astype(np.float32)
    return pooled, cluster.astype(np.int64)


def pool_tokens(vectors: np.ndarray, offsets: np.ndarray, factor: int, method: str = "ward"
                ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pool_passage` over every passage of a store: (float32 [T', d], int64 offsets [n + 1]).

    >>> v = np.eye(4, dtype=np.float32)
    >>> p, o = pool_tokens(v, np.array([0, 3, 4]), 2)
    >>> p.shape, o.tolist()
    ((2, 4), [0, 1, 2])
    """
    return pool_tokens_grouped(vectors, offsets, factor, method)[:2]


def pool_tokens_grouped(vectors: np.ndarray, offsets: np.ndarray, factor: int, method: str = "ward"
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`pool_tokens` and every original token's row within its passage's pooled rows (int64 [T], passage i's
    tokens at the input ``offsets[i]:offsets[i + 1]``)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    if factor <= 1:
        groups = np.arange(int(offsets[-1] - offsets[0]), dtype=np.int64) - np.repeat(
            offsets[:-1] - offsets[0], np.diff(offsets))
        return np.asarray(vectors, dtype=np.float32), offsets.copy(), groups
    out, lengths, groups = [], [], []
    for i in range(len(offsets) - 1):
        pooled, group = pool_passage_groups(vectors[offsets[i]:offsets[i + 1]], factor, method)
        out.append(pooled)
        lengths.append(len(pooled))
        groups.append(group)
    dim = vectors.shape[1]
    flat = np.concatenate(out) if out else np.zeros((0, dim), np.float32)
    return (flat.reshape(-1, dim), np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64),
            np.concatenate(groups) if groups else np.zeros(0, np.int64))
