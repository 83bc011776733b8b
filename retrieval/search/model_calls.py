"""How the pipeline reaches its models: one cross-request micro-batcher per model role.

Roles: query embedding (with the embedder's token states, which late interaction uses when no ColBERT model is
configured), ColBERT query token encoding, and cross-encoder pair scoring. Each batcher runs its batches on a
small dedicated model pool, apart from the BM25/faiss pool, so index work never queues behind a model batch.
With batching disabled (``enabled = false`` per role) every request calls the model alone: the baseline the
batching benchmark compares against. Cross-encoder scores of (query, passage) pairs can be kept in a bounded LRU
(:class:`PairCache`, ``[rerank] ce_cache_pairs``): a repeated query with another filter, depth or tenant scope, or
one that the semantic cache does not answer, pays only for the pairs it has not seen.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from index_builder.models.encoders import CrossEncoder, Embedder
from index_builder.models.token_encoders import EmbedderTokens, TokenEncoder
from rerank.cross_encoder import pairs_for
from retrieval.search.batching import MicroBatcher
from retrieval.search.settings import BatchingConfig  # noqa: F401  (its section lives with the search settings)


class PairCache:
    """Cross-encoder logits of (query, passage) pairs, at most ``capacity`` of them, least recently used evicted.
    Keys are 16-byte digests of the exact texts, so a cached score is the score of the same input (a passage
    window is its own text). One per cross-encoder; used from the pipeline's loop and a solo search's thread (one lock)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._scores: OrderedDict[bytes, float] = OrderedDict()
        self.hits = self.misses = 0
        self._lock = threading.Lock()

    @staticmethod
    def key(query: str, passage: str) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        h.update(query.encode())
        h.update(b"\x00")
        h.update(passage.encode())
        return h.digest()

    def get(self, key: bytes) -> float | None:
        with self._lock:
            score = self._scores.get(key)
            if score is None:
                self.misses += 1
                return None
            self._scores.move_to_end(key)
            self.hits += 1
            return score

    def put(self, key: bytes, score: float) -> None:
        with self._lock:
            self._scores[key] = score
            self._scores.move_to_end(key)
            while len(self._scores) > self.capacity:
                self._scores.popitem(last=False)

    def snapshot(self) -> dict[str, Any]:
        total = self.hits + self.misses
        return {"entries": len(self._scores), "capacity": self.capacity, "hits": self.hits, "misses": self.misses,
                "hit_rate": round(self.hits / total, 4) if total else 0.0}


