"""Turn documents into a snapshot: chunk, analyse + index BM25, embed, build HNSW, keep token vectors, write.

Used by ``hybridrag build`` (offline) and by the live index's background rebuilds alike.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import bm25s
import faiss
import numpy as np

from index_builder.analysis import Analyzer
from index_builder.chunking import Chunker, chunk_passage
from index_builder.models import Embedder
from index_builder.settings import BM25Config, BuildConfig, HNSWConfig  # noqa: F401  (re-exported)
from index_builder.snapshot import SnapshotParts, load_snapshot, write_snapshot
from index_builder.token_encoders import EmbedderTokens, TokenEncoder, TokenStore, make_token_encoder
from index_builder.types import Document

log = logging.getLogger(__name__)


@dataclass
class BuildSummary:
    path: Path
    documents: int
    chunks: int
    token_vectors: int
    seconds: float
    bytes_on_disk: int
    timings: dict[str, float]

    def line(self) -> str:
        return (f"built {self.path}: {self.documents} documents, {self.chunks} chunks, "
                f"{self.token_vectors} token vectors, {self.seconds:.1f} s, {self.bytes_on_disk / 2**20:.1f} MiB")


def token_settings(encoder: TokenEncoder, storage: str) -> dict[str, Any]:
    return {**encoder.describe(), "dtype": storage}


def index_settings(config: BuildConfig, embedder: Embedder, token_encoder: TokenEncoder | None = None) -> dict[str, Any]:
    """What a snapshot records about how it was built (and what loading checks against the configuration)."""
    tokens = None
    if config.token_vectors:
        tokens = token_settings(token_encoder or EmbedderTokens(embedder), config.token_encoder.storage)
    return {
        "models": {"embedder": embedder.describe(), "token_encoder": tokens},
        "analyzer": Analyzer(config.analyzer).settings(),
        "bm25": {"library": "bm25s", "method": "lucene", **asdict(config.bm25)},
        "hnsw": {"metric": "inner_product", **asdict(config.hnsw)},
        "chunking": asdict(config.chunking),
    }


def _with_avgdl(settings: dict[str, Any], avgdl: float) -> dict[str, Any]:
    """Record the mean analysed passage length: with the index's document frequencies it lets the live index
    score passages outside the index on the same scale (retrieval.search.bm25.BM25Stats)."""
    return {**settings, "bm25": {**settings["bm25"], "avgdl": avgdl}}


def expected_settings(config: BuildConfig, embedder: Embedder) -> dict[str, Any]:
    """Dotted manifest keys that must equal the configuration for a snapshot to be served with it."""
    analyzer = Analyzer(config.analyzer).settings()
    return {
        "models.embedder.sha256": embedder.files.sha256,
        "models.embedder.max_length": embedder.config.max_length,
        "dim": embedder.dim,
        **{f"analyzer.{k}": v for k, v in analyzer.items()},
    }


def build_snapshot(docs: Sequence[Document], root: Path, config: BuildConfig, embedder: Embedder | None = None,
                   *, progress: bool = False, covered_seq: int = 0,
                   token_encoder: TokenEncoder | None = None) -> BuildSummary:
    """Build and write a new snapshot generation under ``root``; ``CURRENT`` points at it when this returns.

    Token vectors come from ``token_encoder`` (default: made from ``config.token_encoder``); when that is the
    embedder's own, they come out of the embedding pass itself.
    """
    if not docs:
        raise ValueError("cannot build an index from zero documents")
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    embedder = embedder or Embedder(config.embedder)
    if config.token_vectors and token_encoder is None:
        token_encoder = make_token_encoder(config.token_encoder, embedder)
    same_pass = isinstance(token_encoder, EmbedderTokens)

    t = time.perf_counter()
    chunks = Chunker(embedder.files.tokenizer_path, config.chunking).chunk(docs)
    passages = chunk_passages(docs, chunks)
    timings["chunk"] = time.perf_counter() - t
    window = embedder.config.max_length - 2  # [CLS] and [SEP]
    if config.chunking.max_tokens > window:
        log.warning("chunks of up to %d word pieces exceed the embedder's window (%d): dense and token vectors see "
                    "only each chunk's first %d pieces; late interaction over such vectors lost to the fused list "
                    "(SciFact test, 480-piece chunks at max_length 128: 0.6960 against 0.7162). Set [chunking] "
                    "max_tokens <= %d (room for the title) for the full passage", config.chunking.max_tokens,
                    window + 2, window, window + 2 - 32)

    t = time.perf_counter()
    analyzer = Analyzer(config.analyzer)
    bm25 = bm25s.BM25(k1=config.bm25.k1, b=config.bm25.b, method="lucene")
    passage_terms = analyzer.batch(passages)
    bm25.index(passage_terms, show_progress=progress)
    avgdl = float(np.mean([len(t) for t in passage_terms])) if passage_terms else 0.0
    timings["bm25"] = time.perf_counter() - t

    t = time.perf_counter()
    encoded = embedder.encode(passages, with_tokens=config.token_vectors and same_pass, progress=progress)
    timings["embed"] = time.perf_counter() - t
    per_passage = encoded.token_vectors
    if config.token_vectors and not same_pass:
        assert token_encoder is not None
        t = time.perf_counter()
        per_passage = token_encoder.encode_documents(passages, progress=progress)
        timings["token_vectors"] = time.perf_counter() - t

    t = time.perf_counter()
    hnsw = faiss.IndexHNSWFlat(embedder.dim, config.hnsw.m, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = config.hnsw.ef_construction
    hnsw.add(encoded.embeddings)
    timings["hnsw"] = time.perf_counter() - t

    store = None
    if per_passage is not None and token_encoder is not None:
        store = TokenStore.from_lists(per_passage, token_encoder.dim, config.token_encoder.storage)

    t = time.perf_counter()
    parts = SnapshotParts(list(docs), chunks, bm25, encoded.embeddings, hnsw,
                          None if store is None else store.vectors, None if store is None else store.offsets,
                          _with_avgdl(index_settings(config, embedder, token_encoder), avgdl), covered_seq,
                          None if store is None else store.scales)
    path = write_snapshot(Path(root), parts, keep_last=config.keep_snapshots)
    timings["write"] = time.perf_counter() - t
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return BuildSummary(path, len(docs), len(chunks), 0 if store is None else len(store.vectors),
                        time.perf_counter() - t0, size, timings)


def chunk_passages(docs: Sequence[Document], chunks: np.ndarray) -> list[str]:
    """Each chunk's passage as it is embedded and scored (title + chunk text)."""
    return [chunk_passage(docs[c["doc"]].title, docs[c["doc"]].text[c["start"]:c["end"]]) for c in chunks]


