"""Vectors for benchmark builds without the model's cost: a bench-owned cache of the real model's outputs, and
embedders that the product's build takes in place of its own (``build_snapshot(..., embedder=...)``), so the
build itself (chunking, BM25, the dense index, the token store, the snapshot writer) runs unchanged and only the
model call is replaced.

- :class:`VectorCache`: the embedder's outputs per passage text (the exact string the build embeds: title +
  chunk), keyed by its SHA-1 and checked against the model's identity (ONNX sha256, max length, dimension): dense
  vectors float32, token vectors int8 with a float32 scale per vector (the product's int8 storage: re-storing
  them gives the same codes). Shards of numpy files, memory-mapped when read, written as they fill.
- :class:`RecordingEmbedder` (``model``): the real model on every passage, each output recorded into the cache
  (``cache_write_s`` says what recording cost inside the build's embedding stage).
- :class:`CachedEmbedder` (``cached``): real vectors from the caches, the misses through the model (recorded):
  what a quality run uses (the vectors are the model's own, whatever the run that computed them).
- :class:`PerturbedEmbedder` (``perturbed``): real vectors from the caches, the misses *synthesised*: a base
  passage chosen by the text's hash among the cache's real rows, its dense vector plus Gaussian noise (``sigma``
  per dimension), renormalised; as many token vectors as the text has word pieces (the real tokenizer's count),
  cycled from the base passage's token vectors, each plus noise and renormalised. **For cost curves only**: the
  bytes, build and search costs of rows shaped like real ones, never a quality figure.

Every embedder is the product's :class:`~index_builder.models.encoders.Embedder` (same tokenizer, files, dimension and
identity: a snapshot built with it serves with the default configuration, queries embedded by the real model)
with ``encode`` replaced, and counts what it did (``stats()``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from index_builder.models.encoders import Embedder, Encoded

SHARD_ROWS = 1024


def passage_key(text: str) -> bytes:
    return hashlib.sha1(text.encode("utf-8")).digest()[:16]


def model_identity(embedder: Embedder) -> dict[str, Any]:
    return {"sha256": embedder.files.sha256, "max_length": embedder.config.max_length, "dim": embedder.dim}


def quantize(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 codes and one scale per row (``v ~= q * scale``, ``scale = max|v| / 127``): the product's int8."""
    v = np.asarray(v, dtype=np.float32)
    scale = np.maximum(np.abs(v).max(axis=1), 1e-12) / 127.0 if len(v) else np.zeros(0, np.float32)
    return np.round(v / scale[:, None]).astype(np.int8), scale.astype(np.float32)


class VectorCache:
    """See the module docstring. ``folder/meta.json`` holds the model's identity; ``folder/shard-NNNNNN/`` one
    shard each (``keys``, ``dense``, ``tokens``, ``scales``, ``offsets`` .npy)."""

    def __init__(self, folder: str | Path, identity: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        meta = self.folder / "meta.json"
        if meta.is_file():
            have = json.loads(meta.read_text())
            if have != identity:
                raise ValueError(f"vector cache {self.folder} holds another model's vectors ({have}), not {identity}")
        else:
            meta.write_text(json.dumps(identity, sort_keys=True) + "\n")
        self.identity = identity
        self.shards: list[dict[str, np.ndarray]] = []
        self.index: dict[bytes, tuple[int, int]] = {}
        for d in sorted(self.folder.glob("shard-*")):
            if d.is_dir() and (d / "offsets.npy").is_file():
                self._attach(d)
        self._pending: list[tuple[bytes, np.ndarray, np.ndarray, np.ndarray]] = []
        self.write_s = 0.0

    def _attach(self, d: Path) -> None:
        shard: dict[str, Any] = {k: np.load(d / f"{k}.npy") for k in ("keys", "scales", "offsets")}
        for k in ("dense", "tokens"):  # read with pread, not mapped: a build reading the cache keeps its RSS its own
            m = np.load(d / f"{k}.npy", mmap_mode="r")
            shard[k] = (os.open(d / f"{k}.npy", os.O_RDONLY), m.offset, m.shape[1], m.dtype)
            del m
        s = len(self.shards)
        self.shards.append(shard)
        # raw bytes (16 a row): numpy's S16 strings would drop a key's trailing NUL bytes
        keys = np.ascontiguousarray(shard["keys"]).view(np.uint8).reshape(-1, 16)
        for row in range(len(keys)):
            self.index.setdefault(keys[row].tobytes(), (s, row))

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, key: bytes) -> bool:
        return key in self.index

    def get(self, key: bytes) -> tuple[np.ndarray, np.ndarray]:
        """(dense float32 [dim], token vectors float16 [t, dim]) of a cached passage."""
        s, row = self.index[key]
        return self.row(s, row)

    @staticmethod
    def _read(part: tuple[int, int, int, np.dtype], lo: int, hi: int) -> np.ndarray:
        fd, offset, dim, dtype = part
        width = dim * dtype.itemsize
        return np.frombuffer(os.pread(fd, (hi - lo) * width, offset + lo * width), dtype=dtype).reshape(-1, dim)

    def row(self, s: int, row: int) -> tuple[np.ndarray, np.ndarray]:
        sh = self.shards[s]
        lo, hi = int(sh["offsets"][row]), int(sh["offsets"][row + 1])
        codes = self._read(sh["tokens"], lo, hi).astype(np.float32)
        tokens = (codes * sh["scales"][lo:hi, None]).astype(np.float16)
        return self._read(sh["dense"], row, row + 1)[0].astype(np.float32), tokens

    def rows(self) -> list[tuple[int, int]]:
        return [(s, r) for s, sh in enumerate(self.shards) for r in range(len(sh["offsets"]) - 1)]

    def add(self, key: bytes, dense: np.ndarray, tokens: np.ndarray | None) -> None:
        if key in self.index:
            return
        dim = self.identity["dim"]
        codes, scales = quantize(np.zeros((0, dim), np.float32) if tokens is None else tokens)
        self._pending.append((key, np.asarray(dense, dtype=np.float32), codes, scales))
        if len(self._pending) >= SHARD_ROWS:
            self.flush()

    def flush(self) -> None:
        """Write the pending rows as one shard (a temporary folder renamed into place: a killed run loses at most
        the rows not yet flushed)."""
        if not self._pending:
            return
        t = time.perf_counter()
        pending, self._pending = self._pending, []
        codes = np.concatenate([c for _, _, c, _ in pending])
        scales = np.concatenate([s for _, _, _, s in pending])
        offsets = np.concatenate([[0], np.cumsum([len(c) for _, _, c, _ in pending])]).astype(np.int64)
        n = len(list(self.folder.glob("shard-*")))
        final = self.folder / f"shard-{n:06d}"
        tmp = self.folder / f".tmp-shard-{n:06d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        np.save(tmp / "keys.npy", np.frombuffer(b"".join(k for k, _, _, _ in pending), dtype=np.uint8).reshape(-1, 16))
        np.save(tmp / "dense.npy", np.stack([d for _, d, _, _ in pending]))
        np.save(tmp / "tokens.npy", codes)
        np.save(tmp / "scales.npy", scales)
        np.save(tmp / "offsets.npy", offsets)
        os.replace(tmp, final)
        self._attach(final)
        self.write_s += time.perf_counter() - t