class ModelCalls:
    def __init__(self, embedder: Embedder, token_encoder: TokenEncoder | None, cross_encoder: CrossEncoder | None,
                 config: BatchingConfig, pair_cache: int = 0) -> None:
        self.embedder = embedder
        self.token_encoder = token_encoder
        self.cross_encoder = cross_encoder
        self.executor = ThreadPoolExecutor(config.model_workers, thread_name_prefix="hybridrag-model")
        self.embedder_tokens = isinstance(token_encoder, EmbedderTokens)
        self.embed: MicroBatcher[str, tuple[np.ndarray, np.ndarray | None]] = MicroBatcher(
            self._embed_batch, config.embed, executor=self.executor, name="embed")
        self.query_tokens: MicroBatcher[str, np.ndarray] | None = None
        if token_encoder is not None and not self.embedder_tokens:
            self.query_tokens = MicroBatcher(token_encoder.encode_queries, config.query_tokens,
                                             executor=self.executor, name="query_tokens")
        self.pairs: MicroBatcher[tuple[str, str], float] | None = None
        if cross_encoder is not None:
            score: Any = cross_encoder.score  # returns an array of floats: a Sequence[float] to the batcher
            self.pairs = MicroBatcher(score, config.cross_encoder, executor=self.executor, name="cross_encoder")
        self.pair_cache = PairCache(pair_cache) if cross_encoder is not None and pair_cache > 0 else None

    @staticmethod
    def _direct(batcher: MicroBatcher[Any, Any], fn: Callable[[list[Any]], Any], items: list[Any],
                cancelled: threading.Event) -> list[Any]:
        """``fn`` over ``items`` on this thread (a solo search), in batches of the batcher's ``max_batch_size``,
        each recorded in its statistics and metrics as a call of the model with no queue wait. Once ``cancelled``
        is set (the caller went away), the batches not yet started are dropped (counted) and CancelledError
        raised: the same bound on wasted work as the batcher's."""
        out: list[Any] = []
        size = max(1, batcher.config.max_batch_size)
        for start in range(0, len(items), size):
            if cancelled.is_set():
                with batcher.stats._lock:
                    batcher.stats.dropped += len(items) - start
                raise asyncio.CancelledError("the solo search's caller cancelled")
            chunk = items[start:start + size]
            try:
                out.extend(fn(chunk))
            except BaseException:
                batcher.stats.record(len(chunk), [0.0] * len(chunk), failed=True, direct=True)
                raise
            batcher.stats.record(len(chunk), [0.0] * len(chunk), failed=False, direct=True)
        return out

    @property
    def batchers(self) -> list[MicroBatcher[Any, Any]]:
        return [b for b in (self.embed, self.query_tokens, self.pairs) if b is not None]

    def _embed_batch(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        enc = self.embedder.encode(texts, with_tokens=self.embedder_tokens)
        tokens: list[np.ndarray | None] = list(enc.token_vectors) if enc.token_vectors else [None] * len(texts)
        return [(enc.embeddings[i], None if (t := tokens[i]) is None else t.astype(np.float32)) for i in range(len(texts))]

    async def embed_query(self, query: str, direct: threading.Event | None = None
                          ) -> tuple[np.ndarray, np.ndarray | None, float]:
        """The query's embedding, its embedder token vectors (None when ColBERT serves late interaction), and
        its queue wait in ms. ``direct`` (a solo search's cancel flag): the model runs on this thread, not through
        the batcher."""
        if direct is not None:
            vec, tokens = self._direct(self.embed, self._embed_batch, [query], direct)[0]
            return vec, tokens, 0.0
        (vec, tokens), wait = await self.embed.submit_timed(query)
        return vec, tokens, wait

    async def encode_query_tokens(self, query: str) -> tuple[np.ndarray, float]:
        assert self.query_tokens is not None
        return await self.query_tokens.submit_timed(query)

    async def _score(self, pairs: list[tuple[str, str]], direct: threading.Event | None
                     ) -> Sequence[float] | np.ndarray:
        assert self.pairs is not None and self.cross_encoder is not None
        if direct is not None:
            return self._direct(self.pairs, self.cross_encoder.score, pairs, direct)
        return await self.pairs.submit_many(pairs)

    async def score_pairs(self, query: str, passages: Sequence[str], direct: threading.Event | None = None
                          ) -> np.ndarray:
        """The cross-encoder's logit per passage, float32 [len(passages)]; only pairs not in the pair cache are
        sent to the model. ``direct`` (a solo search's cancel flag): the model runs on this thread, not through
        the batcher."""
        cache = self.pair_cache
        if cache is None:
            return np.asarray(await self._score(pairs_for(query, passages), direct), dtype=np.float32)
        keys = [cache.key(query, p) for p in passages]
        out = np.empty(len(passages), dtype=np.float32)
        miss = []
        for i, key in enumerate(keys):
            score = cache.get(key)
            if score is None:
                miss.append(i)
            else:
                out[i] = score
        if miss:
            scores = await self._score(pairs_for(query, [passages[i] for i in miss]), direct)
            for i, score in zip(miss, scores, strict=True):
                out[i] = score
                cache.put(keys[i], float(score))
        return out

    def stats(self) -> dict[str, dict[str, Any]]:
        stats = {b.name: b.snapshot() for b in self.batchers}
        if self.pair_cache is not None:
            stats["cross_encoder_pairs"] = self.pair_cache.snapshot()
        return stats

    async def aclose(self) -> None:
        for b in self.batchers:
            await b.close()

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True)
