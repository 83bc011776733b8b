"""The retrieval pipeline over one index generation: validate, run the stages, report timings.

First stage: BM25 and dense (embed + HNSW) run in parallel, each returning its top-N documents (best chunk per
document), then RRF fuses them. If the dense side is unavailable (no HNSW index, embedder failure) BM25 serves
alone and the result is marked degraded with the reason.
Cascade: late interaction reorders the fused top ``li_top_k`` by MaxSim over each candidate passage's stored token
vectors, then the cross-encoder reorders the top ``ce_top_k``; everything below a stage's head keeps its order.
Scores are comparable only within the stage that produced them (``SearchResult.stages`` keeps each stage's list).

Concurrency: the request logic is one coroutine, run on the pipeline's own event loop thread; BM25, faiss and
MaxSim run on a bounded worker pool, model calls go through cross-request micro-batchers
(:mod:`retrieval.search.model_calls`), so concurrent requests share ONNX runs. :meth:`Pipeline.search` is the blocking
entry point (CLI, evaluation, worker threads), :meth:`Pipeline.search_async` the one for asyncio callers (the
gRPC server); both run the same code. Solo requests (``first_stage.solo_when_idle``, the default): a request that
finds no other search running skips that machinery and runs the same stage code in sequence on one thread kept
for it (always the same one), its models called directly: no batcher to wait in, no pool round trips
(:meth:`Pipeline._solo`). Requests arriving meanwhile take the batched path, so batches still form under load.

Semantic cache (:mod:`retrieval.search.semantic_cache`, when configured): the query is embedded first; a cached query of
the same scope (filter and options) and generation whose embedding is at or above the threshold answers at once
(``SearchResult.cache_hit``). Otherwise the search runs with that embedding and a complete (not degraded) result
is cached. A cached value read from outside the process (the Redis-shared cache) answers only if it is a result
this index could have given this request (:func:`check_cached_result`); any other is a miss.

Deadlines: given an absolute deadline (``time.monotonic()`` seconds) or a configured budget, a request whose
deadline has passed is refused (:class:`DeadlineExceeded`) before it starts; later, the cross-encoder and then
late interaction are skipped when the time left is below their recent p95 latency, and the result says so.

Tracing (:mod:`retrieval.observability.tracing`): ``hybridrag.search`` under the caller's current span, a child span per stage.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
from opentelemetry import context as otel_context
from opentelemetry.trace import Tracer
from threadpoolctl import threadpool_limits

from index_builder.models import CrossEncoder, CrossEncoderConfig, Embedder, EmbedderConfig
from index_builder.token_encoders import TokenEncoder, TokenEncoderConfig, identity, make_token_encoder
from index_builder.types import Hits
from rerank.cross_encoder import decisive_gap, rerank_by_scores
from rerank.late_interaction import SCORES as LI_SCORES
from rerank.late_interaction import Reordering
from rerank.maxsim import maxsim
from rerank.windows import best_window, char_span
from retrieval.errors import DeadlineExceeded, InvalidRequest
from retrieval.observability.tracing import NO_TRACER, child_span
from retrieval.search.cache_check import InvalidEntry, check_result
from retrieval.search.filters import Filter
from retrieval.search.fusion import FusionConfig, rrf
from retrieval.search.index import IndexSettings, SearchIndex
from retrieval.search.model_calls import BatchingConfig, ModelCalls
from retrieval.search.request import FIRST_STAGES, SearchRequest
from retrieval.search.semantic_cache import SemanticCache, SemanticCacheConfig
from retrieval.search.view import IndexView

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class FirstStageConfig:
    """``candidates``: top-N taken from each retriever before fusion; ``max_k``/``max_candidates``: request limits."""

    candidates: int = 100
    max_k: int = 100
    max_candidates: int = 1000
    # An abuse bound, not a use bound: whole passages are normal queries for "find the related passage /
    # counter-argument / similar case" workloads (issue #23; 2,048 refused a quarter of an argument-retrieval
    # set). The encoders truncate at their max_length; BM25 reads every term (analysis is linear: a 32 KiB query
    # costs about a millisecond); Generate cuts the question to generation.max_question_tokens.
    max_query_chars: int = 32_768
    parallel: bool = True  # BM25 and dense search run concurrently in the worker pool
    workers: int = 4
    # BLAS threads for the pipeline's numpy work (MaxSim): its small matrix products gain nothing from threads,
    # and OpenBLAS's idle threads spin and steal the encoder's cores (pipeline p50 on SciFact: 48 ms with the
    # default threads, 24 ms with 1). 0 leaves the process setting alone.
    blas_threads: int = 1
    # > 0: the dense search and late interaction (about 1 and 3 ms) run on the event loop itself, not in the
    # worker pool, while at most this many searches are in flight (two hand-offs fewer for a lone request). Measured
    # on SciFact, no gain at one caller (19.8 against 19.1 ms p50 in the pool, within noise), so 0: always in the
    # pool (docs/results/interactive-cascade.md).
    inline_max_active: int = 0
    # true: a request that finds no other search running, on an in-process index with the embedder's own token
    # vectors, runs all its stages in sequence on one thread kept for solo searches (blocking callers: on their
    # own thread): no batcher, no pool round trips, one hand-off in and one back. Requests that arrive meanwhile
    # take the batched path. Always the same thread: handed to whichever model-pool worker was free, the stages'
    # own compute ran about 1.4 ms slower in the server (SciFact, one caller: p50 10.0 against 8.6 ms end to end).
    # Measured on SciFact (2 cores, one run): p50 at one caller 8.6-9.3 ms against 10.8 batched (1.13-1.18x
    # against 1.52x the compute floor), QPS at 16 callers equal, the same answers. See Pipeline._solo and
    # docs/results/interactive-cascade.md.
    solo_when_idle: bool = True

    def __post_init__(self) -> None:
        if self.inline_max_active < 0:
            raise ValueError(f"inline_max_active must be >= 0 (0 = always in the pool), got {self.inline_max_active}")
        if not 1 <= self.candidates <= self.max_candidates:
            raise ValueError(f"candidates must be in [1, {self.max_candidates}], got {self.candidates}")


@dataclass(frozen=True)
class RerankConfig:
    """The cascade after fusion: late interaction (MaxSim over stored token vectors) reorders the top
    ``li_top_k``, then the cross-encoder reorders the top ``ce_top_k``. ``max_top_k``: the largest K a request
    may ask for.

    Defaults from the tuning splits (SciFact train, NFCorpus dev, and the doc-query sets built from those splits,
    ``bench/ood.py``), chosen by the worst case over them, not the mean (``bench/cascade_robustness.py``;
    docs/results/cascade-robustness.md). Late interaction with the embedder's own token vectors, blended half and
    half with the fused order (``li_weight = 0.5``), gains +0.010 to +0.013 on the short-query sets; alone
    (weight 1) it lost up to 0.019 on passage-sized queries. On queries over 128 query tokens no weight gains
    more than +0.0006 on any long-query tuning set, so it does not run for them (``li_long_weight = 0``; the
    response names the skip). The shipped cross-encoder lowered the late-interaction list on NFCorpus dev, so it
    is off.

    Deadlines: a stage is skipped (and the result marked degraded) when the time left before the request's
    deadline is below that stage's recent p95 latency (over the last ``latency_window`` runs); the cross-encoder
    goes first, then late interaction. ``budget_ms`` > 0 gives requests without a deadline one.

    Cross-encoder cost levers (docs/results/interactive-cascade.md): ``ce_window_tokens`` > 0 scores only each
    passage's best window of that many tokens, found by late interaction's token similarities
    (:mod:`rerank.windows`; needs the index's token vectors and the embedder's own query token vectors, else the
    whole passage is scored); ``ce_gate_gap`` > 0 skips the cross-encoder when the head is already decisive (its
    first two scores at least that many standard deviations apart, :func:`rerank.cross_encoder.decisive_gap`; the
    response names the skip); ``ce_cache_pairs`` > 0 keeps that many pair scores
    (:class:`retrieval.search.model_calls.PairCache`).

    ``li_weight`` / ``ce_weight``: the stage's share in its head's new order; below 1 the stage's scores are blended
    with the order it received (:mod:`rerank.interpolation`; ``hybridrag train`` reports the best weight on dev).
    1 = the stage alone. ``li_long_query_tokens`` > 0: queries with more query tokens, or that the encoder had
    to cut, take ``li_long_weight`` instead (0: late interaction is skipped for them; :meth:`is_long`). ``li_score``: ``maxsim``
    or ``token_z`` (:func:`rerank.late_interaction.head_scores`; measured, not better: the default stays).
    """

    late_interaction: bool = True
    li_top_k: int = 20
    li_weight: float = 0.5
    li_score: str = "maxsim"
    li_long_query_tokens: int = 128
    li_long_weight: float = 0.0
    cross_encoder: bool = False
    ce_top_k: int = 5
    ce_weight: float = 1.0
    ce_window_tokens: int = 0
    ce_gate_gap: float = 0.0
    ce_cache_pairs: int = 0
    max_top_k: int = 100
    budget_ms: float = 0.0
    latency_window: int = 200

    def __post_init__(self) -> None:
        for name in ("li_top_k", "ce_top_k"):
            if not 1 <= getattr(self, name) <= self.max_top_k:
                raise ValueError(f"{name} must be in [1, {self.max_top_k}], got {getattr(self, name)}")
        if self.budget_ms < 0 or self.latency_window < 1:
            raise ValueError("budget_ms must be >= 0 and latency_window >= 1")
        for name in ("li_weight", "ce_weight", "li_long_weight"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1] (1 = the stage alone), got {getattr(self, name)}")
        if self.li_score not in LI_SCORES:
            raise ValueError(f"li_score must be one of {', '.join(LI_SCORES)}, got {self.li_score!r}")
        for name in ("ce_window_tokens", "ce_cache_pairs"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = off), got {getattr(self, name)}")
        if self.ce_gate_gap < 0:
            raise ValueError(f"ce_gate_gap must be >= 0 (0 = never skip), got {self.ce_gate_gap}")
        if self.li_long_query_tokens < 0:
            raise ValueError(f"li_long_query_tokens must be >= 0 (0 = one weight for every query), "
                             f"got {self.li_long_query_tokens}")

    def is_long(self, query_tokens: int, truncated: bool = False) -> bool:
        """A query of ``query_tokens`` token vectors is long when it has more than ``li_long_query_tokens``, or
        when the encoder had to truncate it (a query longer than the encoder's window is a passage, whatever the
        window: with a 128-piece encoder no query would otherwise pass 128)."""
        return bool(self.li_long_query_tokens) and (query_tokens > self.li_long_query_tokens or truncated)

    def li_weight_for(self, query_tokens: int, truncated: bool = False) -> float:
        """The late-interaction weight for a query of ``query_tokens`` token vectors.

        >>> RerankConfig(li_weight=0.5, li_long_query_tokens=0).li_weight_for(300)
        0.5
        >>> RerankConfig(li_weight=0.5, li_long_query_tokens=64, li_long_weight=0.0).li_weight_for(300)
        0.0
        >>> RerankConfig(li_weight=0.5, li_long_query_tokens=128, li_long_weight=0.0).li_weight_for(126, True)
        0.0
        """
        return self.li_long_weight if self.is_long(query_tokens, truncated) else self.li_weight


class SearchSettings(Protocol):
    """The configuration sections the pipeline reads (``retrieval.config.AppConfig`` has them; so may any object
    with these attributes). The pipeline imports no application config: each component declares what it reads."""

    @property
    def first_stage(self) -> FirstStageConfig: ...

    @property
    def fusion(self) -> FusionConfig: ...

    @property
    def rerank(self) -> RerankConfig: ...

    @property
    def batching(self) -> BatchingConfig: ...

    @property
    def late_interaction(self) -> TokenEncoderConfig: ...


class OpenSettings(SearchSettings, IndexSettings, Protocol):
    """What :meth:`Pipeline.open` reads besides: the models to load and the semantic cache."""

    @property
    def embedder(self) -> EmbedderConfig: ...

    @property
    def cross_encoder(self) -> CrossEncoderConfig: ...

    @property
    def cache(self) -> SemanticCacheConfig: ...


def reorder(hits: Hits, r: Reordering) -> Hits:
    """Apply a reranker's permutation; the head takes the reranker's scores, the tail keeps its own."""
    scores = hits.scores[r.order].astype(np.float32)
    head = ~np.isnan(r.scores)
    scores[head] = r.scores[head]
    return Hits(hits.doc[r.order], scores, hits.chunk[r.order])


@dataclass
class SearchResult:
    """Final ranking plus what each stage returned, how long it took (ms) and what was skipped and why."""

    hits: Hits
    stages: dict[str, Hits] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    degraded: bool = False
    generation: int = 0
    index: Any = None  # the index generation (or live view) that served it: resolve doc/chunk ids against this one
    query_vec: np.ndarray | None = None  # the query embedding, when the dense side ran
    cache_hit: bool = False
    cache_similarity: float = 0.0  # cosine to the cached query that answered (cache hits only)

    def doc_ids(self) -> list[str]:
        return [self.index.documents[d].id for d in self.hits.doc.tolist()]

    def detached(self) -> SearchResult:
        """This result with ``index`` replaced by a :class:`ResultView` of just its documents and passages: what
        the semantic cache keeps. A cached result holding the live view itself pinned that view's whole write
        buffer for the entry's lifetime (tens of MB per entry under a write load)."""
        return dataclasses.replace(self, index=ResultView(self.index, self.hits))

    def approx_bytes(self) -> int:
        """Roughly what this result holds in memory (arrays, vector, and passages when detached), for byte-bounded
        caches."""
        n = self.hits.doc.nbytes * 3 + sum(h.doc.nbytes * 3 for h in self.stages.values())
        n += 0 if self.query_vec is None else self.query_vec.nbytes
        if isinstance(self.index, ResultView):
            n += self.index.nbytes
        return n + 512


