"""A build's work on one batch, and where it runs (:class:`BuildWorkers`), apart from the build itself so that
a Ray task or actor can run it
(:mod:`index_builder.build.ray_build`) as this process does (:mod:`index_builder.build.builder`): chunk, key and analyse
documents (:class:`Preparer`), encode passages (:func:`encode_passages`), and the identity the keys are made under."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from index_builder.build.encodings import BuildWork, Source, chunk_keys, encoder_identity
from index_builder.documents.analysis import Analyzer
from index_builder.documents.chunking import Chunker, chunk_passages
from index_builder.errors import SnapshotError
from index_builder.models.encoders import Embedder
from index_builder.models.token_encoders import EmbedderTokens, TokenEncoder
from index_builder.settings import AnalyzerConfig, ChunkConfig
from index_builder.snapshot.token_store import TokenStore
from index_builder.types import Document


def identity_of(embedder: Embedder, token_encoder: TokenEncoder | None) -> bytes:
    """The encoders' identity the chunk keys are made under (not the runtime's providers: the same model on
    another device makes the same vectors, to float rounding; not the token storage: a store in another form is
    re-stored from the same vectors, see :func:`_restore`)."""
    model = {k: v for k, v in embedder.describe().items() if k != "providers"}
    return encoder_identity(model, None if token_encoder is None else token_encoder.describe())


@dataclass
class Prepared:
    """One batch of documents made ready for the index: its chunks (``doc`` numbered within the batch), each
    chunk's passage, key and analysed terms, and the seconds each step took."""

    chunks: np.ndarray
    passages: list[str]
    keys: np.ndarray
    terms: list[list[str]]
    chunk_s: float
    analyse_s: float


class Preparer:
    """Chunk, key and analyse a batch of documents: the build's work besides the models, the same in this process
    and in a Ray task (it is pickled there with its settings and makes its tokenizer on first use)."""

    def __init__(self, tokenizer_path: Path, chunking: ChunkConfig, analyzer: AnalyzerConfig, identity: bytes) -> None:
        self.tokenizer_path, self.chunking, self.analyzer_config, self.identity = \
            Path(tokenizer_path), chunking, analyzer, identity
        self._chunker: Chunker | None = None
        self._analyzer: Analyzer | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_chunker": None, "_analyzer": None}

    def __call__(self, batch: Sequence[Document]) -> Prepared:
        if self._chunker is None:
            self._chunker = Chunker(self.tokenizer_path, self.chunking)
            self._analyzer = Analyzer(self.analyzer_config)
        assert self._analyzer is not None
        t = time.perf_counter()
        chunks = self._chunker.chunk(batch)
        passages = chunk_passages(batch, chunks)
        keys = chunk_keys(self.identity, passages)
        t1 = time.perf_counter()
        terms = self._analyzer.batch(passages)
        return Prepared(chunks, passages, keys, terms, t1 - t, time.perf_counter() - t1)


def encode_passages(embedder: Embedder, token_encoder: TokenEncoder | None, storage: str,
                    passages: list[str]) -> tuple[np.ndarray, TokenStore | None]:
    """The dense vectors of ``passages`` and their token store in ``storage`` (None without token vectors)."""
    own_tokens = token_encoder is not None and isinstance(token_encoder, EmbedderTokens)
    enc = embedder.encode(passages, with_tokens=own_tokens)
    per_passage = enc.token_vectors
    if token_encoder is not None and not own_tokens:
        per_passage = token_encoder.encode_documents(passages)
    store = None
    if token_encoder is not None and per_passage is not None:
        store = TokenStore.from_lists(per_passage, token_encoder.dim, storage)
    return enc.embeddings, store


def store_groups(store: TokenStore | None) -> tuple[np.ndarray, np.ndarray] | None:
    """A pooled store's (groups, group offsets), what a checkpoint keeps beside its vectors (None otherwise)."""
    if store is None or store.groups is None or store.group_offsets is None:
        return None
    return store.groups, store.group_offsets


def checkpoint(work: BuildWork, keys: np.ndarray, vectors: np.ndarray, store: TokenStore | None,
                storage: str) -> Source:
    """One batch of encodings written to the build's work folder (atomically), as a source."""
    try:
        seg = work.write(keys, vectors, None if store is None else store.vectors,
                         None if store is None else store.offsets, None if store is None else store.scales,
                         store_groups(store))
    except OSError as e:
        raise SnapshotError(f"cannot write the build's checkpoint under {work.folder}: {e.strerror or e}") from None
    seg.storage = storage
    return seg


class BuildWorkers(Protocol):
    """Where a build's batches are prepared and encoded: this process (:class:`LocalWorkers`) or a Ray cluster
    (:class:`index_builder.build.ray_build.RayWorkers`). Either writes each encoded batch as a checkpoint segment."""

    def prepared(self, batches: Iterable[list[Document]]) -> Iterator[tuple[list[Document], Prepared]]:
        """Each batch with its :class:`Prepared`, in the order given."""

    def submit(self, keys: np.ndarray, passages: list[str]) -> None:
        """Encode a batch into a segment (may wait while too many are in flight)."""

    def finished(self, wait: bool = False) -> list[tuple[np.ndarray, Source]]:
        """The batches encoded since the last call (keys, segment); ``wait``: all that were submitted."""

    def close(self) -> None:
        """Release what the workers hold."""


class LocalWorkers:
    """Everything in this process, in order: each batch encoded and checkpointed when submitted."""

    def __init__(self, preparer: Preparer, embedder: Embedder, token_encoder: TokenEncoder | None, storage: str,
                 work: BuildWork) -> None:
        self.preparer, self.embedder, self.token_encoder, self.storage, self.work = \
            preparer, embedder, token_encoder, storage, work
        self._done: list[tuple[np.ndarray, Source]] = []
        self.encode_s = 0.0

    def prepared(self, batches: Iterable[list[Document]]) -> Iterator[tuple[list[Document], Prepared]]:
        return ((batch, self.preparer(batch)) for batch in batches)

    def submit(self, keys: np.ndarray, passages: list[str]) -> None:
        t = time.perf_counter()
        vectors, store = encode_passages(self.embedder, self.token_encoder, self.storage, passages)
        self._done.append((keys, checkpoint(self.work, keys, vectors, store, self.storage)))
        self.encode_s += time.perf_counter() - t

    def finished(self, wait: bool = False) -> list[tuple[np.ndarray, Source]]:
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        pass
