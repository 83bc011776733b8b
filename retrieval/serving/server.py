"""One server: the service state and the core, and the doors over it, started and stopped together.

The core (:class:`~retrieval.serving.core.ServiceCore` over a :class:`~retrieval.serving.core.ServiceState`: the
pipeline, the writer, the generator, the API keys, the admission counters and the metrics) is made here, once;
the doors are siblings over it, neither knowing the other: gRPC (:func:`retrieval.serving.grpc_service.start_grpc`),
HTTP when ``[http] port`` is set (:func:`retrieval.serving.http.app.start_http`, on the same event loop), and the
Prometheus port (``[metrics]``). So a process has one set of in-flight counters, caches, batchers and metrics
whichever door a call used, and :meth:`RunningServer.stop` drains both doors together.

:func:`start_server` starts one without blocking (``retrieval.app.serve`` runs it until SIGTERM; tests run one on
port 0); :class:`BackgroundServer` runs one on its own event-loop thread for blocking callers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry.trace import Tracer

from index_builder.errors import ConfigError
from retrieval.generation.generator import GeneratorSetup
from retrieval.observability.tracing import NO_TRACER
from retrieval.search.pipeline import Pipeline
from retrieval.serving.auth import load_api_keys
from retrieval.serving.core import ServiceCore, ServiceState, Writer
from retrieval.serving.grpc_service import RunningGrpc, start_grpc
from retrieval.serving.http.app import RunningHttp, start_http
from retrieval.serving.settings import HttpConfig, MetricsConfig, ServerConfig


@dataclass
class RunningServer:
    """A started server: the state and core, the gRPC door, the HTTP door (None when ``[http]`` is off)."""

    state: ServiceState
    core: ServiceCore
    grpc: RunningGrpc
    http: RunningHttp | None = None

    @property
    def port(self) -> int:
        """The gRPC door's port."""
        return self.grpc.port

    @property
    def http_port(self) -> int | None:
        return self.http.port if self.http is not None else None

    @property
    def metrics_port(self) -> int | None:
        """The port of ``/metrics`` (None when the HTTP endpoint is off)."""
        return self.state.metrics.port

    def attach(self, pipeline: Pipeline, writer: Writer | None = None) -> None:
        """Serve ``pipeline`` (its model batches in the metrics) and accept writes through ``writer``."""
        self.state.metrics.watch_batchers(pipeline)
        self.state.writer = writer
        self.state.pipeline = pipeline

    async def set_serving(self, serving: bool) -> None:
        """gRPC health and the HTTP door's ``/readyz``."""
        self.state.serving = serving
        await self.grpc.set_serving(serving)

    async def stop(self, grace_s: float) -> None:
        """Health NOT_SERVING, both doors refuse new calls and let in-flight ones finish within ``grace_s``; then
        ``/metrics`` closes."""
        await self.set_serving(False)
        if self.http is not None:
            await asyncio.gather(self.grpc.stop(grace_s), self.http.stop(grace_s))
        else:
            await self.grpc.stop(grace_s)
        self.state.metrics.close()


async def start_server(config: ServerConfig, pipeline: Pipeline | None = None, *, writer: Writer | None = None,
                       api_keys: Mapping[str, frozenset[str]] | None = None, generation: GeneratorSetup | None = None,
                       metrics: MetricsConfig | None = None, tracer: Tracer = NO_TRACER,
                       http: HttpConfig | None = None) -> RunningServer:
    """Build the state and the core, then start the gRPC door (port 0 picks a free one), the HTTP door (when
    ``http`` is given and its port is not -1) and the metrics port (``metrics``; None: metrics are kept, not
    served). Health is NOT_SERVING until :meth:`RunningServer.set_serving`. ``pipeline`` and ``writer`` given here
    are attached before the first call can be accepted: a worker beside others on one port is handed connections
    the moment it listens. ``api_keys`` None: read ``config.api_keys_file``. ``tracer``: the server spans' (the
    pipeline has its own, normally the same)."""
    state = ServiceState(api_keys=dict(api_keys or load_api_keys(config.api_keys_file)), generation=generation,
                         tracer=tracer)
    core = ServiceCore(state, config.max_in_flight, config.max_writes_in_flight, config.max_message_mb * 2**20)
    running = RunningServer(state, core, await start_grpc(core, config))
    if pipeline is not None:
        running.attach(pipeline, writer)
    try:
        if http is not None and http.enabled:
            running.http = await start_http(core, http, reuse_port=config.reuse_port)
        if metrics is not None:
            try:
                state.metrics.start_http(metrics)
            except OSError as e:
                raise ConfigError(f"cannot serve metrics on {metrics.host}:{metrics.port}: {e}") from e
    except BaseException:
        await running.stop(0)
        raise
    return running


class BackgroundServer:
    """A started server on its own event-loop thread, for blocking callers (tests, benchmarks, a service embedded
    in a synchronous program), SERVING at once. ``target`` is its ``host:port``; ``http_url`` the HTTP door's base
    URL ("" = off)."""

    def __init__(self, pipeline: Pipeline | None, config: ServerConfig,
                 api_keys: Mapping[str, frozenset[str]] | None = None, generation: GeneratorSetup | None = None, *,
                 writer: Writer | None = None, metrics: MetricsConfig | None = None, tracer: Tracer = NO_TRACER,
                 http: HttpConfig | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="hybridrag-server", daemon=True)
        self.thread.start()
        self.running: RunningServer = self.run(start_server(config, pipeline, writer=writer, api_keys=api_keys,
                                                            generation=generation, metrics=metrics, tracer=tracer,
                                                            http=http))
        self.run(self.running.set_serving(True))
        self.target = f"{config.host}:{self.running.port}"
        self.http_url = self.running.http.url if self.running.http is not None else ""

    def run(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)

    def stop(self, grace: float = 5.0) -> None:
        self.run(self.running.stop(grace))
        if self.running.state.generation is not None:
            self.run(self.running.state.generation.generator.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