class ResultView:
    """The part of an index generation (or live view) that one result needs: the documents and passages of its
    hits, keyed by the same document and chunk numbers, so code reading ``result.index.documents[d]`` and
    ``result.index.passage(c)`` works unchanged."""

    def __init__(self, index: Any, hits: Hits) -> None:
        docs, chunks = hits.doc.tolist(), hits.chunk.tolist()
        self.documents = {d: index.documents[d] for d in docs}
        self._passages = {c: index.passage(c) for c in chunks}
        self.generation = index.generation
        self.nbytes = sum(len(p) for p in self._passages.values()) + sum(
            len(d.title) + 64 * (1 + len(d.metadata)) for d in self.documents.values())

    @property
    def passages(self) -> dict[int, str]:
        return self._passages

    def passage(self, chunk: int) -> str:
        return self._passages[chunk]


def check_cached_result(value: Any, index: IndexView, filter: Filter, k: int) -> None:
    """What a cache read from outside the process must hold to answer a search of ``k`` under ``filter`` on
    ``index`` (raises :class:`~retrieval.search.cache_check.InvalidEntry`; see
    :func:`~retrieval.search.cache_check.check_result`)."""
    if not isinstance(value, SearchResult):
        raise InvalidEntry(f"a {type(value).__name__}, not a search result")
    check_result(value, index, filter, k)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


