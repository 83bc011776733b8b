"""Opening a serving process: the composition of one ``hybridrag serve`` (the pipeline over the index, the live
index over the document store, the semantic cache, the generator, tracing and metrics), and its lifecycle:
listen at once, load, turn SERVING, serve until SIGTERM/SIGINT, drain."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opentelemetry.trace import Tracer

from index_builder.build import expected_settings
from index_builder.errors import ConfigError, HybridRagError
from index_builder.models import Embedder
from retrieval.config import AppConfig
from retrieval.generation.generator import open_generator
from retrieval.live.live_index import LiveIndex
from retrieval.live.store import DocumentStore
from retrieval.observability.tracing import NO_TRACER, Tracing, make_tracing
from retrieval.search.index import SearchIndex
from retrieval.search.pipeline import Pipeline
from retrieval.search.semantic_cache import SemanticCache
from retrieval.serving.grpc_service import create_server
from retrieval.serving.priority import nice_self, run_niced

log = logging.getLogger(__name__)


def open_index(index_dir: Path | None, config: AppConfig, embedder: Embedder):
    """The first stage the configuration names (``[backend]``): the snapshot under ``index_dir``, or the Qdrant
    collection (with ``location = ":memory:"`` the snapshot under ``index_dir`` is migrated into it first)."""
    b = config.backend
    if b.kind == "local":
        if index_dir is None:
            raise ConfigError("the local backend serves a snapshot: give --index DIR (or set [backend] kind = "
                              "\"qdrant\")")
        return SearchIndex.load(index_dir, config, embedder)
    from retrieval.engines.qdrant import QdrantEngine, QdrantView

    engine = QdrantEngine(b)
    if not engine.exists() and b.location == ":memory:" and index_dir is not None:
        snap = SearchIndex.load(index_dir, config, embedder).snapshot  # verified against the configuration
        info = engine.migrate(snap)
        log.info("migrated %s into the in-process Qdrant engine: %s", index_dir, info)
    return QdrantView.open(engine, expected_settings(config.build_config(), embedder))


def open_cache(config: AppConfig):
    """The configured result cache: shared through Redis (``cache.redis_url``), in-process, or none."""
    if not config.cache.enabled:
        return None
    if config.cache.redis_url:
        from retrieval.search.shared_cache import SharedCache

        return SharedCache(config.cache)
    return SemanticCache(config.cache)


def open_pipeline(index_dir: Path | None, config: AppConfig, tracer: Tracer = NO_TRACER) -> Pipeline:
    """Models, the first stage of the configured backend and the cache: what every command and the server
    search with."""
    embedder = Embedder(config.embedder)
    return Pipeline.over(open_index(index_dir, config, embedder), embedder, config, tracer, cache=open_cache(config))


def open_writes(pipeline: Pipeline, config: AppConfig, store_path: Path | None):
    """Where writes go: the engine (engine backend), or the live index over the document store (``--store``);
    None = this server is read-only."""
    cache: Any = pipeline.cache
    if config.backend.kind != "local":
        if store_path is not None:
            raise ConfigError("--store is for the local backend: on an engine backend writes go to the engine")
        from retrieval.engines.qdrant import EngineWriter, QdrantView

        shared = getattr(cache, "shared", False)
        view = pipeline.index
        assert isinstance(view, QdrantView)
        writer = EngineWriter(view, pipeline.embedder, pipeline.token_encoder, config.chunking,
                              version=cache.bump if shared else None)
        if cache is not None and not shared:
            writer.on_write(cache.invalidate_docs)
        return writer
    if store_path is None:
        return None
    base = pipeline.index
    assert isinstance(base, SearchIndex)  # the local backend serves a snapshot; the live index goes over it
    live = LiveIndex(base, DocumentStore(store_path), pipeline.embedder, pipeline.token_encoder, config)
    live.on_publish(pipeline.publish)
    if cache is not None:
        live.on_write(cache.invalidate_docs)
    live.start_auto_rebuild()
    return live


async def serve(index_dir: Path | None, app_config: AppConfig, api_keys: Mapping[str, frozenset[str]] | None = None,
                store_path: Path | None = None) -> None:
    """Listen at once (health NOT_SERVING), load the index and models, turn SERVING, serve until SIGTERM/SIGINT,
    then drain gracefully."""
    config = app_config.server
    if config.switch_interval_ms > 0:  # process-wide, so set here at the edge (see ServerConfig)
        sys.setswitchinterval(config.switch_interval_ms / 1000.0)
    tracing: Tracing = make_tracing(app_config.tracing)
    running = await create_server(config, api_keys=api_keys, metrics=app_config.metrics, tracer=tracing.tracer,
                                  http=app_config.http)
    log.info("hybridrag listening on %s:%d (loading the index); metrics on %s", config.host, running.port,
             f"{app_config.metrics.host}:{running.metrics_port}/metrics" if running.metrics_port else "no HTTP port")
    if running.http is not None:
        log.info("hybridrag HTTP on %s (REST, SSE, OpenAI-compatible; playground at /playground)", running.http.url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    pipeline = None
    live = None
    try:
        # The models load on a thread at compute_nice, so the threads their runtimes create inherit it; the pools'
        # workers then lower their own priority. The loop and gRPC's threads keep theirs (retrieval/serving/priority.py).
        nice = config.compute_nice
        pipeline = await loop.run_in_executor(None, run_niced, nice, open_pipeline, index_dir, app_config,
                                              tracing.tracer)
        if nice:
            await loop.run_in_executor(None, pipeline.start_threads, 30.0, lambda: nice_self(nice))
            log.info("compute threads at nice %d (the event loop first)", nice)
        if config.pipeline_on_server_loop:
            pipeline.bind_loop()  # one loop for the doors and the pipeline: no hand-off between them
        live = await loop.run_in_executor(None, open_writes, pipeline, app_config, store_path)
        try:
            setup = await loop.run_in_executor(None, open_generator, pipeline, app_config.generation, pipeline.cache)
            running.state.generation = setup
            if setup.starter is not None:
                setup.starter.kick()  # the embedded llama.cpp server starts meanwhile; Retrieve does not wait for it
            log.info("generation backends: %s", setup.describe())
        except HybridRagError as e:  # Retrieve serves without it; Generate answers UNAVAILABLE with the reason
            running.state.generation_error = f"generation is unavailable: {e}"
            log.warning("%s", running.state.generation_error)
        running.state.attach(pipeline, live)
        await running.set_serving(True)
        log.info("hybridrag serving %s (%s, generation %d) on port %d", index_dir or "", app_config.backend.describe(),
                 pipeline.index.generation, running.port)
        await stop.wait()
    finally:
        log.info("hybridrag stopping: draining in-flight calls (grace %.1f s)", config.grace_s)
        await running.stop(config.grace_s)
        if running.state.generation is not None:
            await running.state.generation.aclose()
        if live is not None:
            live.close()
        if pipeline is not None:
            await pipeline.aclose()
        tracing.shutdown()  # flushes the spans still batched for the exporter