class _Replaced(Embedder):
    """The product's embedder with ``encode`` replaced: every other attribute is the wrapped real one's."""

    mode = "model"

    def __init__(self, inner: Embedder) -> None:  # noqa: D107 -- no super().__init__: the model is already loaded
        self.__dict__.update(inner.__dict__)
        self.inner = inner
        self.counts = {"passages": 0, "word_pieces": 0, "model": 0, "cached": 0, "synthesised": 0}
        self.model_s = 0.0

    def _pieces(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) - int(sum(e.special_tokens_mask)) for e in self.model.tokenize(texts)]

    def _model(self, texts: Sequence[str], with_tokens: bool, progress: bool) -> Encoded:
        t = time.perf_counter()
        out = Embedder.encode(self.inner, texts, with_tokens=with_tokens, progress=progress)
        self.model_s += time.perf_counter() - t
        self.counts["model"] += len(texts)
        return out

    def close(self) -> None:
        for cache in getattr(self, "caches", []):
            cache.flush()

    def stats(self) -> dict[str, Any]:
        caches = getattr(self, "caches", [])
        return {"mode": self.mode, **self.counts, "model_s": round(self.model_s, 2),
                "cache_write_s": round(sum(c.write_s for c in caches), 2),
                "caches": [str(c.folder) for c in caches]}


class RecordingEmbedder(_Replaced):
    """The real model on every passage; its outputs recorded into ``cache``."""

    mode = "model"

    def __init__(self, inner: Embedder, cache: VectorCache) -> None:
        super().__init__(inner)
        self.caches = [cache]

    def encode(self, texts: Sequence[str], *, with_tokens: bool = False, progress: bool = False) -> Encoded:
        out = self._model(texts, True, progress)
        self.counts["passages"] += len(texts)
        assert out.token_vectors is not None
        self.counts["word_pieces"] += sum(len(t) for t in out.token_vectors)
        for text, d, tk in zip(texts, out.embeddings, out.token_vectors, strict=True):
            self.caches[0].add(passage_key(text), d, tk)
        return Encoded(out.embeddings, out.token_vectors if with_tokens else None)


