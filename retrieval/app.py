"""The composition root of the service: how a pipeline is built from a configuration (:func:`open_pipeline`: every
command, the server, training and the benchmarks build theirs here, so they all run what the server runs), where
writes go (:func:`open_writes`), and one serving process (:func:`serve`: the pipeline over the index, the writer,
the result cache, the generator, tracing, and the server of :mod:`retrieval.serving.server`), with its
lifecycle: listen at once, load, turn SERVING, serve until SIGTERM/SIGINT, drain. With ``server.processes`` > 1, a
supervisor runs that many of them on one port (SO_REUSEPORT) and restarts one that dies."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
from retrieval.observability.logs import JsonLogFormatter
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


# ------------------------------------------------------------------------------------ several server processes

RESTARTS_PER_MINUTE = 3  # a worker that dies more often than this is not restarted: the supervisor stops


def check_processes(app_config: AppConfig, store_path: Path | None) -> None:
    """Refuse a multi-process layout that cannot work: one document store has one writer (the live index owns
    its buffer and rebuilds), and Qdrant's local mode locks its folder to one process."""
    n = app_config.server.processes
    if n == 1:
        return
    if store_path is not None:
        raise ConfigError(f"server.processes = {n} serves a read-only snapshot (or an engine backend): a document "
                          "store (--store) has one writer, so serve it with processes = 1")
    b = app_config.backend
    if b.kind == "qdrant" and b.location not in ("", ":memory:") and "://" not in b.location:
        raise ConfigError(f"server.processes = {n}: Qdrant's local mode locks {b.location!r} to one process; "
                          "use a Qdrant server (an http(s):// location) or processes = 1")


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound, not listening, SO_REUSEPORT socket on ``host:port`` (0 = a free port): it holds the port number
    while the worker processes listen on it together. The kernel hands connections only to listening sockets."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e}") from None
    return sock


def worker_config(app_config: AppConfig, worker: int, grpc_port: int, http_port: int) -> AppConfig:
    """Worker ``worker``'s configuration: the shared ports with SO_REUSEPORT, one process each, and its own
    metrics port (``metrics.port + worker``; 0 stays any free port, -1 off): Prometheus scrapes each process."""
    server = dataclasses.replace(app_config.server, port=grpc_port, reuse_port=True, processes=1)
    http = dataclasses.replace(app_config.http, port=http_port)
    m = app_config.metrics
    metrics = dataclasses.replace(m, port=m.port + worker if m.port > 0 else m.port)
    models = {}
    per = worker_threads(app_config.server.processes)
    for name in ("embedder", "late_interaction", "cross_encoder"):  # 0 = "all cores" would oversubscribe them
        section = getattr(app_config, name)
        if section.runtime.intra_op_threads == 0:
            models[name] = dataclasses.replace(section, runtime=dataclasses.replace(section.runtime,
                                                                                    intra_op_threads=per))
    return dataclasses.replace(app_config, server=server, http=http, metrics=metrics, **models)


def worker_threads(processes: int) -> int:
    """Each worker's share of the cores: its models' runtimes and faiss's OpenMP threads where the configuration
    leaves them at 0 (all cores), so that N processes do not run N times the cores' threads."""
    return max(1, (os.cpu_count() or 1) // processes)


def _die_with_supervisor(supervisor: int) -> None:
    """SIGTERM to this worker (a graceful drain) when its supervisor dies, however it dies: SIGKILL and the OOM
    killer included. Without it the workers outlived a killed supervisor, unsupervised and still serving on the
    shared port, holding its pipes (a supervisor started again served beside them). ``PR_SET_PDEATHSIG`` follows
    the *thread* that started the worker: the supervisor starts and restarts them on its main thread only. A
    supervisor already gone before this call is caught by the parent check; without prctl (not Linux), a thread
    polls the parent each second."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        import threading

        def watch() -> None:
            while os.getppid() == supervisor:
                time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGTERM)
        threading.Thread(target=watch, name="hybridrag-supervisor-watch", daemon=True).start()
    if os.getppid() != supervisor:
        os.kill(os.getpid(), signal.SIGTERM)


def _worker_main(worker: int, workers: int, index_dir: Path | None, config: AppConfig,
                 api_keys: Mapping[str, frozenset[str]], log_level: int, log_json: bool, supervisor: int) -> None:
    _die_with_supervisor(supervisor)
    root = logging.getLogger()
    root.setLevel(log_level)
    handler = logging.StreamHandler()
    if log_json:
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s worker {worker} %(name)s: %(message)s"))
    root.handlers[:] = [handler]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor turns Ctrl-C into one SIGTERM each
    import faiss

    faiss.omp_set_num_threads(worker_threads(workers))
    asyncio.run(serve(index_dir, config, api_keys))


def serve_processes(index_dir: Path | None, app_config: AppConfig,
                    api_keys: Mapping[str, frozenset[str]] | None = None, store_path: Path | None = None, *,
                    log_json: bool = False) -> int:
    """``server.processes`` server processes over one snapshot (memory-mapped: the pages are shared), all on the
    same gRPC (and HTTP) port with SO_REUSEPORT; the kernel spreads connections over them. This process
    supervises: it restarts a worker that dies (at most RESTARTS_PER_MINUTE a minute), and on SIGTERM/SIGINT
    drains them all; a worker ends (SIGTERM) when its supervisor does, however it ends. Returns the exit code."""
    import multiprocessing

    check_processes(app_config, store_path)
    n = app_config.server.processes
    s, h = app_config.server, app_config.http
    held = [reserve_port(s.host, s.port)]
    grpc_port = held[0].getsockname()[1]
    http_port = h.port
    if h.enabled:
        held.append(reserve_port(h.host, h.port))
        http_port = held[1].getsockname()[1]
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter each: no forked runtime threads
    keys = dict(api_keys or {})
    level = logging.getLogger().getEffectiveLevel()
    stopping = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def start(i: int) -> Any:
        p = ctx.Process(target=_worker_main, name=f"hybridrag-worker-{i}", daemon=False,
                        args=(i, n, index_dir, worker_config(app_config, i, grpc_port, http_port), keys, level,
                              log_json, os.getpid()))
        p.start()
        return p

    workers = [start(i) for i in range(n)]
    log.info("hybridrag supervising %d server processes on %s:%d%s (SO_REUSEPORT; %d threads each where the "
             "configuration says 0; pids %s)", n, s.host, grpc_port, f", HTTP on {h.host}:{http_port}" if h.enabled
             else "", worker_threads(n), ", ".join(str(p.pid) for p in workers))
    deaths: list[float] = []
    code = 0
    try:
        while not stopping:
            time.sleep(0.2)
            for i, p in enumerate(workers):
                if p.is_alive() or stopping:
                    continue
                now = time.monotonic()
                deaths[:] = [t for t in deaths if now - t < 60.0] + [now]
                if len(deaths) > RESTARTS_PER_MINUTE:
                    log.error("worker %d (pid %d) exited with code %s: %d exits in a minute, stopping", i, p.pid,
                              p.exitcode, len(deaths))
                    stopping, code = True, 1
                    break
                log.warning("worker %d (pid %d) exited with code %s: restarting it", i, p.pid, p.exitcode)
                workers[i] = start(i)
    finally:
        log.info("hybridrag stopping %d server processes (grace %.1f s)", n, s.grace_s)
        for p in workers:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + s.grace_s + 30.0
        for p in workers:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.warning("worker pid %d did not stop in time: killed", p.pid)
                p.kill()
                p.join()
        for sock in held:
            sock.close()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return code