class StageLatency:
    """Recent latencies per stage (a bounded window), for deadline decisions."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._ms: dict[str, deque[float]] = {}

    def record(self, stage: str, ms: float) -> None:
        self._ms.setdefault(stage, deque(maxlen=self.window)).append(ms)

    def p95(self, stage: str) -> float:
        """The stage's recent p95 in ms; 0.0 before it has run (an unknown stage is given the chance to run)."""
        values = self._ms.get(stage)  # list(): one C call under the GIL, safe while a solo search appends
        return float(np.percentile(np.array(list(values), dtype=np.float64), 95)) if values else 0.0


class Pipeline:
    def __init__(self, index: IndexView, embedder: Embedder, config: SearchSettings,
                 executor: Executor | None = None, cross_encoder: CrossEncoder | None = None,
                 token_encoder: TokenEncoder | None = None, cache: SemanticCache | None = None,
                 tracer: Tracer = NO_TRACER) -> None:
        self.index = index
        self.tracer = tracer
        self.cache = cache
        self.embedder = embedder
        self.config = config
        self.token_encoder = token_encoder or make_token_encoder(config.late_interaction, embedder)
        self.cross_encoder = cross_encoder
        self.models = ModelCalls(embedder, self.token_encoder, cross_encoder, config.batching,
                                 pair_cache=config.rerank.ce_cache_pairs)
        self.latency = StageLatency(config.rerank.latency_window)
        if config.first_stage.blas_threads > 0:  # process-wide (BLAS has one pool); see FirstStageConfig
            threadpool_limits(limits=config.first_stage.blas_threads, user_api="blas")
        self._own_executor = executor is None
        self.executor = executor or ThreadPoolExecutor(config.first_stage.workers, thread_name_prefix="hybridrag")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._bound = False  # bind_loop: the loop belongs to the caller
        self._active = 0  # searches in flight (on the loop: no lock)
        self.inlined = 0  # stage calls run on the loop rather than in the pool (inline_max_active)
        self._solo_lock = threading.Lock()  # held by the one solo search (first_stage.solo_when_idle)
        # the one thread async solo searches run on (one at a time: the lock above), always the same one (handed to
        # whichever model-pool worker was free, the stages ran ~1.4 ms slower: FirstStageConfig.solo_when_idle)
        self._solo_executor = ThreadPoolExecutor(1, thread_name_prefix="hybridrag-solo")
        self._solo_cancel = threading.Event()  # that search's caller went away (set by search_async); one at a time
        self._entered = 0  # searches between entry and answer, solo or not (any thread: under _entered_lock)
        self._entered_lock = threading.Lock()
        self.solo_runs = 0

    def publish(self, view: IndexView) -> None:
        """Serve ``view`` from the next request on (an atomic reference swap; requests in flight keep theirs).
        The live index calls this with every new view (``live.on_publish(pipeline.publish)``)."""
        self.index = view

    @classmethod
    def open(cls, index_dir: str | Path, config: OpenSettings, tracer: Tracer = NO_TRACER) -> Pipeline:
        """Load the models the configuration names and the snapshot ``index_dir/CURRENT`` points at."""
        embedder = Embedder(config.embedder)
        return cls.over(SearchIndex.load(index_dir, config, embedder), embedder, config, tracer)

    @classmethod
    def over(cls, index: IndexView, embedder: Embedder, config: OpenSettings, tracer: Tracer = NO_TRACER,
             cache: Any = None) -> Pipeline:
        """A pipeline over an opened index (any backend) with the configured cross-encoder and cache (``cache``:
        one made by the caller, e.g. the shared one)."""
        cross_encoder = CrossEncoder(config.cross_encoder) if config.cross_encoder.model else None
        if cache is None and config.cache.enabled:
            cache = SemanticCache(config.cache)
        return cls(index, embedder, config, cross_encoder=cross_encoder, cache=cache, tracer=tracer)

    # ------------------------------------------------------------------ lifecycle and entry points

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name="hybridrag-pipeline", daemon=True)
                self._thread.start()
                self._loop = loop
            return self._loop

    def bind_loop(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Run the pipeline's coroutines (its stages and batchers) on ``loop`` (default: the running one) instead
        of on a thread of its own. A server whose door runs on that loop then awaits each request directly: no
        cross-thread hand-off into the pipeline and back (two loop wake-ups through ``call_soon_threadsafe``, each
        waiting for the GIL). Blocking :meth:`search` still works from other threads. Close with :meth:`aclose`
        from the loop."""
        with self._lock:
            if self._loop is not None:
                raise RuntimeError("the pipeline already runs on an event loop")
            self._loop = loop or asyncio.get_running_loop()
            self._thread = threading.current_thread() if loop is None else None
            self._bound = True

    async def aclose(self) -> None:
        """:meth:`close` for a pipeline bound to the running loop (:meth:`bind_loop`)."""
        if not self._bound or asyncio.get_running_loop() is not self._loop:
            await asyncio.get_running_loop().run_in_executor(None, self.close)
            return
        with self._lock:
            self._loop, self._thread = None, None
        await self.models.aclose()
        await asyncio.get_running_loop().run_in_executor(None, self._shutdown_pools)

    def _shutdown_pools(self) -> None:
        self.models.shutdown()
        self._solo_executor.shutdown(wait=True)
        if self._own_executor:
            self.executor.shutdown(wait=True)

    def start_threads(self, timeout_s: float = 30.0, on_each: Callable[[], None] | None = None) -> None:
        """Start every worker thread of the pipeline's pools now rather than at first use, running ``on_each`` on
        each of them (a server sets their priority so), and the first requests do not pay for thread creation."""
        pools: list[tuple[Executor, int]] = [(self.models.executor, self.config.batching.model_workers),
                                             (self._solo_executor, 1)]
        if self._own_executor:
            pools.append((self.executor, self.config.first_stage.workers))
        for pool, n in pools:
            barrier = threading.Barrier(n)

            def work(b: threading.Barrier = barrier) -> None:
                if on_each is not None:
                    on_each()
                b.wait(timeout_s)  # every worker holds one task at once: n distinct threads

            for f in [pool.submit(work) for _ in range(n)]:
                f.result()

    def _submit(self, coro: Coroutine[Any, Any, T]):
        return asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())

    def close(self) -> None:
        with self._lock:
            if self._bound and self._loop is not None and self._thread is threading.current_thread():
                raise RuntimeError("a pipeline bound to this thread's loop closes with 'await aclose()'")
            loop, thread, self._loop = self._loop, self._thread, None
        if loop is not None and self._bound:  # not our loop: stop nothing, just the batchers on it
            asyncio.run_coroutine_threadsafe(self.models.aclose(), loop).result()
        elif loop is not None and thread is not None:
            asyncio.run_coroutine_threadsafe(self.models.aclose(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
        self._shutdown_pools()

    def search(self, query: str | SearchRequest, k: int = 10, **options: Any) -> SearchResult:
        """Blocking search (thread-safe: concurrent callers' model calls are batched together). Takes a
        :class:`SearchRequest`, or a query with the request's fields as keywords."""
        if self._loop is not None and threading.current_thread() is self._thread:
            raise RuntimeError("Pipeline.search blocks: call search_async from the pipeline's own loop")
        request = self._request(query, k, options)
        solo = self._enter()
        try:
            if solo:
                return self._solo(request)
            return self._submit(self._search(request)).result()
        finally:
            self._leave()

    async def search_async(self, query: str | SearchRequest, k: int = 10, **options: Any) -> SearchResult:
        """Awaitable search for asyncio callers on any event loop (the same arguments as :meth:`search`)."""
        request = self._request(query, k, options)
        solo = self._enter()
        try:
            if solo:
                run = functools.partial(contextvars.copy_context().run, self._solo, request)  # keeps the trace parent
                cancel = self._solo_cancel
                try:
                    return await asyncio.get_running_loop().run_in_executor(self._solo_executor, run)
                except asyncio.CancelledError:
                    cancel.set()  # its model calls stop before their next batch
                    raise
            if asyncio.get_running_loop() is self._loop:
                return await self._search(request)
            return await asyncio.wrap_future(self._submit(self._search(request)))
        finally:
            self._leave()

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the pipeline's loop (where the batchers live) from any event loop."""
        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(self._submit(coro))

    async def embed_texts_async(self, texts: list[str]) -> np.ndarray:
        """The embedder's vectors of ``texts`` (float32 ``(n, dim)``, normalised), through the same cross-request
        batcher as the queries' embeddings."""
        async def run() -> np.ndarray:
            out = await self.models.embed.submit_many(list(texts))
            return np.stack([vec for vec, _ in out]).astype(np.float32, copy=False)
        return await self._on_loop(run())

    def rerank_stage(self, stage: str) -> str:
        """The reranking stage a caller names, checked ("" = the cascade's last configured one)."""
        if not stage:
            return "cross_encoder" if self.cross_encoder is not None and self.config.rerank.cross_encoder else \
                "late_interaction"
        if stage not in ("late_interaction", "cross_encoder"):
            raise InvalidRequest(f"unknown rerank stage {stage!r}; allowed: ['cross_encoder', 'late_interaction']")
        if stage == "cross_encoder" and self.cross_encoder is None:
            raise InvalidRequest("no cross-encoder is configured on this server ([cross_encoder] model)")
        return stage

    async def rerank_texts_async(self, query: str, texts: list[str], stage: str = "") -> tuple[str, np.ndarray]:
        """Scores of the caller's ``texts`` for ``query`` by one reranking stage (float32 ``(n,)``, higher =
        better): the cross-encoder's logits, or MaxSim of the token encoder's vectors (the documents are encoded
        now: they are not in the index)."""
        stage = self.rerank_stage(stage)

        async def run() -> np.ndarray:
            if stage == "cross_encoder":
                return await self.models.score_pairs(query, texts)
            if self.models.embedder_tokens:
                _, tokens, _ = await self.models.embed_query(query)
            else:
                tokens, _ = await self.models.encode_query_tokens(query)
            assert tokens is not None
            docs = await asyncio.get_running_loop().run_in_executor(self.models.executor,
                                                                    self.token_encoder.encode_documents, texts)
            return np.array([maxsim(tokens, d) for d in docs], dtype=np.float32)
        return stage, await self._on_loop(run())

    def _request(self, query: str | SearchRequest, k: int, options: dict[str, Any]) -> SearchRequest:
        if isinstance(query, SearchRequest):
            if options:
                raise TypeError("pass either a SearchRequest or a query with options, not both")
            return self.resolve(query)
        return self.resolve(SearchRequest.of(query, k, **options))

    def batcher_stats(self) -> dict[str, dict[str, Any]]:
        return self.models.stats()

    # ------------------------------------------------------------------ validation

    def resolve(self, request: SearchRequest) -> SearchRequest:
        """``request`` with the configured defaults filled and every bound checked (once per request)."""
        fs, rr = self.config.first_stage, self.config.rerank
        return request.resolve(max_query_chars=fs.max_query_chars, max_k=fs.max_k, max_candidates=fs.max_candidates,
                               default_candidates=fs.candidates, max_top_k=rr.max_top_k, default_li_top_k=rr.li_top_k,
                               default_ce_top_k=rr.ce_top_k, default_stages=self.default_stages())

    def default_stages(self) -> tuple[str, ...]:
        r = self.config.rerank
        return FIRST_STAGES + (("late_interaction",) if r.late_interaction else ()) + (
            ("cross_encoder",) if r.cross_encoder else ())

    def embed_query(self, query: str) -> np.ndarray:
        return self.embedder.embed([query])[0]

    def late_interaction_unavailable(self, index: IndexView) -> str | None:
        """Why late interaction cannot serve on ``index`` with the configured token encoder (None if it can)."""
        if index.late is None:
            return "the snapshot has no token vectors"
        have = identity(index.token_encoder or {})
        want = identity(self.token_encoder.describe())
        if have != want:
            return (f"the snapshot's token vectors come from {index.token_encoder and index.token_encoder.get('name')!r}, "
                    f"the configured token encoder is {self.token_encoder.describe().get('name')!r} "
                    "(run 'hybridrag index tokens')")
        return None

    # ------------------------------------------------------------------ the request

    async def _in_pool(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def _in_pool_unless(self, solo: bool, fn, *args):
        return fn(*args) if solo else await self._in_pool(fn, *args)

    async def _inline_or_pool(self, index: IndexView, solo: bool, fn, *args):
        """``fn`` on the loop while few searches run (``first_stage.inline_max_active``), else in the pool. Only
        for an index whose searches are in-process compute (``in_process``): an engine's are network calls. A solo
        search runs it where it is."""
        if solo:
            return fn(*args)
        if getattr(index, "in_process", False) and self._active <= self.config.first_stage.inline_max_active:
            self.inlined += 1
            return fn(*args)
        return await self._in_pool(fn, *args)

    def _enter(self) -> bool:
        """Count a search in (from any thread) and say whether it runs solo (``first_stage.solo_when_idle``): no
        other search in flight (counted from entry, so one waiting for the pipeline's loop counts too), the index
        in-process, late interaction on the embedder's own token vectors (a ColBERT encoder has its own batcher),
        and no other solo search (the lock is taken here, released by :meth:`_solo`). Under load a search nearly
        always finds company and takes the batched path: a solo search holds its thread for its whole length and
        calls the models unbatched, which costs throughput once others wait (measured: docs/results/interactive-cascade.md)."""
        with self._entered_lock:
            self._entered += 1
            alone = self._entered == 1
        if (not alone or not self.config.first_stage.solo_when_idle or not self.models.embedder_tokens
                or not getattr(self.index, "in_process", False)):
            return False
        if not self._solo_lock.acquire(blocking=False):
            return False
        self._solo_cancel = threading.Event()
        return True

    def _leave(self) -> None:
        with self._entered_lock:
            self._entered -= 1

    def _solo(self, request: SearchRequest) -> SearchResult:
        """Run the request's stages on this thread, in sequence: the stages' coroutine is driven to its end in one
        step, since in solo mode nothing in it waits on a loop (models are called directly, index work inline).
        Measured on SciFact: docs/results/interactive-cascade.md."""
        try:
            self.solo_runs += 1
            coro = self._search(request, solo=True)
            try:
                coro.send(None)
            except StopIteration as done:
                return done.value
            coro.close()
            raise RuntimeError("a solo search waited on an event loop: a stage is not solo-safe")
        finally:
            self._solo_lock.release()

    async def _search(self, request: SearchRequest, solo: bool = False) -> SearchResult:
        """Run the stages of a resolved request; returns the top ``k`` documents (fused unless one first stage is
        asked). ``solo``: on the calling thread, without the loop (:meth:`_solo`)."""
        with self.tracer.start_as_current_span("hybridrag.search", attributes={"top_k": request.k}) as span:
            if not solo:  # solo searches are not counted: they hold the solo lock, and this counter is the loop's
                self._active += 1
            try:
                result = await self._run_stages(request, otel_context.get_current(), solo)
            finally:
                if not solo:
                    self._active -= 1
            if span.is_recording():
                span.set_attributes({"index.generation": result.generation, "cache_hit": result.cache_hit,
                                     "degraded": result.degraded, "stages": list(result.stages),
                                     "skipped": [f"{k}: {v}" for k, v in result.skipped.items()]})
            return result

    async def _run_stages(self, request: SearchRequest, trace: otel_context.Context,
                          solo: bool = False) -> SearchResult:
        """The body of :meth:`_search`; ``trace`` is the parent of the stage spans."""
        assert request.resolved and request.stages is not None and request.candidates is not None
        assert request.li_top_k is not None and request.ce_top_k is not None
        query, k, filter, stages = request.query, request.k, request.filter, request.stages
        candidates, li_top_k, ce_top_k = request.candidates, request.li_top_k, request.ce_top_k
        exact_dense, query_vec, deadline, use_cache = (request.exact_dense, request.query_vec, request.deadline,
                                                       request.use_cache)
        tracer = self.tracer
        rr = self.config.rerank
        direct = self._solo_cancel if solo else None  # a solo search calls its models on this thread
        if deadline is None and rr.budget_ms > 0:
            deadline = time.monotonic() + rr.budget_ms / 1000.0
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineExceeded("the request's deadline passed before it started")
        t_total = time.perf_counter()
        # before reading the index (see SemanticCache.put); only when the cache is used: a shared cache's epoch is a
        # Redis round trip
        epoch = self.cache.epoch() if self.cache is not None and use_cache else 0
        index = self.index  # one generation for the whole request
        result = SearchResult(hits=Hits.empty(), generation=index.generation, index=index)
        masks = index.filters.masks(filter)
        doc_mask, chunk_mask = masks if masks is not None else (None, None)

        want_li = "late_interaction" in stages
        if want_li and (why := self.late_interaction_unavailable(index)):
            result.skipped["late_interaction"] = why
            want_li = False
        want_ce = "cross_encoder" in stages
        if want_ce and self.cross_encoder is None:
            result.skipped["cross_encoder"] = "no cross-encoder model configured"
            want_ce = False

        scope = None
        if (self.cache is not None and use_cache and query_vec is None and "dense" in stages
                and index.dense is not None):
            scope = ("retrieve", filter, k, candidates, stages, li_top_k, ce_top_k, exact_dense)
            check = functools.partial(check_cached_result, index=index, filter=filter, k=k)
            t = time.perf_counter()
            hit = self.cache.lookup_exact(scope, index.generation, query, epoch, check=check)
            if hit is not None:  # an exact repeat: answered before anything is embedded
                result.timings_ms["cache"] = _ms(t)
                result.timings_ms["total"] = _ms(t_total)
                return dataclasses.replace(hit.value, timings_ms=result.timings_ms, cache_hit=True,
                                           cache_similarity=1.0)

        def run_bm25() -> tuple[Hits, float]:
            with child_span(tracer, "hybridrag.bm25", trace, {"candidates": candidates}):
                t = time.perf_counter()
                return index.bm25.search(query, candidates, doc_mask), _ms(t)

        bm25_task = None
        if "bm25" in stages and self.config.first_stage.parallel and "dense" in stages and not solo:
            bm25_task = asyncio.ensure_future(self._in_pool(run_bm25))  # overlaps the embedding (wasted on a cache hit)
        query_tokens: np.ndarray | None = None
        if scope is not None:
            try:
                with child_span(tracer, "hybridrag.embed", trace) as span:
                    t = time.perf_counter()
                    query_vec, query_tokens, wait = await self.models.embed_query(query, direct=direct)
                    result.timings_ms["embed_queue"] = wait
                    result.timings_ms["embed"] = _ms(t)
                    span.set_attribute("queue_wait_ms", result.timings_ms["embed_queue"])
            except Exception:  # the normal path below degrades to BM25 and says why
                log.exception("query embedding failed before the cache lookup")
                scope = None
            if query_vec is not None and scope is not None and self.cache is not None:
                with child_span(tracer, "hybridrag.cache_lookup", trace) as span:
                    t = time.perf_counter()
                    hit = self.cache.lookup(scope, index.generation, query_vec, query, epoch, check=check)
                    result.timings_ms["cache"] = _ms(t)
                    span.set_attribute("hit", hit is not None)
                if hit is not None:
                    cached: SearchResult = hit.value
                    result.timings_ms["total"] = _ms(t_total)
                    return dataclasses.replace(cached, timings_ms=result.timings_ms, query_vec=query_vec,
                                               cache_hit=True, cache_similarity=hit.similarity)

        # ColBERT query tokens are encoded alongside the first stage (embedder tokens come with the embedding).
        tokens_task = None
        if want_li and self.models.query_tokens is not None:
            assert not solo, "solo searches need the embedder's own token vectors"
            tokens_task = asyncio.ensure_future(self.models.encode_query_tokens(query))
        if "bm25" in stages and bm25_task is None:
            result.stages["bm25"], result.timings_ms["bm25"] = await self._in_pool_unless(solo, run_bm25)

        if "dense" in stages:
            if index.dense is None:
                result.skipped["dense"] = f"dense index unavailable: {index.dense_error}"
                result.degraded = True
            else:
                try:
                    if query_vec is not None and not (want_li and tokens_task is None and query_tokens is None):
                        vec = query_vec
                    else:
                        with child_span(tracer, "hybridrag.embed", trace) as span:
                            t = time.perf_counter()
                            vec, query_tokens, wait = await self.models.embed_query(query, direct=direct)
                            result.timings_ms["embed_queue"] = wait
                            result.timings_ms["embed"] = _ms(t)
                            span.set_attribute("queue_wait_ms", wait)
                    result.query_vec = vec
                    with child_span(tracer, "hybridrag.dense", trace, {"candidates": candidates, "exact": exact_dense}):
                        t = time.perf_counter()
                        result.stages["dense"] = await self._inline_or_pool(
                            index, solo, lambda: index.dense.search(vec, candidates, doc_mask, chunk_mask, exact=exact_dense))
                        result.timings_ms["dense"] = _ms(t)
                except Exception as e:  # an embedder/faiss failure degrades to BM25 instead of failing the query
                    log.exception("dense search failed; BM25 serves alone")
                    result.skipped["dense"] = f"dense search failed: {e}"
                    result.degraded = True
        if bm25_task is not None:
            result.stages["bm25"], result.timings_ms["bm25"] = await bm25_task

        t = time.perf_counter()
        ran = [s for s in FIRST_STAGES if s in result.stages]
        if len(ran) == 1:
            current = result.stages[ran[0]]
        else:
            with child_span(tracer, "hybridrag.fusion", trace):
                current = self.fuse(result.stages["bm25"], result.stages["dense"])
            result.timings_ms["fusion"] = _ms(t)
            result.stages["fused"] = current

        def left_ms() -> float:
            return float("inf") if deadline is None else (deadline - time.monotonic()) * 1000.0

        if want_li:
            need_li, need_ce = self.latency.p95("late_interaction"), self.latency.p95("cross_encoder")
            if want_ce and left_ms() < need_li + need_ce:
                result.skipped["cross_encoder"] = (f"deadline: {left_ms():.0f} ms left, below the late_interaction + "
                                                   f"cross_encoder p95 ({need_li:.0f} + {need_ce:.0f} ms)")
                want_ce, result.degraded = False, True
            if left_ms() < need_li:
                result.skipped["late_interaction"] = (f"deadline: {left_ms():.0f} ms left, below the late_interaction "
                                                      f"p95 ({need_li:.0f} ms)")
                want_li, result.degraded = False, True
        if want_li:
            t = time.perf_counter()
            with child_span(tracer, "hybridrag.late_interaction", trace, {"top_k": li_top_k}):
                if tokens_task is not None:
                    query_tokens, result.timings_ms["query_tokens_queue"] = await tokens_task
                elif query_tokens is None:  # dense skipped or failed, or a vector was given: encode now
                    _, query_tokens, _ = await self.models.embed_query(query, direct=direct)
                assert index.late is not None and query_tokens is not None
                # the embedder's token vectors skip [CLS] and [SEP]: max_length - 2 of them = the query was cut
                truncated = (self.models.embedder_tokens
                             and len(query_tokens) >= self.embedder.config.max_length - 2)
                li_weight = rr.li_weight_for(len(query_tokens), truncated)
                if li_weight > 0.0:
                    order = await self._inline_or_pool(index, solo, index.late.rerank, query_tokens, current.chunk,
                                                       li_top_k, li_weight, rr.li_score)
                    current = reorder(current, order)
            if li_weight > 0.0:
                result.stages["late_interaction"] = current
                result.timings_ms["late_interaction"] = ms = _ms(t)
                self.latency.record("late_interaction", ms)
            elif rr.is_long(len(query_tokens), truncated):  # a policy, not a degradation: the response says so
                cut = f", cut at the encoder's {self.embedder.config.max_length} pieces" if truncated else ""
                result.skipped["late_interaction"] = (
                    f"long query: {len(query_tokens)} query tokens{cut} (rerank.li_long_query_tokens = "
                    f"{rr.li_long_query_tokens}) and rerank.li_long_weight = 0: the fused order is kept")
            else:
                result.skipped["late_interaction"] = "rerank.li_weight = 0: the fused order is kept"
        elif tokens_task is not None:
            tokens_task.cancel()
        if want_ce and left_ms() < (need := self.latency.p95("cross_encoder")):
            result.skipped["cross_encoder"] = (f"deadline: {left_ms():.0f} ms left, below the cross_encoder p95 "
                                               f"({need:.0f} ms)")
            want_ce, result.degraded = False, True
        if want_ce and rr.ce_gate_gap > 0 and (gap := decisive_gap(current.scores[:li_top_k])) >= rr.ce_gate_gap:
            result.skipped["cross_encoder"] = (f"gated: the head is already decisive (its first two {gap:.2f} "
                                               f"standard deviations apart; rerank.ce_gate_gap = {rr.ce_gate_gap})")
            want_ce = False
        if want_ce:
            t = time.perf_counter()
            with child_span(tracer, "hybridrag.cross_encoder", trace, {"top_k": ce_top_k}):
                chunks = current.chunk[:ce_top_k]
                passages = self.ce_passages(index, chunks, query_tokens, rr.ce_window_tokens)
                scores = await self.models.score_pairs(query, passages, direct=direct)
                current = reorder(current, rerank_by_scores(scores, len(current), rr.ce_weight))
            result.stages["cross_encoder"] = current
            result.timings_ms["cross_encoder"] = ms = _ms(t)
            self.latency.record("cross_encoder", ms)
        result.hits = current.top(k)
        result.timings_ms["total"] = _ms(t_total)
        if scope is not None and self.cache is not None and query_vec is not None and not result.degraded:
            keep = result.detached()
            self.cache.put(scope, index.generation, query_vec, query, keep, result.doc_ids(), since=epoch,
                           nbytes=keep.approx_bytes() + filter.nbytes)
        return result

    def ce_passages(self, index: IndexView, chunks: np.ndarray, query_tokens: np.ndarray | None,
                    width: int = 0) -> list[str]:
        """The texts the cross-encoder scores for ``chunks``: each passage (title + chunk), or with ``width`` > 0
        (``ce_window_tokens``) its best window by late interaction's token similarities (:mod:`rerank.windows`).
        Windows need the embedder's own token vectors (their positions are the embedder's word pieces) and the
        index's stored ones; without them the whole passage is scored."""
        passages = [index.passage_with_title(int(c)) for c in chunks.tolist()]
        token_sims = getattr(index.late, "token_sims", None)
        if not width or query_tokens is None or not self.models.embedder_tokens or token_sims is None:
            return passages
        out = []
        for c, passage, enc in zip(chunks.tolist(), passages, self.embedder.model.tokenize(passages), strict=True):
            start, end = best_window(token_sims(query_tokens, int(c)), width)
            content = [i for i, special in enumerate(enc.special_tokens_mask) if not special]
            a, b = char_span(enc.offsets, content, start, end)
            out.append(passage[a:b] if b > a else passage)
        return out

    def fuse(self, bm25: Hits, dense: Hits) -> Hits:
        """RRF of the two document rankings; each fused document keeps the chunk of the list that ranked it higher."""
        f = self.config.fusion
        ids, scores = rrf([bm25.doc, dense.doc], k=f.k, weights=[f.bm25_weight, f.dense_weight])
        chunk_of: dict[int, int] = {}
        rank_of: dict[int, float] = {}
        for hits, w in ((bm25, f.bm25_weight), (dense, f.dense_weight)):
            for rank, (d, c) in enumerate(zip(hits.doc.tolist(), hits.chunk.tolist(), strict=False), start=1):
                contribution = w / (f.k + rank)
                if contribution > rank_of.get(d, -1.0):
                    rank_of[d], chunk_of[d] = contribution, c
        chunks = np.array([chunk_of[d] for d in ids.tolist()], dtype=np.int64)
        return Hits(ids, scores.astype(np.float32), chunks)
