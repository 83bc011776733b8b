"""The composition root of the service: how a pipeline is built from a configuration (:func:`open_pipeline`: every
command, the server, training and the benchmarks build theirs here, so they all run what the server runs), where
writes go (:func:`open_writes`), and one serving process (:func:`serve`: the pipeline over the index, the writer,
the result cache, the generator, tracing, and the server of :mod:`retrieval.serving.server`), with its
lifecycle: listen at once, load, turn SERVING, serve until SIGTERM/SIGINT, drain. With ``server.processes`` > 1,
the supervisor of :mod:`retrieval.processes` runs that many of them on one port."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from opentelemetry.trace import Tracer

from index_builder.errors import ConfigError, HybridRagError
from index_builder.models.encoders import CrossEncoder, Embedder
from index_builder.snapshot.manifest import expected_settings
from retrieval.config import AppConfig
from retrieval.engines.qdrant.engine import QdrantEngine
from retrieval.engines.qdrant.view import QdrantView
from retrieval.engines.qdrant.writer import EngineWriter
from retrieval.generation.generator import GeneratorSetup, open_generator
from retrieval.live.live_index import LiveIndex
from retrieval.live.store import DocumentStore
from retrieval.observability.tracing import NO_TRACER, Tracing, make_tracing
from retrieval.search.index import SearchIndex
from retrieval.search.pipeline import Pipeline
from retrieval.search.semantic_cache import SemanticCache
from retrieval.search.shared_cache import SharedCache
from retrieval.search.view import IndexView
from retrieval.serving.priority import nice_self, run_niced
from retrieval.serving.server import RunningServer, start_server

log = logging.getLogger(__name__)


def open_index(index_dir: Path | None, config: AppConfig, embedder: Embedder) -> IndexView:
    """The first stage the configuration names (``[backend]``): the snapshot under ``index_dir``, or the Qdrant
    collection (with ``location = ":memory:"`` the snapshot under ``index_dir`` is migrated into it first)."""
    b = config.backend
    if b.kind == "local":
        if index_dir is None:
            raise ConfigError("the local backend serves a snapshot: give --index DIR (or set [backend] kind = "
                              "\"qdrant\")")
        return SearchIndex.load(index_dir, config, embedder)
    engine = QdrantEngine(b)
    if not engine.exists() and b.location == ":memory:" and index_dir is not None:
        snap = SearchIndex.load(index_dir, config, embedder).snapshot  # verified against the configuration
        info = engine.migrate(snap)
        log.info("migrated %s into the in-process Qdrant engine: %s", index_dir, info)
    # an engine view's chunk_doc and documents are read by length and number only, not the arrays and sequences
    # IndexView declares (retrieval/search/view.py)
    return QdrantView.open(engine, expected_settings(config.build_config(), embedder))  # type: ignore[return-value]


def open_cache(config: AppConfig) -> SemanticCache | SharedCache | None:
    """The configured result cache: shared through Redis (``cache.redis_url``), in-process, or none."""
    if not config.cache.enabled:
        return None
    if config.cache.redis_url:
        return SharedCache(config.cache)
    return SemanticCache(config.cache)


def open_pipeline(index_dir: Path | None, config: AppConfig, tracer: Tracer = NO_TRACER) -> Pipeline:
    """The pipeline every command, the server, training and the benchmarks search with: the models (the embedder,
    the cross-encoder when ``[cross_encoder] model`` is set; the token encoder ``[late_interaction]`` names), the
    first stage of the configured backend (``[backend]``) and the result cache (``[cache]``, shared through Redis
    with ``cache.redis_url``). Close it with :meth:`Pipeline.close`."""
    embedder = Embedder(config.embedder)
    cross_encoder = CrossEncoder(config.cross_encoder) if config.cross_encoder.model else None
    return Pipeline(open_index(index_dir, config, embedder), embedder, config, cross_encoder=cross_encoder,
                    cache=open_cache(config), tracer=tracer)


def open_writes(pipeline: Pipeline, config: AppConfig, store_path: Path | None) -> LiveIndex | EngineWriter | None:
    """Where writes go: the engine (engine backend), or the live index over the document store (``--store``);
    None = this server is read-only. The writer invalidates the result cache at each write: the in-process cache
    per document, the shared one by moving the write version every replica keys its entries with."""
    cache = pipeline.cache
    if config.backend.kind != "local":
        if store_path is not None:
            raise ConfigError("--store is for the local backend: on an engine backend writes go to the engine")
        view = pipeline.index
        assert isinstance(view, QdrantView)
        shared = cache if isinstance(cache, SharedCache) else None
        writer = EngineWriter(view, pipeline.embedder, pipeline.token_encoder, config.chunking,
                              version=shared.bump if shared is not None else None)
        if cache is not None and shared is None:
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
    then drain gracefully. A worker beside others on one port (``server.reuse_port``) listens only once loaded:
    the kernel hands connections to every listening process, so a loading one would refuse its share."""
    config = app_config.server
    if config.switch_interval_ms > 0:  # process-wide, so set here at the edge (see ServerConfig)
        sys.setswitchinterval(config.switch_interval_ms / 1000.0)
    tracing: Tracing = make_tracing(app_config.tracing)

    async def listen(pipeline: Pipeline | None = None, writer: LiveIndex | EngineWriter | None = None,
                     setup: GeneratorSetup | None = None) -> RunningServer:
        running = await start_server(config, pipeline, writer=writer, api_keys=api_keys, generation=setup,
                                     metrics=app_config.metrics, tracer=tracing.tracer, http=app_config.http)
        log.info("hybridrag listening on %s:%d%s; metrics on %s", config.host, running.port,
                 "" if config.reuse_port else " (loading the index)",
                 f"{app_config.metrics.host}:{running.metrics_port}/metrics" if running.metrics_port else "no HTTP port")
        if running.http is not None:
            log.info("hybridrag HTTP on %s (REST, SSE, OpenAI-compatible; playground at /playground)", running.http.url)
        return running

    running = None if config.reuse_port else await listen()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    pipeline = None
    writer: LiveIndex | EngineWriter | None = None
    setup: GeneratorSetup | None = None
    try:
        # The models load on a thread at compute_nice, so the threads their runtimes create inherit it; the pools'
        # workers then lower their own priority. The loop and gRPC's threads keep theirs (retrieval/serving/priority.py).
        nice = config.compute_nice
        pipeline = await loop.run_in_executor(None, run_niced, nice, open_pipeline, index_dir, app_config,
                                              tracing.tracer)
        if nice:
            await loop.run_in_executor(None, pipeline.start_threads, 30.0, lambda: nice_self(nice))
            log.info("compute threads at nice %d (the event loop first)", nice)
        writer = await loop.run_in_executor(None, open_writes, pipeline, app_config, store_path)
        generation_error = ""
        try:
            setup = await loop.run_in_executor(None, open_generator, pipeline, app_config.generation, pipeline.cache)
        except HybridRagError as e:  # Retrieve serves without it; Generate answers UNAVAILABLE with the reason
            generation_error = f"generation is unavailable: {e}"
            log.warning("%s", generation_error)
        if running is None:
            # A worker beside others listens only now, with the pipeline, the writer and the generator attached
            # before its first accept: the kernel hands it connections the moment it listens, and a call taken
            # before they were attached was refused ("the index is not loaded yet"), over both doors, each time
            # a killed worker was restarted under load (tests/retrieval/serving/test_processes.py).
            running = await listen(pipeline, writer, setup)
        else:
            running.state.generation = setup
            running.attach(pipeline, writer)
        if isinstance(writer, LiveIndex):  # the engine indexes online: it has no rebuilds to count
            writer.on_rebuild(running.state.metrics.observe_rebuild)
        if generation_error:
            running.state.generation_error = generation_error
        if setup is not None:
            if setup.starter is not None:
                setup.starter.kick()  # the embedded llama.cpp server starts meanwhile; Retrieve does not wait for it
            log.info("generation backends: %s", setup.describe())
        await running.set_serving(True)
        log.info("hybridrag serving %s (%s, generation %d) on port %d", index_dir or "", app_config.backend.describe(),
                 pipeline.index.generation, running.port)
        await stop.wait()
    finally:
        log.info("hybridrag stopping: draining in-flight calls (grace %.1f s)", config.grace_s)
        if running is not None:
            await running.stop(config.grace_s)
        if setup is not None:
            await setup.aclose()
        if isinstance(writer, LiveIndex):
            writer.close()  # its background rebuild thread
        if pipeline is not None:
            await loop.run_in_executor(None, pipeline.close)
        tracing.shutdown()  # flushes the spans still batched for the exporter