class CachedEmbedder(_Replaced):
    """Real vectors from ``caches`` (first hit wins); misses through the model, recorded into ``caches[0]``."""

    mode = "cached"

    def __init__(self, inner: Embedder, caches: Sequence[VectorCache]) -> None:
        super().__init__(inner)
        self.caches = list(caches)

    def _lookup(self, key: bytes) -> tuple[np.ndarray, np.ndarray] | None:
        for c in self.caches:
            if key in c:
                return c.get(key)
        return None

    def encode(self, texts: Sequence[str], *, with_tokens: bool = False, progress: bool = False) -> Encoded:
        n = len(texts)
        dense = np.empty((n, self.dim), dtype=np.float32)
        tokens: list[np.ndarray] = [np.empty(0)] * n
        missing = []
        for i, text in enumerate(texts):
            hit = self._lookup(passage_key(text))
            if hit is None:
                missing.append(i)
            else:
                dense[i], tokens[i] = hit
        self.counts["cached"] += n - len(missing)
        if missing:
            self._fill(texts, missing, dense, tokens, progress)
        self.counts["passages"] += n
        self.counts["word_pieces"] += sum(len(t) for t in tokens)
        return Encoded(dense, tokens if with_tokens else None)

    def _fill(self, texts: Sequence[str], missing: list[int], dense: np.ndarray, tokens: list[np.ndarray],
              progress: bool) -> None:
        out = self._model([texts[i] for i in missing], True, progress)
        assert out.token_vectors is not None
        for j, i in enumerate(missing):
            dense[i], tokens[i] = out.embeddings[j], out.token_vectors[j]
            self.caches[0].add(passage_key(texts[i]), out.embeddings[j], out.token_vectors[j])


class PerturbedEmbedder(CachedEmbedder):
    """Real vectors from ``caches`` where they are; the misses synthesised from ``base``'s real rows (see the
    module docstring). Deterministic for a text, a seed and the base cache's content."""

    mode = "perturbed"

    def __init__(self, inner: Embedder, caches: Sequence[VectorCache], base: VectorCache, *, sigma: float = 0.025,
                 seed: int = 0) -> None:
        super().__init__(inner, caches)
        self.base, self.base_rows = base, base.rows()
        if not self.base_rows:
            raise ValueError(f"vector cache {base.folder} is empty: embed some real passages first (--vectors model)")
        self.sigma, self.seed = sigma, seed
        self.synth_s = 0.0

    def _fill(self, texts: Sequence[str], missing: list[int], dense: np.ndarray, tokens: list[np.ndarray],
              progress: bool) -> None:
        t = time.perf_counter()
        pieces = self._pieces([texts[i] for i in missing])
        for i, n in zip(missing, pieces, strict=True):
            dense[i], tokens[i] = self.synthesise(texts[i], n)
        self.counts["synthesised"] += len(missing)
        self.synth_s += time.perf_counter() - t

    def synthesise(self, text: str, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        key = passage_key(text)
        rng = np.random.default_rng([self.seed, int.from_bytes(key[:8], "little")])
        base_dense, base_tokens = self.base.row(*self.base_rows[int(rng.integers(len(self.base_rows)))])
        d = base_dense + self.sigma * rng.standard_normal(self.dim, dtype=np.float32)
        d /= max(float(np.linalg.norm(d)), 1e-12)
        n = max(1, min(n_tokens, self.config.max_length - 2))
        if len(base_tokens) == 0:
            base_tokens = base_dense[None, :].astype(np.float16)
        tk = base_tokens[np.arange(n) % len(base_tokens)].astype(np.float32)
        tk += self.sigma * rng.standard_normal(tk.shape, dtype=np.float32)
        tk /= np.maximum(np.linalg.norm(tk, axis=1, keepdims=True), 1e-12)
        return d, tk.astype(np.float16)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "synthesis_s": round(self.synth_s, 2), "sigma": self.sigma,
                "base_cache": str(self.base.folder), "base_rows": len(self.base_rows)}


def seed_cache_from_snapshot(cache: VectorCache, index_dir: str | Path, embedder: Embedder) -> int:
    """Copy a built snapshot's vectors (``vectors.npy``, int8 or float16 ``token_vectors.npy``: the plain storages)
    into ``cache``, keyed by the passages the build embedded; returns the rows added. Refuses a snapshot of another
    model; raises when the format is not one this reads (then embed with ``cached`` instead)."""
    from index_builder.documents.chunking import chunk_passages
    from index_builder.snapshot.format import load_snapshot

    snap = load_snapshot(Path(index_dir), checksums=False)
    have = snap.manifest["models"]["embedder"]
    if have.get("sha256") != embedder.files.sha256 or have.get("max_length") != embedder.config.max_length:
        raise ValueError(f"{index_dir} was built with another embedder ({have.get('name')}, {have.get('sha256')})")
    if snap.vectors is None or snap.token_vectors is None or snap.token_offsets is None:
        raise ValueError(f"{index_dir} has no dense or token vectors to seed from")
    storage = (snap.manifest["models"].get("token_encoder") or {}).get("dtype", "int8")
    if storage not in ("int8", "float16"):
        raise ValueError(f"{index_dir} stores its token vectors as {storage}: pooled or quantised past recovery, "
                         f"they cannot seed a cache of per-token vectors; seed from an index built with "
                         f"[late_interaction] storage = \"int8\"")
    passages = chunk_passages(snap.documents, snap.chunks)
    off = snap.token_offsets
    scales = snap.token_scales
    before = len(cache)
    for i, text in enumerate(passages):
        tv = np.asarray(snap.token_vectors[off[i]:off[i + 1]], dtype=np.float32)
        if scales is not None:
            tv = tv * scales[off[i]:off[i + 1], None]
        cache.add(passage_key(text), np.asarray(snap.vectors[i]), tv)
    cache.flush()
    return len(cache) - before
