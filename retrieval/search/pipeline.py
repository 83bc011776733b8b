"""The retrieval pipeline over one index generation: it runs the stages in order, and owns what is around them: the
lifecycle of its loop and pools, the entry points, the result cache, deadlines and tracing.

The stages (:mod:`retrieval.search.stages`), each runnable alone: the first stage (BM25 and dense in parallel,
fused with RRF), late interaction (MaxSim over stored token vectors, on the fused top ``li_top_k``), the
cross-encoder (on the top ``ce_top_k``). Each takes the query (:class:`~retrieval.search.stages.query.Query`) and
hits and returns hits; scores are comparable only within the stage that produced them (``SearchResult.stages``
keeps each stage's list).

Where the work runs (:mod:`retrieval.search.runner`): a request that finds no other search running runs solo
(``first_stage.solo_when_idle``): its stages in sequence on one thread kept for solo searches, the models called
directly (:class:`~retrieval.search.runner.ThreadRunner`). Requests arriving meanwhile take the batched path: the
pipeline's own event loop, BM25/faiss/MaxSim in a worker pool, model calls through cross-request micro-batchers
(:class:`~retrieval.search.runner.PoolRunner`), so concurrent requests share ONNX runs. :meth:`Pipeline.search` is
the blocking entry point (CLI, evaluation, worker threads), :meth:`Pipeline.search_async` the one for asyncio
callers (the server's doors).

Result cache (:class:`ResultCache`; in-process :mod:`~retrieval.search.semantic_cache` or Redis-shared
:mod:`~retrieval.search.shared_cache`): an exact repeat answers before anything is embedded; otherwise the query is
embedded first, a cached query of the same scope (filter and options) and generation whose embedding is at or
above the threshold answers at once (``SearchResult.cache_hit``), and a complete (not degraded) result is cached.
A value read from outside the process answers only if it is a result this index could have given this request
(:func:`~retrieval.search.results.check_cached_result`).

Deadlines (:mod:`retrieval.search.deadlines`): a request whose deadline has passed is refused before it starts;
later, the cross-encoder and then late interaction are skipped when the time left is below their recent p95
latency, and the result says so. Tracing: ``hybridrag.search`` under the caller's current span, a child span per
stage.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Hashable, Iterable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import numpy as np
from opentelemetry import context as otel_context
from opentelemetry.trace import Tracer
from threadpoolctl import threadpool_limits

from index_builder.models.encoders import CrossEncoder, Embedder
from index_builder.models.token_encoders import TokenEncoder, make_token_encoder
from index_builder.types import Hits
from retrieval.errors import InvalidRequest
from retrieval.observability.tracing import NO_TRACER
from retrieval.search.deadlines import Deadline, StageLatency, before_cross_encoder, before_late_interaction
from retrieval.search.model_calls import ModelCalls
from retrieval.search.request import FIRST_STAGES, SearchRequest
from retrieval.search.results import SearchResult, check_cached_result
from retrieval.search.runner import PoolRunner, Runner, ThreadRunner
from retrieval.search.semantic_cache import CacheHit
from retrieval.search.settings import SearchSettings
from retrieval.search.stages.cross_encoder import CrossEncoderStage
from retrieval.search.stages.first_stage import FirstStage
from retrieval.search.stages.highlights import HighlightStage
from retrieval.search.stages.late_interaction import LateInteractionStage
from retrieval.search.stages.phrases import apply_phrases, parse_phrases
from retrieval.search.stages.query import Query, ms_since
from retrieval.search.view import IndexView

log = logging.getLogger(__name__)
T = TypeVar("T")


class ResultCache(Protocol):
    """The pipeline's (and the generator's) result cache: :class:`~retrieval.search.semantic_cache.SemanticCache`
    in this process, or :class:`~retrieval.search.shared_cache.SharedCache` through Redis (``shared``: its values
    are read from outside the process, so lookups take a ``check`` of what they read, and every write anywhere
    moves its epoch)."""

    shared: bool

    def epoch(self) -> int: ...

    def lookup_exact(self, scope: Hashable, generation: int, text: str, epoch: int,
                     check: Callable[[Any], None] | None = None) -> CacheHit | None: ...

    def lookup(self, scope: Hashable, generation: int, vector: np.ndarray, text: str, epoch: int | None = None,
               check: Callable[[Any], None] | None = None) -> CacheHit | None: ...

    def put(self, scope: Hashable, generation: int, vector: np.ndarray, text: str, value: Any,
            doc_ids: Iterable[str], since: int | None = None, nbytes: int = 0) -> bool: ...

    def invalidate_docs(self, doc_ids: Iterable[str]) -> int: ...

    def stats(self) -> dict[str, float]: ...

    def clear(self) -> None: ...


class Pipeline:
    """The stages over the index generation it serves (:meth:`publish` swaps it), with its models, pools and
    cache. Built by the composition root (:func:`retrieval.app.open_pipeline`), or in tests."""

    def __init__(self, index: IndexView, embedder: Embedder, config: SearchSettings, *,
                 executor: Executor | None = None, cross_encoder: CrossEncoder | None = None,
                 token_encoder: TokenEncoder | None = None, cache: ResultCache | None = None,
                 tracer: Tracer = NO_TRACER) -> None:
        self.index = index
        self.embedder, self.cross_encoder, self.cache, self.tracer, self.config = (embedder, cross_encoder, cache,
                                                                                   tracer, config)
        self._beside = self._beside_for(index)
        self.token_encoder = token_encoder or make_token_encoder(config.late_interaction, embedder)
        self.models = ModelCalls(embedder, self.token_encoder, cross_encoder, config.batching,
                                 pair_cache=config.rerank.ce_cache_pairs)
        embedder_tokens = self.models.embedder_tokens
        self.first_stage = FirstStage(config.first_stage, config.fusion)
        self.li_stage = LateInteractionStage(config.rerank, self.token_encoder, embedder_tokens=embedder_tokens,
                                             max_length=embedder.config.max_length)
        self.ce_stage = CrossEncoderStage(config.rerank, embedder, embedder_tokens=embedder_tokens)
        self.highlight_stage = HighlightStage(config.rerank, embedder, embedder_tokens=embedder_tokens)
        self.latency = StageLatency(config.rerank.latency_window)
        if config.first_stage.blas_threads > 0:  # process-wide (BLAS has one pool); see FirstStageConfig
            threadpool_limits(limits=config.first_stage.blas_threads, user_api="blas")
        self._own_executor = executor is None
        self.executor = executor or ThreadPoolExecutor(config.first_stage.workers, thread_name_prefix="hybridrag")
        self.pool = PoolRunner(self.executor, self.models)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # Solo searches (first_stage.solo_when_idle): one at a time (the lock), on one thread kept for them, always
        # the same one (handed to whichever model-pool worker was free, the stages ran ~1.4 ms slower).
        self._solo_lock = threading.Lock()
        self._solo_executor = ThreadPoolExecutor(1, thread_name_prefix="hybridrag-solo")
        self._solo_beside = ThreadPoolExecutor(1, thread_name_prefix="hybridrag-solo-beside")  # ThreadRunner
        self._entered = 0  # searches between entry and answer, solo or not (any thread: under _entered_lock)
        self._entered_lock = threading.Lock()
        self.solo_runs = 0

    def publish(self, view: IndexView) -> None:
        """Serve ``view`` from the next request on (an atomic reference swap; requests in flight keep theirs).
        The live index calls this with every new view (``live.on_publish(pipeline.publish)``)."""
        self._beside = self._beside_for(view)  # before the view: a request never sees a view with another's
        self.index = view

    def _beside_for(self, view: IndexView) -> bool:
        """Whether a solo search over ``view`` runs BM25 beside its dense search (``first_stage.parallel`` and
        ``solo_beside_from`` chunks): decided once per published view (a live view builds ``chunk_doc``)."""
        first = self.config.first_stage
        return first.parallel and view.in_process and len(view.chunk_doc) >= first.solo_beside_from

    # ------------------------------------------------------------------ lifecycle

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name="hybridrag-pipeline", daemon=True)
                self._thread.start()
                self._loop = loop
            return self._loop

    def start_threads(self, timeout_s: float = 30.0, on_each: Callable[[], None] | None = None) -> None:
        """Start every worker thread of the pipeline's pools now rather than at first use, running ``on_each`` on
        each of them (a server sets their priority so), and the first requests do not pay for thread creation."""
        pools: list[tuple[Executor, int]] = [(self.models.executor, self.config.batching.model_workers),
                                             (self._solo_executor, 1), (self._solo_beside, 1)]
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

    def close(self) -> None:
        with self._lock:
            loop, thread, self._loop = self._loop, self._thread, None
        if loop is not None and thread is not None:
            asyncio.run_coroutine_threadsafe(self.models.aclose(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
        self.models.shutdown()
        self._solo_executor.shutdown(wait=True)
        self._solo_beside.shutdown(wait=True)
        if self._own_executor:
            self.executor.shutdown(wait=True)

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the pipeline's loop (where the batchers live) from any event loop."""
        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._ensure_loop()))

    # ------------------------------------------------------------------ entry points

    def search(self, query: str | SearchRequest, k: int = 10, **options: Any) -> SearchResult:
        """Blocking search (thread-safe: concurrent callers' model calls are batched together). Takes a
        :class:`SearchRequest`, or a query with the request's fields as keywords."""
        if self._loop is not None and threading.current_thread() is self._thread:
            raise RuntimeError("Pipeline.search blocks: call search_async from the pipeline's own loop")
        request = self._request(query, k, options)
        solo = self._enter()
        try:
            if solo is not None:
                return self._run_solo(request, solo)
            return asyncio.run_coroutine_threadsafe(self._search(request, self.pool), self._ensure_loop()).result()
        finally:
            self._leave()

    async def search_async(self, query: str | SearchRequest, k: int = 10, **options: Any) -> SearchResult:
        """Awaitable search for asyncio callers on any event loop (the same arguments as :meth:`search`)."""
        request = self._request(query, k, options)
        solo = self._enter()
        try:
            if solo is not None:  # contextvars: the caller's span stays the parent
                run = functools.partial(contextvars.copy_context().run, self._run_solo, request, solo)
                try:
                    return await asyncio.get_running_loop().run_in_executor(self._solo_executor, run)
                except asyncio.CancelledError:
                    solo.cancelled.set()  # its model calls stop before their next batch
                    raise
            return await self._on_loop(self._search(request, self.pool))
        finally:
            self._leave()

    def _enter(self) -> ThreadRunner | None:
        """Count a search in (from any thread); a runner of its own when it runs solo: no other search in flight
        (counted from entry, so one waiting for the pipeline's loop counts too), the index in-process, late
        interaction on the embedder's own token vectors (a ColBERT encoder has its own batcher), and no other solo
        search (the lock is taken here, released by :meth:`_run_solo`). Under load a search nearly always finds
        company and takes the batched path: a solo search holds its thread for its whole length and calls the
        models unbatched, which costs throughput once others wait (docs/results/interactive-cascade.md)."""
        with self._entered_lock:
            self._entered += 1
            alone = self._entered == 1
        if (not alone or not self.config.first_stage.solo_when_idle or not self.models.embedder_tokens
                or not self.index.in_process):
            return None
        if not self._solo_lock.acquire(blocking=False):
            return None
        return ThreadRunner(self.models, self._solo_beside if self._beside else None)

    def _leave(self) -> None:
        with self._entered_lock:
            self._entered -= 1

    def _run_solo(self, request: SearchRequest, runner: ThreadRunner) -> SearchResult:
        try:
            self.solo_runs += 1
            return runner.run(self._search(request, runner))
        finally:
            self._solo_lock.release()

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
            raise InvalidRequest(f"unknown rerank stage {stage!r:.80}; allowed: ['cross_encoder', 'late_interaction']")
        if stage == "cross_encoder" and self.cross_encoder is None:
            raise InvalidRequest("no cross-encoder is configured on this server ([cross_encoder] model)")
        return stage

    async def rerank_texts_async(self, query: str, texts: list[str], stage: str = "") -> tuple[str, np.ndarray]:
        """Scores of the caller's ``texts`` for ``query`` by one reranking stage (float32 ``(n,)``, higher =
        better): the cross-encoder's logits, or MaxSim of the token encoder's vectors (the texts are encoded now:
        they are not in the index)."""
        stage = self.rerank_stage(stage)
        runner = PoolRunner(self.models.executor, self.models)  # encoding texts is model work: the model pool

        async def run() -> np.ndarray:
            if stage == "cross_encoder":
                return await runner.score_pairs(query, texts)
            return await self.li_stage.score_texts(runner, query, texts)
        return stage, await self._on_loop(run())

    def _request(self, query: str | SearchRequest, k: int, options: dict[str, Any]) -> SearchRequest:
        if isinstance(query, SearchRequest):
            if options:
                raise TypeError("pass either a SearchRequest or a query with options, not both")
            return self.resolve(query)
        return self.resolve(SearchRequest.of(query, k, **options))

    def batcher_stats(self) -> dict[str, dict[str, Any]]:
        return self.models.stats()

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
        return self.li_stage.unavailable(index)

    # ------------------------------------------------------------------ one search

    async def _search(self, request: SearchRequest, runner: Runner) -> SearchResult:
        with self.tracer.start_as_current_span("hybridrag.search", attributes={"top_k": request.k}) as span:
            result = await self._run_stages(request, runner, otel_context.get_current())
            if span.is_recording():
                span.set_attributes({"index.generation": result.generation, "cache_hit": result.cache_hit,
                                     "degraded": result.degraded, "stages": list(result.stages),
                                     "skipped": [f"{k}: {v}" for k, v in result.skipped.items()]})
            return result

    async def _run_stages(self, request: SearchRequest, runner: Runner, trace: otel_context.Context) -> SearchResult:
        """The stages of a resolved request, in order, between the cache and the deadline checks; returns the top
        ``k`` documents (fused unless one first stage is asked)."""
        assert request.resolved and request.stages is not None
        deadline = Deadline.of(request.deadline, self.config.rerank.budget_ms)
        deadline.check_started()
        t_total = time.perf_counter()
        cache = self.cache if request.use_cache else None
        epoch = cache.epoch() if cache is not None else 0  # before reading the index (see SemanticCache.put)
        q = Query(request, self.index, runner, tracer=self.tracer, trace=trace)  # one generation for the request
        want_li = "late_interaction" in request.stages
        if want_li and (why := self.li_stage.unavailable(q.index)):
            q.skip("late_interaction", why)
            want_li = False
        want_ce = "cross_encoder" in request.stages
        if want_ce and self.cross_encoder is None:
            q.skip("cross_encoder", "no cross-encoder model configured")
            want_ce = False
        scope = None
        if cache is not None and q.query_vec is None and "dense" in request.stages and q.index.dense is not None:
            phrases = tuple(parse_phrases(request.query)) if self.config.first_stage.phrases != "off" else ()
            scope = ("retrieve", request.filter, request.k, request.candidates, request.stages, request.li_top_k,
                     request.ce_top_k, request.exact_dense, phrases)  # a quoted query never answers an unquoted one
            if (hit := await self._cached(q, cache, scope, epoch)) is not None:
                if request.highlights:  # for this query, not the cached one's (never cached themselves)
                    hit.highlights = await self.highlight_stage.run(q, hit)
                hit.timings_ms["total"] = ms_since(t_total)
                return hit
            scope = scope if q.query_vec is not None else None  # the embedding failed: nothing to cache under

        self.first_stage.start(q)  # BM25 beside the query embedding (unless the cache lookup started it already)
        if want_li:
            self.li_stage.start(q)  # a ColBERT query encoding beside the first stage
        current = await self.first_stage.run(q, need_tokens=want_li and self.models.embedder_tokens)
        mode, held = self.config.first_stage.phrases, dict[int, bool]()  # quoted phrases: before and after reranking
        current = await self._rerank(q, apply_phrases(q, current, mode, held), want_li, want_ce, deadline)
        current = apply_phrases(q, current, mode, held)
        result = q.result
        result.hits = current.top(request.k)
        if scope is not None and cache is not None and q.query_vec is not None and not result.degraded:
            keep = result.detached()
            cache.put(scope, q.index.generation, q.query_vec, request.query, keep, result.doc_ids(), since=epoch,
                      nbytes=keep.approx_bytes() + request.filter.nbytes)
        if request.highlights:  # after the cache's copy: highlights belong to this query only
            result.highlights = await self.highlight_stage.run(q, result)
        result.timings_ms["total"] = ms_since(t_total)
        return result

    async def _cached(self, q: Query, cache: ResultCache, scope: Hashable, epoch: int) -> SearchResult | None:
        """The cache-aside lookups: an exact repeat before anything is embedded; else the query is embedded (BM25
        started beside it) and a similar cached query of the same scope may answer. None = a miss."""
        request, index, timings = q.request, q.index, q.result.timings_ms
        check = functools.partial(check_cached_result, index=index, filter=request.filter, k=request.k)
        t = time.perf_counter()
        hit = cache.lookup_exact(scope, index.generation, request.query, epoch, check=check)
        if hit is not None:
            timings["cache"] = ms_since(t)
            return dataclasses.replace(hit.value, timings_ms=timings, cache_hit=True, cache_similarity=1.0)
        self.first_stage.start(q)  # BM25 beside the embedding (wasted on a hit)
        try:
            await q.encode()
        except Exception:  # the first stage degrades to BM25 and says why
            log.exception("query embedding failed before the cache lookup")
            return None
        assert q.query_vec is not None
        with q.span("hybridrag.cache_lookup") as span:
            t = time.perf_counter()
            hit = cache.lookup(scope, index.generation, q.query_vec, request.query, epoch, check=check)
            timings["cache"] = ms_since(t)
            span.set_attribute("hit", hit is not None)
        if hit is None:
            return None
        q.discard_pending()
        return dataclasses.replace(hit.value, timings_ms=timings, query_vec=q.query_vec, cache_hit=True,
                                   cache_similarity=hit.similarity)

    async def _rerank(self, q: Query, current: Hits, want_li: bool, want_ce: bool, deadline: Deadline) -> Hits:
        """Late interaction, then the cross-encoder, each skipped when the time left is below what it recently
        took (the cross-encoder first) or by its own policy (the gate), with the reason in the result."""
        result, li_top_k = q.result, q.request.li_top_k
        assert li_top_k is not None
        if want_li:
            skip_ce, skip_li = before_late_interaction(deadline.left_ms(), self.latency.p95("late_interaction"),
                                                       self.latency.p95("cross_encoder"), want_ce)
            if skip_ce:
                q.skip("cross_encoder", skip_ce, degraded=True)
                want_ce = False
            if skip_li:
                q.skip("late_interaction", skip_li, degraded=True)
                want_li = False
        if want_li:
            current = await self.li_stage.run(q, current)
            if "late_interaction" in result.stages:
                self.latency.record("late_interaction", result.timings_ms["late_interaction"])
        q.discard_pending()  # a ColBERT encoding that late interaction did not use
        if want_ce and (why := before_cross_encoder(deadline.left_ms(), self.latency.p95("cross_encoder"))):
            q.skip("cross_encoder", why, degraded=True)
            want_ce = False
        if want_ce and (why := self.ce_stage.gated(current, li_top_k)):
            q.skip("cross_encoder", why)
            want_ce = False
        if want_ce:
            current = await self.ce_stage.run(q, current)
            self.latency.record("cross_encoder", result.timings_ms["cross_encoder"])
        return current
