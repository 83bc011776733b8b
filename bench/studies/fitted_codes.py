"""The fitted token codecs of the token-codes study (issue 41): PCA, residual codes on a fitted grid, k-means
centroids. They subclass the product's stateless codec (:mod:`index_builder.snapshot.token_codes`), which refuses a
spec that needs fitting; the product stores none of these (issue 52 moved them here from ``rerank``), and the study
(:mod:`bench.studies.token_codes`) measures them beside the stored ones."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from index_builder.settings import CodecSpec
from index_builder.snapshot.token_codes import TokenCodec, TokenCodes
from index_builder.snapshot.token_pooling import pool_tokens

_STEP_GRID = np.linspace(0.2, 2.4, 23)  # candidate residual steps, in units of the dim's standard deviation
_RES_BITS = {"res1": 1, "res2": 2}


@dataclass
class FittedCodes(TokenCodes):
    """A fitted codec's store: :class:`TokenCodes` and ``ids`` [T] (each vector's centroid: uint8 up to 256
    centroids, else uint16; ``res*`` with k > 1) or None."""

    ids: np.ndarray | None = None
    ROWS: ClassVar[dict[str, str]] = {**TokenCodes.ROWS, "ids": "token_centroid_ids"}


@dataclass
class FittedCodec(TokenCodec):
    """The product's stateless codecs plus the ones fitted on a sample of the corpus's token vectors, which the
    product does not store (``check_storage``): a **projection** (``pcaM``) onto the top ``M`` principal components
    of the sample (mean removed; queries are projected the same way at scoring time and ``q . mean`` added back, so
    scores are those of the decoded vectors ``mean + y @ P``), and the **residual codes** ``res1`` / ``res2``
    (ColBERTv2 / PLAID): the nearest of ``kK`` centroids (faiss k-means) plus the residual quantised to 1 or 2 bits
    per dim on a per-dim uniform grid (offset and step fitted to the sample's residuals by least squares); ``k1`` is
    one centroid (the sample mean): per-dim scalar codes with no id stored. MaxSim stays on the codes: the query is
    projected once, the centroids' share is ``C @ q`` once per query gathered by id.

    Parameters: ``mean`` float32 [d] and ``projection`` float32 [m, d] (``pca``), ``centroids`` float32 [k, m],
    ``low`` and ``step`` float32 [m] (``res*``: residual level ``low + u * step`` for code ``u``). Build one with
    :meth:`fit`, save it with :meth:`to_arrays`, read it with :meth:`from_arrays`."""

    mean: np.ndarray | None = None
    projection: np.ndarray | None = None
    centroids: np.ndarray | None = None
    low: np.ndarray | None = None
    step: np.ndarray | None = None
    _centroid_index: Any = field(default=None, repr=False, compare=False)
    FITTED: ClassVar[bool] = True
    CODES: ClassVar[type[TokenCodes]] = FittedCodes

    # ---- fitting and saving

    @classmethod
    def fit(cls, spec: str | CodecSpec, sample: np.ndarray, offsets: np.ndarray | None = None, *, seed: int = 0,
            kmeans_iters: int = 20, reuse: FittedCodec | None = None) -> FittedCodec:
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
                                                      codec.bits)
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
            codec.low, codec.step = _fit_grid(resid, codec.bits)
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
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> FittedCodec:
        head = json.loads(str(arrays["codec_spec"]))
        kw = {name: np.asarray(arrays[f"codec_{name}"], dtype=np.float32)
              for name in ("mean", "projection", "centroids", "low", "step") if f"codec_{name}" in arrays}
        return cls(CodecSpec.parse(head["spec"]), int(head["dim"]), **kw)

    @property
    def bits(self) -> int:
        return _RES_BITS.get(self.spec.quant) or super().bits

    @property
    def coded_dim(self) -> int:
        return self.spec.pca or self.dim

    @property
    def bytes_per_token(self) -> int:
        """Stored bytes per token vector: codes, scale, centroid id (offsets and parameters not counted)."""
        k = self.spec.centroids
        ids = 0 if not self.spec.quant.startswith("res") or k <= 1 else 1 if k <= 256 else 2
        return super().bytes_per_token + ids

    @property
    def params_nbytes(self) -> int:
        """Bytes of the fitted parameters (stored once per index)."""
        return int(sum(a.nbytes for a in (self.mean, self.projection, self.centroids, self.low, self.step)
                       if a is not None))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "params_bytes": self.params_nbytes}

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

    def encode(self, vectors: np.ndarray) -> FittedCodes:
        if not self.spec.quant.startswith("res"):
            return super().encode(vectors)  # type: ignore[return-value]  (CODES is FittedCodes)
        assert self.centroids is not None and self.low is not None and self.step is not None
        v = np.asarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        y = self.project(v)
        ids = self.nearest(y)
        levels = 2 ** self.bits
        u = np.clip(np.rint((y - self.centroids[ids] - self.low) / self.step), 0, levels - 1).astype(np.uint8)
        k = len(self.centroids)
        id_arr = None if k <= 1 else ids.astype(np.uint8 if k <= 256 else np.uint16)
        return FittedCodes(_pack(u, self.bits), np.array([0, len(v)], np.int64), None, ids=id_arr)

    def decode(self, codes: TokenCodes, rows: np.ndarray | None = None) -> np.ndarray:
        """The vectors the codes stand for, in the original space: float32 [len(rows), d] (every row by default)."""
        y = super().decode(codes, rows)
        if self.projection is None:
            return y
        assert self.mean is not None
        return y @ self.projection + self.mean

    def _decode_coded(self, codes: TokenCodes, rows: np.ndarray) -> np.ndarray:
        if not self.spec.quant.startswith("res"):
            return super()._decode_coded(codes, rows)
        assert self.centroids is not None and self.low is not None and self.step is not None
        u = _unpack(np.asarray(codes.codes[rows]), self.bits, self.coded_dim).astype(np.float32)
        stored_ids = getattr(codes, "ids", None)
        ids = np.zeros(len(rows), np.int64) if stored_ids is None else np.asarray(stored_ids[rows], dtype=np.int64)
        return self.centroids[ids] + self.low + u * self.step

    # ---- scoring

    def query_terms(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        if self.projection is None:
            return query, None
        assert self.mean is not None
        return query @ self.projection.T, query @ self.mean  # [q, m]; q . mean, the projection's share

    def _similarities_coded(self, qy: np.ndarray, codes: TokenCodes, rows: np.ndarray) -> np.ndarray:
        if not self.spec.quant.startswith("res"):
            return super()._similarities_coded(qy, codes, rows)
        assert self.centroids is not None and self.low is not None and self.step is not None
        u = _unpack(np.asarray(codes.codes[rows]), self.bits, self.coded_dim).astype(np.float32)
        sims = u @ (self.step[:, None] * qy.T) + qy @ self.low  # residual share
        stored_ids = getattr(codes, "ids", None)
        if stored_ids is None:
            sims += self.centroids[0] @ qy.T
        else:
            ids = np.asarray(stored_ids[rows], dtype=np.int64)
            if len(self.centroids) <= len(rows):  # PLAID: the query against every centroid once, gathered
                sims += (self.centroids @ qy.T)[ids]
            else:
                sims += self.centroids[ids] @ qy.T
        return sims


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
    return np.packbits(u.astype(bool), axis=1) if bits == 1 else _pack_crumbs(u)


def _unpack(p: np.ndarray, bits: int, m: int) -> np.ndarray:
    return np.unpackbits(p, axis=1, count=m) if bits == 1 else _unpack_crumbs(p)


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
