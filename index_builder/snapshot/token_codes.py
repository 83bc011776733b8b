"""Compact token stores for late interaction: codecs for the stored token vectors, and MaxSim on their codes.

Today every stored token is its full vector: 384 int8 dims plus a float32 scale (388 B; 95 % of an index). A
:class:`TokenCodec` turns a passage's token vectors into fewer bytes in three optional steps, each fitted at build
on a sample of the corpus's own token vectors and stored with the index (:meth:`TokenCodec.to_arrays`):

1. **pooling** (``poolN``, :mod:`index_builder.snapshot.token_pooling`): the passage's tokens clustered by Ward's method over the
   unit vectors into ``t // N`` clusters, each replaced by its renormalised mean (Clavie et al. 2024; at build
   only, so positions are lost: a pooled store gives no token similarities for windows);
2. **projection** (``pcaM``): onto the top ``M`` principal components of the sample (mean removed); queries are
   projected the same way at scoring time, and ``q . mean`` is added back, so scores are those of the decoded
   vectors ``mean + y @ P``;
3. **quantisation** of the (projected) vector ``y``, one of :data:`QUANTS`:

   * ``int8``: symmetric per-vector int8 with a float32 scale (today's store: ``y ~= c * s``, ``s = max|y| / 127``);
   * ``int4``: symmetric per-vector 4-bit (levels -7..7) with a float16 scale, two dims per byte;
   * ``bin``: 1-bit sign (``y ~= sign(y)``, the values -1 and +1), scored asymmetrically: the float query against
     the signs (Vespa's binarised ColBERT); ``bins`` adds a float16 per-vector scale ``mean|y|``;
   * ``res1`` / ``res2``: ColBERTv2 / PLAID residual codes: the nearest of ``kK`` centroids (faiss k-means) plus the
     residual quantised to 1 or 2 bits per dim on a per-dim uniform grid (offset and step fitted to the sample's
     residuals by least squares); ``k1`` is one centroid (the sample mean): per-dim 1- or 2-bit scalar codes with no
     id stored.

A spec names the steps, ``+``-joined, in any order: ``"int8"`` (today), ``"pool2+pca128+res2+k1024"``
(:class:`CodecSpec`). MaxSim is computed on the codes, never on vectors decoded to the original space: the query's
token vectors are projected once, the codes are unpacked to small integers of the head's tokens only, and one
matrix product with the (per-dim step scaled) query gives every similarity; per-vector scales, the
centroids' share (``C @ q`` once per query, gathered by id) and constant terms are added to the product.
:meth:`TokenCodec.token_maxsims` has the contract of :func:`rerank.maxsim.token_maxsims` and, for ``int8``, the same
arithmetic (bit-identical scores).

Shapes: ``d`` the token encoder's dimension, ``m`` the coded dimension (``M`` with a projection, else ``d``), ``T``
tokens, ``n`` passages; every array is numpy. Pure numpy; faiss for k-means and the nearest centroid, scipy (a
dependency of pytrec-eval-terrier) for Ward's linkage.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from index_builder.settings import STORAGES, CodecSpec, check_storage
from index_builder.snapshot.token_pooling import pool_tokens, pool_tokens_grouped

_STEP_GRID = np.linspace(0.2, 2.4, 23)  # candidate residual steps, in units of the dim's standard deviation


# ------------------------------------------------------------------------------------------------ the spec


# ------------------------------------------------------------------------------------------------ the codes


@dataclass
class TokenCodes:
    """A coded token store: ``codes`` [T, B] (int8 for ``int8``, packed uint8 otherwise), ``offsets`` int64
    [n + 1] (passage i owns rows ``offsets[i]:offsets[i + 1]``), ``scales`` [T] (float32 for ``int8``, float16 for
    ``int4`` / ``bins``) or None, ``ids`` [T] (uint8 up to 256 centroids, else uint16; ``res*`` with k > 1) or None.
    A pooled store also keeps ``groups`` (uint8 [tokens before pooling]: each original token's row among its
    passage's pooled rows) with ``group_offsets`` [n + 1], so a pooled row's similarity can be given back to the
    tokens it stands for (:meth:`rerank.late_interaction.LateInteractionReranker.token_sims`). Any array may be a
    memmap."""

    codes: np.ndarray
    offsets: np.ndarray
    scales: np.ndarray | None = None
    ids: np.ndarray | None = None
    groups: np.ndarray | None = None
    group_offsets: np.ndarray | None = None

    @property
    def passages(self) -> int:
        return len(self.offsets) - 1

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1]) if len(self.offsets) else 0

    @property
    def nbytes(self) -> int:
        """Bytes of every array (codes, offsets, scales, ids)."""
        return int(sum(a.nbytes for a in (self.codes, self.offsets, self.scales, self.ids, self.groups,
                                          self.group_offsets) if a is not None))

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The arrays to save (``np.save(f"{name}.npy", a)`` each); :meth:`from_arrays` reads them back."""
        out = {"token_codes": self.codes, "token_offsets": self.offsets}
        if self.scales is not None:
            out["token_scales"] = self.scales
        if self.ids is not None:
            out["token_centroid_ids"] = self.ids
        if self.groups is not None and self.group_offsets is not None:
            out["token_groups"], out["token_group_offsets"] = self.groups, self.group_offsets
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> TokenCodes:
        go = arrays.get("token_group_offsets")
        return cls(arrays["token_codes"], np.asarray(arrays["token_offsets"], dtype=np.int64),
                   arrays.get("token_scales"), arrays.get("token_centroid_ids"), arrays.get("token_groups"),
                   None if go is None else np.asarray(go, dtype=np.int64))

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
        codes = cat("codes")
        assert codes is not None
        group_offsets: np.ndarray | None = None
        if all(p.groups is not None and p.group_offsets is not None for p in parts):
            steps, base = [np.zeros(1, np.int64)], 0
            for p in parts:
                assert p.group_offsets is not None
                steps.append(np.asarray(p.group_offsets[1:], dtype=np.int64) + base)
                base += int(p.group_offsets[-1])
            group_offsets = np.concatenate(steps)
        return cls(codes, np.concatenate(offsets), cat("scales"), cat("ids"),
                   cat("groups") if group_offsets is not None else None, group_offsets)

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


def _pack_crumbs(u: np.ndarray) -> np.ndarray:
    """uint8 [n, m] values 0..3 -> uint8 [n, m/4]: byte j holds dims j, j + m/4, j + m/2, j + 3m/4 (bits 0-1, 2-3,
    4-5, 6-7)."""
    q = u.shape[1] // 4
    return (u[:, :q] | (u[:, q:2 * q] << 2) | (u[:, 2 * q:3 * q] << 4) | (u[:, 3 * q:] << 6)).astype(np.uint8)


def _unpack_crumbs(p: np.ndarray) -> np.ndarray:
    q = p.shape[1]
    out = np.empty((len(p), 4 * q), np.uint8)
    for k in range(4):
        np.bitwise_and(np.right_shift(p, 2 * k), 3, out=out[:, k * q:(k + 1) * q])
    return out


def _pack(u: np.ndarray, bits: int) -> np.ndarray:
    return np.packbits(u.astype(bool), axis=1) if bits == 1 else _pack_crumbs(u) if bits == 2 else _pack_nibbles(u)


def _unpack(p: np.ndarray, bits: int, m: int) -> np.ndarray:
    if bits == 1:
        return np.unpackbits(p, axis=1, count=m)
    return _unpack_crumbs(p) if bits == 2 else _unpack_nibbles(p)


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


def _bits(quant: str) -> int:
    return {"int8": 8, "int4": 4, "bin": 1, "bins": 1, "res1": 1, "res2": 2}[quant]


@dataclass
class TokenCodec:
    """A fitted codec (see the module docstring). Parameters: ``mean`` float32 [d] and ``projection`` float32
    [m, d] (``pca``), ``centroids`` float32 [k, m], ``low`` and ``step`` float32 [m] (``res*``: residual level
    ``low + u * step`` for code ``u``). Build one with :meth:`fit`, save it with :meth:`to_arrays`, read it with
    :meth:`from_arrays`."""

    spec: CodecSpec
    dim: int
    mean: np.ndarray | None = None
    projection: np.ndarray | None = None
    centroids: np.ndarray | None = None
    low: np.ndarray | None = None
    step: np.ndarray | None = None
    _centroid_index: Any = field(default=None, repr=False, compare=False)

    # ---- fitting and saving

    @classmethod
    def fit(cls, spec: str | CodecSpec, sample: np.ndarray, offsets: np.ndarray | None = None, *, seed: int = 0,
            kmeans_iters: int = 20, reuse: TokenCodec | None = None) -> TokenCodec:
        """Fit ``spec`` on a sample of the corpus's token vectors ``sample`` float [N, d] (a few hundred thousand
        rows suffice). With ``offsets`` (int [n + 1], the sample's passages) and a pooling spec, the sample is
        pooled first, so the projection and centroids are fitted on what will be coded (pass ``offsets=None`` for
        a sample already pooled). ``reuse``: a codec fitted on the same sample whose projection and centroids this
        one shares when the spec allows (same pooling, projection and centroid count): only the residual grid is
        fitted again (res1 and res2 over one k-means)."""
        spec = CodecSpec.parse(spec)
        x = np.asarray(sample, dtype=np.float32)
        if spec.pool > 1 and offsets is not None:
            x, _ = pool_tokens(x, offsets, spec.pool, spec.pool_method)
        if reuse is not None:
            same = (reuse.spec.pool, reuse.spec.pool_method, reuse.spec.pca) == (spec.pool, spec.pool_method, spec.pca)
            if same and reuse.dim == x.shape[1]:
                codec = cls(spec, reuse.dim, reuse.mean, reuse.projection)
                if spec.quant.startswith("res") and reuse.centroids is not None and \
                        len(reuse.centroids) == min(spec.centroids, len(x)):
                    codec.centroids, codec._centroid_index = reuse.centroids, reuse._centroid_index
                    y = codec.project(x)
                    codec.low, codec.step = _fit_grid(_grid_sample(y - codec.centroids[codec.nearest(y)], seed),
                                                      _bits(spec.quant))
                    return codec
                if not spec.quant.startswith("res"):
                    return codec
        d = x.shape[1]
        m = spec.pca or d
        if m > d:
            raise ValueError(f"pca{m} is more dims than the vectors have ({d})")
        need = {"int4": 2, "res2": 4}.get(spec.quant, 8 if spec.quant in ("bin", "bins", "res1") else 1)
        if m % need:
            raise ValueError(f"{spec.quant} needs a coded dimension divisible by {need}, got {m}")
        codec = cls(spec, d)
        if spec.pca:
            mean = x.mean(axis=0, dtype=np.float64)
            centred = x.astype(np.float64) - mean
            cov = centred.T @ centred / max(len(x) - 1, 1)
            values, vecs = np.linalg.eigh(cov)
            top = vecs[:, np.argsort(-values)[:m]].T  # [m, d]
            signs = np.sign(top[np.arange(m), np.abs(top).argmax(axis=1)])  # deterministic orientation
            codec.mean, codec.projection = mean.astype(np.float32), (top * signs[:, None]).astype(np.float32)
        if spec.quant.startswith("res"):
            y = codec.project(x)
            k = min(spec.centroids, len(y))
            if k <= 1:
                codec.centroids = y.mean(axis=0, keepdims=True).astype(np.float32)
            else:
                import faiss

                km = faiss.Kmeans(m, k, niter=kmeans_iters, seed=seed, verbose=False)
                km.train(np.ascontiguousarray(y))
                codec.centroids = np.asarray(km.centroids, dtype=np.float32).reshape(k, m)
            resid = _grid_sample(y - codec.centroids[codec.nearest(y)], seed)
            codec.low, codec.step = _fit_grid(resid, _bits(spec.quant))
        return codec

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The codec's parameters as arrays (a 0-d unicode array holds the spec; no pickling needed)."""
        out = {"codec_spec": np.array(json.dumps({"spec": str(self.spec), "dim": self.dim}))}
        for name in ("mean", "projection", "centroids", "low", "step"):
            a = getattr(self, name)
            if a is not None:
                out[f"codec_{name}"] = a
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> TokenCodec:
        head = json.loads(str(arrays["codec_spec"]))
        kw = {name: np.asarray(arrays[f"codec_{name}"], dtype=np.float32)
              for name in ("mean", "projection", "centroids", "low", "step") if f"codec_{name}" in arrays}
        return cls(CodecSpec.parse(head["spec"]), int(head["dim"]), **kw)

    @property
    def coded_dim(self) -> int:
        return self.spec.pca or self.dim

    @property
    def bytes_per_token(self) -> int:
        """Stored bytes per token vector: codes, scale, centroid id (offsets and parameters not counted)."""
        m, q = self.coded_dim, self.spec.quant
        code = m * _bits(q) // 8
        scale = {"int8": 4, "int4": 2, "bins": 2}.get(q, 0)
        ids = 0 if not q.startswith("res") or self.spec.centroids <= 1 else 1 if self.spec.centroids <= 256 else 2
        return code + scale + ids

    @property
    def params_nbytes(self) -> int:
        """Bytes of the fitted parameters (stored once per index)."""
        return int(sum(a.nbytes for a in (self.mean, self.projection, self.centroids, self.low, self.step)
                       if a is not None))

    def describe(self) -> dict[str, Any]:
        """What a manifest records."""
        return {"spec": str(self.spec), "dim": self.dim, "coded_dim": self.coded_dim,
                "bytes_per_token": self.bytes_per_token, "params_bytes": self.params_nbytes}

    # ---- coding

    def project(self, x: np.ndarray) -> np.ndarray:
        """Vectors [n, d] in the coded space: float32 [n, m] (the vectors themselves without a projection)."""
        x = np.asarray(x, dtype=np.float32)
        if self.projection is None:
            return x
        assert self.mean is not None
        return (x - self.mean) @ self.projection.T

    def nearest(self, y: np.ndarray) -> np.ndarray:
        """The nearest centroid of each coded vector [n, m]: int64 [n]."""
        assert self.centroids is not None
        if len(self.centroids) == 1:
            return np.zeros(len(y), np.int64)
        if self._centroid_index is None:
            import faiss

            self._centroid_index = faiss.IndexFlatL2(self.centroids.shape[1])
            self._centroid_index.add(np.ascontiguousarray(self.centroids))
        out = np.empty(len(y), np.int64)
        for s in range(0, len(y), 65_536):
            _, idx = self._centroid_index.search(np.ascontiguousarray(y[s:s + 65_536], dtype=np.float32), 1)
            out[s:s + 65_536] = idx[:, 0]
        return out

    def encode(self, vectors: np.ndarray) -> TokenCodes:
        """Token vectors float [T, d] as one passage's codes (no pooling: see :meth:`encode_passages`)."""
        v = np.asarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        y = self.project(v)
        q = self.spec.quant
        offsets = np.array([0, len(v)], np.int64)
        if q == "int8":
            codes, scales = quantize_int8(y)
            return TokenCodes(codes, offsets, scales)
        if q == "int4":
            s = (np.abs(y).max(axis=1) / 7.0 if len(y) else np.zeros(0, np.float32)).astype(np.float16)
            safe = np.where(s > 0, s.astype(np.float32), 1.0)
            u = (np.clip(np.rint(y / safe[:, None]), -7, 7) + 8).astype(np.uint8)
            return TokenCodes(_pack_nibbles(u), offsets, s)
        if q in ("bin", "bins"):
            codes = np.packbits(y > 0, axis=1)
            mean_abs = np.abs(y).mean(axis=1).astype(np.float16) if q == "bins" else None
            return TokenCodes(codes, offsets, mean_abs)
        assert self.centroids is not None and self.low is not None and self.step is not None
        ids = self.nearest(y)
        levels = 2 ** _bits(q)
        u = np.clip(np.rint((y - self.centroids[ids] - self.low) / self.step), 0, levels - 1).astype(np.uint8)
        k = len(self.centroids)
        id_arr = None if k <= 1 else ids.astype(np.uint8 if k <= 256 else np.uint16)
        return TokenCodes(_pack(u, _bits(q)), offsets, None, id_arr)

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
        """The vectors the codes stand for, in the original space: float32 [len(rows), d] (every row by default)."""
        rows = np.arange(len(codes.codes)) if rows is None else np.asarray(rows, dtype=np.int64)
        y = self._decode_coded(codes, rows)
        if self.projection is None:
            return y
        assert self.mean is not None
        return y @ self.projection + self.mean

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
        assert self.centroids is not None and self.low is not None and self.step is not None
        u = _unpack(c, _bits(q), m).astype(np.float32)
        ids = np.zeros(len(rows), np.int64) if codes.ids is None else np.asarray(codes.ids[rows], dtype=np.int64)
        return self.centroids[ids] + self.low + u * self.step

    # ---- scoring

    def similarities(self, query: np.ndarray, codes: TokenCodes, rows: np.ndarray) -> np.ndarray:
        """Every coded token ``rows`` (int [r]) against every query token (float [q, d]): float32 [r, q], computed
        on the codes (equal to ``decode(codes, rows) @ query.T`` up to float rounding)."""
        qf = np.asarray(query, dtype=np.float32)
        quant, m = self.spec.quant, self.coded_dim
        if self.projection is not None:
            assert self.mean is not None
            qy = qf @ self.projection.T  # [q, m]
            const = qf @ self.mean  # [q]: q . mean, the projection's share
        else:
            qy, const = qf, None
        c = np.asarray(codes.codes[rows])
        if quant == "int8":
            assert codes.scales is not None  # today's arithmetic exactly (rerank.maxsim.token_maxsims)
            tokens = c.astype(np.float32)
            tokens *= np.asarray(codes.scales[rows], dtype=np.float32)[:, None]
            sims = tokens @ qy.T
        elif quant == "int4":
            assert codes.scales is not None
            h = m // 2
            sims = (np.bitwise_and(c, 15).astype(np.float32) @ qy[:, :h].T
                    + np.right_shift(c, 4).astype(np.float32) @ qy[:, h:].T - 8.0 * qy.sum(axis=1))
            sims *= np.asarray(codes.scales[rows], dtype=np.float32)[:, None]
        elif quant in ("bin", "bins"):
            bits = np.unpackbits(c, axis=1, count=m).astype(np.float32)
            sims = bits @ (2.0 * qy.T) - qy.sum(axis=1)
            if codes.scales is not None:
                sims *= np.asarray(codes.scales[rows], dtype=np.float32)[:, None]
        else:
            assert self.centroids is not None and self.low is not None and self.step is not None
            u = _unpack(c, _bits(quant), m).astype(np.float32)
            sims = u @ (self.step[:, None] * qy.T) + qy @ self.low  # residual share
            if codes.ids is None:
                sims += self.centroids[0] @ qy.T
            else:
                ids = np.asarray(codes.ids[rows], dtype=np.int64)
                if len(self.centroids) <= len(rows):  # PLAID: the query against every centroid once, gathered
                    sims += (self.centroids @ qy.T)[ids]
                else:
                    sims += self.centroids[ids] @ qy.T
        if const is not None:
            sims += const
        return sims.astype(np.float32, copy=False)

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


def _grid_sample(resid: np.ndarray, seed: int, n: int = 20_000) -> np.ndarray:
    if len(resid) <= n:
        return resid
    return resid[np.random.default_rng(seed).choice(len(resid), n, replace=False)]


def _fit_grid(resid: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Per dim, the uniform grid of ``2**bits`` levels ``low + u * step`` (u = 0..L-1) centred on the residuals'
    mean whose step (a multiple of the dim's standard deviation, from ``_STEP_GRID``) gives the least squared
    error on ``resid`` float [N, m]: (low, step), float32 [m] each."""
    r = np.asarray(resid, dtype=np.float32)
    levels = 2 ** bits
    centre = r.mean(axis=0)
    sd = np.maximum(r.std(axis=0), 1e-8)
    best_err = np.full(r.shape[1], np.inf)
    best_step = sd.copy()
    for g in _STEP_GRID:
        step = (g * sd).astype(np.float32)
        low = centre - (levels - 1) / 2.0 * step
        u = np.clip(np.rint((r - low) / step), 0, levels - 1)
        err = ((low + u * step - r) ** 2).mean(axis=0)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_step = np.where(better, step, best_step)
    return (centre - (levels - 1) / 2.0 * best_step).astype(np.float32), best_step.astype(np.float32)


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
    return TokenCodec(spec, width * 8 // _bits(spec.quant))


@functools.lru_cache(maxsize=64)
def pooled(storage: str) -> bool:
    """Whether a store of ``storage`` keeps one vector per cluster of tokens rather than per token."""
    return storage not in PLAIN_STORAGES and CodecSpec.parse(storage).pool > 1
