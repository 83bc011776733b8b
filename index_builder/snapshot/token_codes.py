"""Compact token stores for late interaction: the stateless codecs an index stores its token vectors with, and
MaxSim on their codes.

A plain store keeps every token's vector: 384 int8 dims plus a float32 scale (388 B). A :class:`TokenCodec` turns
a passage's token vectors into fewer bytes in up to two steps, neither fitted on the corpus (a build codes each
batch as it is embedded, with no pass over the corpus first; ``check_storage`` in :mod:`index_builder.settings`
names what an index may store):

1. **pooling** (``poolN``, :mod:`index_builder.snapshot.token_pooling`): the passage's tokens clustered by Ward's
   method over the unit vectors into ``t // N`` clusters, each replaced by its renormalised mean (Clavie et al. 2024;
   at build only, so positions are lost: a pooled store gives no token similarities for windows);
2. **quantisation** of each vector ``y``, one of:

   * ``int8``: symmetric per-vector int8 with a float32 scale (``y ~= c * s``, ``s = max|y| / 127``);
   * ``int4``: symmetric per-vector 4-bit (levels -7..7) with a float16 scale, two dims per byte;
   * ``bin``: 1-bit sign (``y ~= sign(y)``, the values -1 and +1), scored asymmetrically: the float query against
     the signs (Vespa's binarised ColBERT); ``bins`` adds a float16 per-vector scale ``mean|y|``.

A spec names the steps, ``+``-joined, in any order: ``"int8"``, ``"pool3+bins"`` (:class:`CodecSpec`). MaxSim is
computed on the codes, never on vectors decoded first: the codes of the head's tokens are unpacked to small integers
and one matrix product with the query gives every similarity; per-vector scales and constant terms are added to
the product. :meth:`TokenCodec.token_maxsims` has the contract of :func:`rerank.maxsim.token_maxsims` and, for
``int8``, the same arithmetic (bit-identical scores).

The codecs fitted on a corpus (a PCA projection, ColBERTv2 / PLAID residual codes over k-means centroids) were
measured by the token-codes study and not chosen (docs/results/token-codes.md); they live with the study, as a
subclass of :class:`TokenCodec` (``bench/studies/token_codes.py``), and an index cannot store them.

Shapes: ``d`` the token encoder's dimension, ``T`` tokens, ``n`` passages; every array is numpy. Pure numpy; scipy
(a dependency of pytrec-eval-terrier) for Ward's linkage.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import numpy as np

from index_builder.settings import STORAGES, CodecSpec, check_storage, is_stateless
from index_builder.snapshot.token_pooling import pool_tokens_grouped

BITS = {"int8": 8, "int4": 4, "bin": 1, "bins": 1}  # bits per coded dim of each stateless quantiser


# ------------------------------------------------------------------------------------------------ the codes


@dataclass
class TokenCodes:
    """A coded token store: ``codes`` [T, B] (int8 for ``int8``, packed uint8 otherwise), ``offsets`` int64
    [n + 1] (passage i owns rows ``offsets[i]:offsets[i + 1]``), ``scales`` [T] (float32 for ``int8``, float16 for
    ``int4`` / ``bins``) or None. A pooled store also keeps ``groups`` (uint8 [tokens before pooling]: each original
    token's row among its passage's pooled rows) with ``group_offsets`` [n + 1], so a pooled row's similarity can be
    given back to the tokens it stands for (:meth:`rerank.late_interaction.LateInteractionReranker.token_sims`). Any
    array may be a memmap. ``ROWS``: the arrays with one row per stored vector and the file each is saved as (a
    subclass with more per-row arrays adds them)."""

    codes: np.ndarray
    offsets: np.ndarray
    scales: np.ndarray | None = None
    groups: np.ndarray | None = None
    group_offsets: np.ndarray | None = None
    ROWS: ClassVar[dict[str, str]] = {"codes": "token_codes", "scales": "token_scales"}

    @property
    def passages(self) -> int:
        return len(self.offsets) - 1

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1]) if len(self.offsets) else 0

    @property
    def nbytes(self) -> int:
        """Bytes of every array."""
        return int(sum(a.nbytes for a in (getattr(self, f.name) for f in fields(self)) if a is not None))

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The arrays to save (``np.save(f"{name}.npy", a)`` each); :meth:`from_arrays` reads them back."""
        out = {name: getattr(self, attr) for attr, name in self.ROWS.items() if getattr(self, attr) is not None}
        out["token_offsets"] = self.offsets
        if self.groups is not None and self.group_offsets is not None:
            out["token_groups"], out["token_group_offsets"] = self.groups, self.group_offsets
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> TokenCodes:
        go = arrays.get("token_group_offsets")
        rows: dict[str, Any] = {attr: arrays.get(name) for attr, name in cls.ROWS.items()}
        rows["codes"] = arrays["token_codes"]
        return cls(offsets=np.asarray(arrays["token_offsets"], dtype=np.int64), groups=arrays.get("token_groups"),
                   group_offsets=None if go is None else np.asarray(go, dtype=np.int64), **rows)

    @classmethod
    def concat(cls, parts: Sequence[TokenCodes]) -> TokenCodes:
        """Several stores back to back (passages in order): what a build writing in blocks assembles.

        >>> a = TokenCodes(np.ones((2, 1), np.uint8), np.array([0, 2]))
        >>> b = TokenCodes(np.zeros((3, 1), np.uint8), np.array([0, 1, 3]))
        >>> TokenCodes.concat([a, b]).offsets.tolist()
        [0, 2, 3, 5]
        """
        if not parts:
            raise ValueError("nothing to concatenate")
        offsets, base = [np.zeros(1, np.int64)], 0
        for p in parts:
            offsets.append(np.asarray(p.offsets[1:], dtype=np.int64) + base)
            base += p.tokens

        def cat(name: str) -> np.ndarray | None:
            arrays = [getattr(p, name) for p in parts]
            if all(a is None for a in arrays):
                return None
            if any(a is None for a in arrays):
                raise ValueError(f"some parts have {name}, some do not")
            return np.concatenate([np.asarray(a) for a in arrays])

        rows: dict[str, Any] = {attr: cat(attr) for attr in cls.ROWS}
        assert rows["codes"] is not None
        group_offsets: np.ndarray | None = None
        if all(p.groups is not None and p.group_offsets is not None for p in parts):
            steps, base = [np.zeros(1, np.int64)], 0
            for p in parts:
                assert p.group_offsets is not None
                steps.append(np.asarray(p.group_offsets[1:], dtype=np.int64) + base)
                base += int(p.group_offsets[-1])
            group_offsets = np.concatenate(steps)
        return cls(offsets=np.concatenate(offsets), groups=cat("groups") if group_offsets is not None else None,
                   group_offsets=group_offsets, **rows)

    def rows(self, head: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The token rows of passages ``head`` (int [h]), back to back, and each passage's token count: (int64
        [sum], int64 [h]).

        >>> TokenCodes(np.zeros((5, 1), np.uint8), np.array([0, 2, 2, 5])).rows(np.array([2, 0]))[0].tolist()
        [2, 3, 4, 0, 1]
        """
        head = np.asarray(head, dtype=np.int64)
        starts, ends = self.offsets[head], self.offsets[head + 1]
        lengths = (ends - starts).astype(np.int64)
        total = int(lengths.sum())
        if total == 0:
            return np.zeros(0, np.int64), lengths
        shift = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
        return (np.arange(total, dtype=np.int64) + shift).astype(np.int64), lengths


# ------------------------------------------------------------------------------------------------ packing


def _pack_nibbles(u: np.ndarray) -> np.ndarray:
    """uint8 [n, m] values 0..15 -> uint8 [n, m/2]: byte j holds dim j (low nibble) and dim j + m/2 (high)."""
    h = u.shape[1] // 2
    return (u[:, :h] | (u[:, h:] << 4)).astype(np.uint8)


def _unpack_nibbles(p: np.ndarray) -> np.ndarray:
    out = np.empty((len(p), 2 * p.shape[1]), np.uint8)
    h = p.shape[1]
    np.bitwise_and(p, 15, out=out[:, :h])
    np.right_shift(p, 4, out=out[:, h:])
    return out


def quantize_int8(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-vector int8, the ``int8`` store's (index_builder.models.token_encoders uses this one): (int8 [n, m],
    float32 scale [n]), ``v ~= q * scale``, ``scale = max|v| / 127``.

    >>> q, s = quantize_int8(np.array([[0.5, -1.0], [0.0, 0.0]], dtype=np.float32))
    >>> q.tolist(), [round(float(x), 5) for x in s]
    ([[64, -127], [0, 0]], [0.00787, 0.0])
    """
    v = np.asarray(vectors, dtype=np.float32)
    scale = np.abs(v).max(axis=1) / 127.0 if len(v) else np.zeros(0, np.float32)
    safe = np.where(scale > 0, scale, 1.0)
    q = np.clip(np.rint(v / safe[:, None]), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


# ------------------------------------------------------------------------------------------------ the codec


@dataclass
class TokenCodec:
    """A stateless codec (see the module docstring): ``spec`` and the token vectors' dimension ``dim``; nothing is
    fitted, so any two codecs of one spec and dimension code alike. A spec that needs fitting (``pca``, ``res*``)
    is refused, naming where such codecs live. A subclass that fits (``FITTED``) extends the hooks :meth:`project`,
    :meth:`query_terms`, :meth:`encode`, :meth:`_decode_coded` and :meth:`_similarities_coded`; ``CODES`` is the
    store type :meth:`encode` makes."""

    spec: CodecSpec
    dim: int
    FITTED: ClassVar[bool] = False
    CODES: ClassVar[type[TokenCodes]] = TokenCodes

    def __post_init__(self) -> None:
        if not (self.FITTED or is_stateless(self.spec)):
            raise ValueError(f"codec {self.spec} needs fitting on a corpus (pca, res*): such codecs are the "
                             f"token-codes study's (bench/studies/token_codes.py), not an index storage")

    @property
    def bits(self) -> int:
        """Bits per coded dim."""
        return BITS[self.spec.quant]

    @property
    def coded_dim(self) -> int:
        """Dims per coded vector (``dim``: a stateless codec projects nothing)."""
        return self.dim

    @property
    def bytes_per_token(self) -> int:
        """Stored bytes per token vector: codes and scale (offsets not counted)."""
        return self.coded_dim * self.bits // 8 + {"int8": 4, "int4": 2, "bins": 2}.get(self.spec.quant, 0)

    def describe(self) -> dict[str, Any]:
        """What a manifest records."""
        return {"spec": str(self.spec), "dim": self.dim, "coded_dim": self.coded_dim,
                "bytes_per_token": self.bytes_per_token}

    # ---- coding

    def project(self, x: np.ndarray) -> np.ndarray:
        """Vectors [n, d] in the coded space: float32 [n, m] (the vectors themselves here)."""
        return np.asarray(x, dtype=np.float32)

    def encode(self, vectors: np.ndarray) -> TokenCodes:
        """Token vectors float [T, d] as one passage's codes (no pooling: see :meth:`encode_passages`)."""
        v = np.asarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        y = self.project(v)
        q = self.spec.quant
        offsets = np.array([0, len(v)], np.int64)
        if q == "int8":
            codes, scales = quantize_int8(y)
            return self.CODES(codes, offsets, scales)
        if q == "int4":
            s = (np.abs(y).max(axis=1) / 7.0 if len(y) else np.zeros(0, np.float32)).astype(np.float16)
            safe = np.where(s > 0, s.astype(np.float32), 1.0)
            u = (np.clip(np.rint(y / safe[:, None]), -7, 7) + 8).astype(np.uint8)
            return self.CODES(_pack_nibbles(u), offsets, s)
        if q in ("bin", "bins"):
            mean_abs = np.abs(y).mean(axis=1).astype(np.float16) if q == "bins" else None
            return self.CODES(np.packbits(y > 0, axis=1), offsets, mean_abs)
        raise ValueError(f"{type(self).__name__} cannot code {q}")

    def encode_passages(self, vectors: np.ndarray, offsets: np.ndarray) -> TokenCodes:
        """Every passage's token vectors (float [T, d], ``offsets`` int [n + 1]) pooled (when the spec pools) and
        coded: the store of ``n`` passages."""
        offsets = np.asarray(offsets, dtype=np.int64)
        if self.spec.pool > 1:
            group_offsets = (offsets - offsets[0]).astype(np.int64)
            vectors, offsets, groups = pool_tokens_grouped(vectors, offsets, self.spec.pool, self.spec.pool_method)
            small = len(groups) == 0 or int(groups.max()) < 256
            return replace(self.encode(vectors), offsets=offsets.astype(np.int64),
                           groups=groups.astype(np.uint8 if small else np.uint16), group_offsets=group_offsets)
        vectors = np.asarray(vectors[offsets[0]:offsets[-1]], dtype=np.float32)
        offsets = offsets - offsets[0]
        return replace(self.encode(vectors), offsets=offsets.astype(np.int64))

    def decode(self, codes: TokenCodes, rows: np.ndarray | None = None) -> np.ndarray:
        """The vectors the codes stand for: float32 [len(rows), d] (every row by default)."""
        rows = np.arange(len(codes.codes)) if rows is None else np.asarray(rows, dtype=np.int64)
        return self._decode_coded(codes, rows)

    def _decode_coded(self, codes: TokenCodes, rows: np.ndarray) -> np.ndarray:
        q, m = self.spec.quant, self.coded_dim
        c = np.asarray(codes.codes[rows])
        if q == "int8":
            assert codes.scales is not None
            return c.astype(np.float32) * np.asarray(codes.scales[rows], dtype=np.float32)[:, None]
        if q == "int4":
            assert codes.scales is not None
            return ((_unpack_nibbles(c).astype(np.float32) - 8.0)
                    * np.asarray(codes.scales[rows], dtype=np.float32)[:, None])
        if q in ("bin", "bins"):
            s = np.unpackbits(c, axis=1, count=m).astype(np.float32) * 2.0 - 1.0
            return s if codes.scales is None else s * np.asarray(codes.scales[rows], dtype=np.float32)[:, None]
        raise ValueError(f"{type(self).__name__} cannot decode {q}")

    # ---- scoring

    def query_terms(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The query tokens float32 [q, d] in the coded space [q, m], and a constant added to every similarity of
        each query token ([q], or None): the query itself and nothing here."""
        return query, None

    def similarities(self, query: np.ndarray, codes: TokenCodes, rows: np.ndarray) -> np.ndarray:
        """Every coded token ``rows`` (int [r]) against every query token (float [q, d]): float32 [r, q], computed
        on the codes (equal to ``decode(codes, rows) @ query.T`` up to float rounding)."""
        qy, const = self.query_terms(np.asarray(query, dtype=np.float32))
        sims = self._similarities_coded(qy, codes, rows)
        if const is not None:
            sims += const
        return sims.astype(np.float32, copy=False)

    def _similarities_coded(self, qy: np.ndarray, codes: TokenCodes, rows: np.ndarray) -> np.ndarray:
        quant, m = self.spec.quant, self.coded_dim
        c = np.asarray(codes.codes[rows])
        if quant == "int8":
            assert codes.scales is not None  # the plain int8 store's arithmetic exactly (rerank.maxsim.token_maxsims)
            tokens = c.astype(np.float32)
            tokens *= np.asarray(codes.scales[rows], dtype=np.float32)[:, None]
            return tokens @ qy.T
        if quant == "int4":
            assert codes.scales is not None
            h = m // 2
            sims = (np.bitwise_and(c, 15).astype(np.float32) @ qy[:, :h].T
                    + np.right_shift(c, 4).astype(np.float32) @ qy[:, h:].T - 8.0 * qy.sum(axis=1))
            sims *= np.asarray(codes.scales[rows], dtype=np.float32)[:, None]
            return sims
        if quant in ("bin", "bins"):
            bits = np.unpackbits(c, axis=1, count=m).astype(np.float32)
            sims = bits @ (2.0 * qy.T) - qy.sum(axis=1)
            if codes.scales is not None:
                sims *= np.asarray(codes.scales[rows], dtype=np.float32)[:, None]
            return sims
        raise ValueError(f"{type(self).__name__} cannot score {quant}")

    def token_maxsims(self, query: np.ndarray, codes: TokenCodes, head: np.ndarray) -> np.ndarray:
        """MaxSim of one query against the passages ``head`` (int [h]): float32 [h, q], each query token's best
        similarity in each passage (0 for an empty passage): the contract of :func:`rerank.maxsim.token_maxsims`."""
        head = np.asarray(head, dtype=np.int64)
        out = np.zeros((len(head), len(query)), dtype=np.float32)
        if len(head) == 0:
            return out
        rows, lengths = codes.rows(head)
        if len(rows) == 0:
            return out
        sims = self.similarities(query, codes, rows)
        nonempty = lengths > 0
        seg_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])[nonempty]
        out[nonempty] = np.maximum.reduceat(sims, seg_starts, axis=0)
        return out

    def maxsim(self, query: np.ndarray, codes: TokenCodes, head: np.ndarray) -> np.ndarray:
        """MaxSim scores of the passages ``head``: float32 [h] (the sum over query tokens of :meth:`token_maxsims`)."""
        return self.token_maxsims(query, codes, head).sum(axis=1)



# ------------------------------------------------------------------------------------------------ stored forms

PLAIN_STORAGES = STORAGES  # stored vectors as they are (rerank.maxsim.token_maxsims scores them)


@functools.lru_cache(maxsize=64)
def stored_codec(storage: str, width: int) -> TokenCodec | None:
    """The codec that reads a store of ``storage`` whose rows are ``width`` values (bytes for packed codes) wide;
    None for the plain storages. Cached: a stateless codec holds no arrays, and the live index asks per query and
    buffered segment.

    >>> stored_codec("pool3+bins", 48).dim, stored_codec("int8", 384)
    (384, None)
    """
    if storage in PLAIN_STORAGES:
        return None
    spec = CodecSpec.parse(check_storage(storage))
    return TokenCodec(spec, width * 8 // BITS[spec.quant])


@functools.lru_cache(maxsize=64)
def pooled(storage: str) -> bool:
    """Whether a store of ``storage`` keeps one vector per cluster of tokens rather than per token."""
    return storage not in PLAIN_STORAGES and CodecSpec.parse(storage).pool > 1
