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

from index_builder.errors import HybridRagError
from retrieval.config import AppConfig
from retrieval.generation.generator import open_generator
from retrieval.live.live_index import LiveIndex
from retrieval.live.store import DocumentStore
from retrieval.observability.tracing import Tracing, make_tracing
from retrieval.search.index import SearchIndex
from retrieval.search.pipeline import Pipeline
from retrieval.serving.grpc_service import create_server

log = logging.getLogger(__name__)


async def serve(index_dir: Path, app_config: AppConfig, api_keys: Mapping[str, frozenset[str]] | None = None,
                store_path: Path | None = None) -> None:
    """Listen at once (health NOT_SERVING), load the index and models, turn SERVING, serve until SIGTERM/SIGINT,
    then drain gracefully."""
    config = app_config.server
    if config.switch_interval_ms > 0:  # process-wide, so set here at the edge (see ServerConfig)
        sys.setswitchinterval(config.switch_interval_ms / 1000.0)
    tracing: Tracing = make_tracing(app_config.tracing)
    running = await create_server(config, api_keys=api_keys, metrics=app_config.metrics, tracer=tracing.tracer)
    log.info("hybridrag listening on %s:%d (loading the index); metrics on %s", config.host, running.port,
             f"{app_config.metrics.host}:{running.metrics_port}/metrics" if running.metrics_port else "no HTTP port")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    pipeline = None
    live = None
    try:
        pipeline = await loop.run_in_executor(None, Pipeline.open, index_dir, app_config, tracing.tracer)
        if store_path is not None:
            store = DocumentStore(store_path)
            base = pipeline.index
            assert isinstance(base, SearchIndex)  # Pipeline.open serves a snapshot; the live index goes over it
            live = await loop.run_in_executor(None, LiveIndex, base, store, pipeline.embedder, pipeline.token_encoder,
                                              app_config)
            live.on_publish(pipeline.publish)
            if pipeline.cache is not None:
                live.on_write(pipeline.cache.invalidate_docs)
            live.start_auto_rebuild()
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
        log.info("hybridrag serving %s (generation %d) on port %d", index_dir, pipeline.index.generation, running.port)
        await stop.wait()
    finally:
        log.info("hybridrag stopping: draining in-flight calls (grace %.1f s)", config.grace_s)
        await running.stop(config.grace_s)
        if running.state.generation is not None:
            await running.state.generation.aclose()
        if live is not None:
            live.close()
        if pipeline is not None:
            pipeline.close()
        tracing.shutdown()  # flushes the spans still batched for the exporter