def rebuild_token_vectors(root: Path, token_encoder: TokenEncoder | None, storage: str, *, out: Path | None = None,
                          keep_snapshots: int = 0, progress: bool = False) -> BuildSummary:
    """Write a new generation equal to ``root``'s current snapshot but for its token vectors, recomputed with
    ``token_encoder`` (a new late-interaction model or another storage) without re-embedding the dense side.

    ``token_encoder=None`` re-stores the snapshot's own token vectors in ``storage`` (e.g. fp16 -> int8) with no
    model call."""
    t0 = time.perf_counter()
    snap = load_snapshot(Path(root))
    if snap.vectors is None or snap.hnsw is None:
        raise ValueError(f"snapshot {snap.path} has no usable dense index ({snap.dense_error}): rebuild it fully")
    m = snap.manifest
    t = time.perf_counter()
    if token_encoder is not None:
        per_passage = token_encoder.encode_documents(chunk_passages(snap.documents, snap.chunks), progress=progress)
        dim, tokens = token_encoder.dim, token_settings(token_encoder, storage)
    else:
        if snap.token_vectors is None or snap.token_offsets is None or not m["models"].get("token_encoder"):
            raise ValueError(f"snapshot {snap.path} has no token vectors to re-store; give a token encoder")
        flat = np.asarray(snap.token_vectors, dtype=np.float32)
        if snap.token_scales is not None:
            flat = flat * snap.token_scales[:, None]
        off = snap.token_offsets
        per_passage = [flat[off[i]:off[i + 1]] for i in range(len(off) - 1)]
        dim, tokens = flat.shape[1], {**m["models"]["token_encoder"], "dtype": storage}
    store = TokenStore.from_lists(per_passage, dim, storage)
    encode_s = time.perf_counter() - t
    settings = {k: m[k] for k in ("analyzer", "bm25", "hnsw", "chunking")}
    settings["models"] = {**m["models"], "token_encoder": tokens}
    t = time.perf_counter()
    parts = SnapshotParts(snap.documents, snap.chunks, snap.bm25, np.asarray(snap.vectors), snap.hnsw,
                          store.vectors, store.offsets, settings, int(m.get("covered_seq", 0)), store.scales)
    path = write_snapshot(Path(out or root), parts, keep_last=keep_snapshots)
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return BuildSummary(path, len(snap.documents), len(snap.chunks), len(store.vectors), time.perf_counter() - t0,
                        size, {"token_vectors": encode_s, "write": time.perf_counter() - t})
