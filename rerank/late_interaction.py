"""Late-interaction stage: reorder the top K of a ranking by MaxSim against precomputed document token vectors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from index_builder.snapshot.token_codes import TokenCodes, pooled, stored_codec
from rerank.interpolation import blend_with_prior
from rerank.maxsim import token_maxsims

SCORES = ("maxsim", "token_z")


@dataclass(frozen=True)
class Reordering:
    """``order``: a permutation of the input positions (best first); ``scores``: the stage's score per position
    of ``order`` for the reranked head, NaN for the untouched tail."""

    order: np.ndarray
    scores: np.ndarray


def rerank_head(first_scores: np.ndarray, n: int, weight: float = 1.0) -> Reordering:
    """Order the head (by descending score, stable) and keep the tail as it was. ``weight`` < 1 blends the
    scores with the head's incoming order (:func:`rerank.interpolation.blend_with_prior`); the head then carries
    the blended scores.

    >>> rerank_head(np.array([0.1, 0.9, 0.5]), 5).order.tolist()
    [1, 2, 0, 3, 4]
    >>> rerank_head(np.array([0.1, 0.9, 0.5]), 5, weight=0.0).order.tolist()
    [0, 1, 2, 3, 4]
    """
    first_scores = blend_with_prior(first_scores, weight)
    head = np.argsort(-first_scores, kind="stable")
    order = np.concatenate([head, np.arange(len(first_scores), n)]).astype(np.int64)
    scores = np.concatenate([first_scores[head], np.full(n - len(first_scores), np.nan)]).astype(np.float32)
    return Reordering(order, scores)


def head_scores(per_token: np.ndarray, score: str = "maxsim") -> np.ndarray:
    """The head's scores from its per-token best similarities ``per_token`` [head, q] (see
    :meth:`LateInteractionReranker.scores`), float32 [head].

    >>> t = np.array([[0.9, 0.2], [0.5, 0.9], [0.7, 0.3]], dtype=np.float32)
    >>> [round(float(x), 2) for x in head_scores(t)]  # MaxSim: raw similarities summed; passage 1 leads
    [1.1, 1.4, 1.0]
    >>> np.argsort(-head_scores(t, "token_z")).tolist()  # each token z-scored over the head: passage 0 leads
    [0, 1, 2]
    """
    if score == "maxsim":
        return per_token.sum(axis=1).astype(np.float32)
    if score == "token_z":
        z = (per_token - per_token.mean(axis=0)) / (per_token.std(axis=0) + 1e-6)
        return z.mean(axis=1).astype(np.float32)
    raise ValueError(f"unknown late-interaction score {score!r} (known: {', '.join(SCORES)})")


class LateInteractionReranker:
    """MaxSim over the candidate chunks' stored token vectors: ``vectors`` [T, d] float16, or int8 with per-vector
    ``scales`` [T] (``storage`` ``float16`` / ``int8``), or the codes of a compact store (``storage`` a codec spec
    of :mod:`index_builder.snapshot.token_codes` such as ``pool3+bins``: packed codes [T, B], ``scales`` [T] where the codec has
    them, scored on the codes); ``offsets`` [chunks + 1]. A pooled store may give ``groups`` with ``group_offsets``
    (each original token's pooled row, :class:`index_builder.snapshot.token_codes.TokenCodes`): then :meth:`token_sims` has
    positions. Any array may be a memmap: only the head's rows are read."""

    def __init__(self, vectors: np.ndarray, offsets: np.ndarray, scales: np.ndarray | None = None,
                 storage: str = "int8", groups: np.ndarray | None = None,
                 group_offsets: np.ndarray | None = None) -> None:
        self.vectors = vectors
        self.offsets = offsets
        self.scales = scales
        self.storage = storage
        self.groups = groups
        self.group_offsets = group_offsets
        self.codec = stored_codec(storage, int(vectors.shape[1])) if vectors.ndim == 2 else None
        self.pooled = pooled(storage)
        self._codes = None if self.codec is None else TokenCodes(vectors, offsets, scales)

    def token_maxsims(self, query_tokens: np.ndarray, head: np.ndarray) -> np.ndarray:
        """Each query token's best similarity in each head chunk: float32 [len(head), q]."""
        head = np.asarray(head, dtype=np.int64)
        if self.codec is not None:
            assert self._codes is not None
            return self.codec.token_maxsims(np.asarray(query_tokens, dtype=np.float32), self._codes, head)
        return token_maxsims(query_tokens, self.vectors, self.offsets, head, self.scales)

    def scores(self, query_tokens: np.ndarray, head: np.ndarray, score: str = "maxsim") -> np.ndarray:
        """One score per head chunk, float32 [len(head)]: ``maxsim`` (the sum over query tokens of each token's
        best similarity) or ``token_z`` (each query token's best similarities z-scored over the head, averaged:
        every query token gets the same say, whatever the spread of its similarities)."""
        return head_scores(self.token_maxsims(query_tokens, head), score)  # [head, q] -> [head]

    def decoded(self, chunk: int) -> np.ndarray:
        """The vectors ``chunk``'s stored tokens stand for: float32 [t, d] (a codec's decoded vectors; MaxSim over
        them equals :meth:`token_maxsims` up to float rounding). What an engine that stores floats is given."""
        lo, hi = int(self.offsets[chunk]), int(self.offsets[chunk + 1])
        if self.codec is not None:
            assert self._codes is not None
            return self.codec.decode(self._codes, np.arange(lo, hi))
        tokens = np.asarray(self.vectors[lo:hi], dtype=np.float32)
        if self.scales is not None:
            tokens *= np.asarray(self.scales[lo:hi], dtype=np.float32)[:, None]
        return tokens

    def token_sims(self, query_tokens: np.ndarray, chunk: int) -> np.ndarray | None:
        """Every stored token of ``chunk`` against every query token: float32 [t, q] (the input of
        :func:`rerank.windows.best_window` and of highlights). A pooled store gives each original token its pooled
        row's similarities, through the groups kept at build; without them (a store from before they were kept)
        None: its vectors stand for clusters of tokens and have no positions."""
        if self.pooled and (self.groups is None or self.group_offsets is None):
            return None
        if self.codec is not None:
            assert self._codes is not None
            lo, hi = int(self.offsets[chunk]), int(self.offsets[chunk + 1])
            sims = self.codec.similarities(np.asarray(query_tokens, dtype=np.float32), self._codes, np.arange(lo, hi))
            if self.pooled:
                assert self.groups is not None and self.group_offsets is not None
                g = np.asarray(self.groups[int(self.group_offsets[chunk]):int(self.group_offsets[chunk + 1])],
                               dtype=np.int64)
                return sims[g]
            return sims
        return self.decoded(chunk) @ np.asarray(query_tokens, dtype=np.float32).T

    def rerank(self, query_tokens: np.ndarray, chunks: np.ndarray, top_k: int, weight: float = 1.0,
               score: str = "maxsim") -> Reordering:
        """Reorder the first ``top_k`` of ``chunks`` (int [n], each candidate's passage) by :meth:`scores`
        (blended with the incoming order when ``weight`` < 1)."""
        head = np.asarray(chunks[:top_k], dtype=np.int64)
        return rerank_head(self.scores(query_tokens, head, score), len(chunks), weight)
