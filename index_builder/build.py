"""Turn documents into a snapshot: chunk, analyse + index BM25, embed, build HNSW, keep token vectors, write.

Used by ``hybridrag build`` (offline) and by the live index's background rebuilds alike.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import bm25s
import faiss
import numpy as np

from index_builder.analysis import Analyzer, AnalyzerConfig
from index_builder.chunking import ChunkConfig, Chunker, chunk_passage
from index_builder.models import Embedder, EmbedderConfig
from index_builder.snapshot import SnapshotParts, write_snapshot
from index_builder.types import Document

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BM25Config:
    """Lucene BM25 parameters; the defaults are Pyserini's for BEIR (k1=0.9, b=0.4)."""

    k1: float = 0.9
    b: float = 0.4

    def __post_init__(self) -> None:
        if not (0 <= self.k1 <= 10 and 0 <= self.b <= 1):
            raise ValueError(f"bm25 needs 0 <= k1 <= 10 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")


@dataclass(frozen=True)
class HNSWConfig:
    """faiss HNSW build parameters (efSearch is a query-time setting: see retrieval's DenseConfig)."""

    m: int = 32
    ef_construction: int = 200

    def __post_init__(self) -> None:
        if not (4 <= self.m <= 128 and self.ef_construction >= self.m):
            raise ValueError(f"hnsw needs 4 <= m <= 128 and ef_construction >= m, got m={self.m}, "
                             f"ef_construction={self.ef_construction}")


@dataclass(frozen=True)
class BuildConfig:
    embedder: EmbedderConfig = field(default_factory=EmbedderConfig)
    chunking: ChunkConfig = field(default_factory=ChunkConfig)
    analyzer: AnalyzerConfig = field(default_factory=AnalyzerConfig)
    bm25: BM25Config = field(default_factory=BM25Config)
    hnsw: HNSWConfig = field(default_factory=HNSWConfig)
    token_vectors: bool = True  # store per-token vectors for the late-interaction stage
    keep_snapshots: int = 3  # generations kept on disk after a build (0 keeps all)


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


def index_settings(config: BuildConfig, embedder: Embedder) -> dict[str, Any]:
    """What a snapshot records about how it was built (and what loading checks against the configuration)."""
    token_encoder = ({"source": "embedder", "dim": embedder.dim, "dtype": "float16", "normalized": True,
                      "skips_special_tokens": True} if config.token_vectors else None)
    return {
        "models": {"embedder": embedder.describe(), "token_encoder": token_encoder},
        "analyzer": Analyzer(config.analyzer).settings(),
        "bm25": {"library": "bm25s", "method": "lucene", **asdict(config.bm25)},
        "hnsw": {"metric": "inner_product", **asdict(config.hnsw)},
        "chunking": asdict(config.chunking),
    }


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
                   *, progress: bool = False, covered_seq: int = 0) -> BuildSummary:
    """Build and write a new snapshot generation under ``root``; ``CURRENT`` points at it when this returns."""
    if not docs:
        raise ValueError("cannot build an index from zero documents")
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    embedder = embedder or Embedder(config.embedder)

    t = time.perf_counter()
    chunks = Chunker(embedder.files.tokenizer_path, config.chunking).chunk(docs)
    passages = [chunk_passage(docs[c["doc"]].title, docs[c["doc"]].text[c["start"]:c["end"]]) for c in chunks]
    timings["chunk"] = time.perf_counter() - t

    t = time.perf_counter()
    analyzer = Analyzer(config.analyzer)
    bm25 = bm25s.BM25(k1=config.bm25.k1, b=config.bm25.b, method="lucene")
    bm25.index(analyzer.batch(passages), show_progress=progress)
    timings["bm25"] = time.perf_counter() - t

    t = time.perf_counter()
    encoded = embedder.encode(passages, with_tokens=config.token_vectors, progress=progress)
    timings["embed"] = time.perf_counter() - t

    t = time.perf_counter()
    hnsw = faiss.IndexHNSWFlat(embedder.dim, config.hnsw.m, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = config.hnsw.ef_construction
    hnsw.add(encoded.embeddings)
    timings["hnsw"] = time.perf_counter() - t

    token_vectors = token_offsets = None
    if encoded.token_vectors is not None:
        lengths = np.array([len(v) for v in encoded.token_vectors], dtype=np.int64)
        token_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        token_vectors = np.concatenate(encoded.token_vectors).astype(np.float16)

    t = time.perf_counter()
    parts = SnapshotParts(list(docs), chunks, bm25, encoded.embeddings, hnsw, token_vectors, token_offsets,
                          index_settings(config, embedder), covered_seq)
    path = write_snapshot(Path(root), parts, keep_last=config.keep_snapshots)
    timings["write"] = time.perf_counter() - t
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return BuildSummary(path, len(docs), len(chunks), 0 if token_vectors is None else len(token_vectors),
                        time.perf_counter() - t0, size, timings)
