"""One immutable index generation: a verified snapshot with its retrievers and filter index.

Requests take one reference to a :class:`SearchIndex` and use it from start to end; the live index (a later
stage) swaps in a new one atomically while old requests finish on the old one.
"""

from __future__ import annotations

import logging
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np

from index_builder.documents.analysis import Analyzer
from index_builder.documents.chunking import chunk_passage, chunk_passages
from index_builder.models.encoders import Embedder
from index_builder.settings import BuildConfig
from index_builder.snapshot.format import LoadedSnapshot, load_snapshot
from index_builder.snapshot.manifest import analysis_note, expected_settings
from rerank.late_interaction import LateInteractionReranker
from retrieval.search.aggregate import doc_starts
from retrieval.search.bm25 import BM25Retriever, BM25Stats
from retrieval.search.dense import DenseConfig, DenseRetriever
from retrieval.search.filters import FilterIndex
from retrieval.search.settings import IndexConfig  # noqa: F401  (its section lives with the search settings)

log = logging.getLogger("hybridrag.index")

class IndexSettings(Protocol):
    """The configuration sections an index reads (``retrieval.config.AppConfig`` has them): what the snapshot must
    have been built with, dense search, load checks."""

    @property
    def dense(self) -> DenseConfig: ...

    @property
    def index(self) -> IndexConfig: ...

    def build_config(self) -> BuildConfig: ...


class SearchIndex:
    backend = "local snapshot"
    in_process = True  # its searches are in-memory compute (the pipeline may run short ones on its loop)

    def __init__(self, snapshot: LoadedSnapshot, config: IndexSettings) -> None:
        self.snapshot = snapshot
        self.documents = snapshot.documents
        self.chunks = snapshot.chunks
        self.chunk_doc = snapshot.chunks["doc"].astype(np.int64)
        self.starts = doc_starts(self.chunk_doc, len(self.documents))
        analyzer = Analyzer.from_settings(snapshot.manifest["analyzer"])
        self.bm25 = BM25Retriever(snapshot.bm25, analyzer, self.starts)
        self.dense: DenseRetriever | None = None
        if snapshot.vectors is not None and snapshot.hnsw is not None:
            self.dense = DenseRetriever(snapshot.hnsw, snapshot.vectors, self.chunk_doc, self.starts, config.dense)
        self.filters = FilterIndex(self.documents, self.chunk_doc)
        # Which model made the stored token vectors: late interaction serves only with a query encoder that matches.
        self.token_encoder: dict | None = snapshot.manifest.get("models", {}).get("token_encoder")
        self.late: LateInteractionReranker | None = None
        if snapshot.token_vectors is not None and snapshot.token_offsets is not None:
            self.late = LateInteractionReranker(snapshot.token_vectors, snapshot.token_offsets, snapshot.token_scales,
                                                str((self.token_encoder or {}).get("dtype", "int8")),
                                                snapshot.token_groups, snapshot.token_group_offsets)
        self.doc_index = {d.id: i for i, d in enumerate(self.documents)}

    @classmethod
    def load(cls, root: str | Path, config: IndexSettings, embedder: Embedder) -> SearchIndex:
        """Load and verify the snapshot ``CURRENT`` points at, refusing one built with another model or analysis
        (stopwords, stemmer; the tokenizer is served as built, with a warning)."""
        expected = expected_settings(config.build_config(), embedder)
        snap = load_snapshot(Path(root), expected=expected, checksums=config.index.verify_checksums)
        note = analysis_note(snap.manifest, config.build_config())
        if note:
            log.warning("%s: %s", root, note)
        return cls(snap, config)

    @cached_property
    def bm25_stats(self) -> BM25Stats:
        """This snapshot's BM25 statistics (avgdl from the manifest; recomputed for snapshots built before it was
        recorded)."""
        avgdl = self.snapshot.manifest.get("bm25", {}).get("avgdl")
        if avgdl is None:
            terms = self.bm25.analyzer.batch(chunk_passages(self.documents, self.chunks))
            avgdl = float(np.mean([len(t) for t in terms])) if terms else 0.0
        return BM25Stats.of(self.snapshot.bm25, avgdl)

    @property
    def generation(self) -> int:
        return self.snapshot.generation

    @property
    def buffered(self) -> int:
        return 0  # a bare snapshot: nothing written since

    @property
    def dense_error(self) -> str | None:
        return self.snapshot.dense_error if self.dense is None else None

    def passage(self, chunk: int) -> str:
        c = self.chunks[chunk]
        return self.documents[c["doc"]].text[c["start"]:c["end"]]

    def passage_with_title(self, chunk: int) -> str:
        doc = self.documents[self.chunks[chunk]["doc"]]
        return chunk_passage(doc.title, self.passage(chunk))
