"""The gRPC service: ``hybridrag.v1.Retriever`` on ``grpc.aio``, with health, reflection, admission control,
deadlines, API keys and TLS.

The handlers are thin: each reads the caller (API key, deadline) off the gRPC context and calls the transport-neutral
core (:mod:`retrieval.serving.core`: checks, admission, the pipeline, the span and the metrics), which the HTTP door
(:mod:`retrieval.serving.http`) calls too. Errors are mapped to status codes in one place (:func:`status_for`).
``create_server`` builds a started server without blocking (tests run one on port 0) and, with ``http``, the HTTP
door on the same event loop and core; ``serve`` loads everything, serves until SIGTERM/SIGINT, then drains.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.trace import Tracer

from index_builder.errors import ConfigError
from retrieval.api import retriever_pb2 as pb
from retrieval.api import retriever_pb2_grpc as pb_grpc
from retrieval.errors import InvalidRequest
from retrieval.generation.generator import GeneratorSetup
from retrieval.live.live_index import LiveIndex
from retrieval.observability.tracing import NO_TRACER
from retrieval.search.pipeline import Pipeline
from retrieval.serving.auth import ALL_TENANTS, API_KEY_HEADER, load_api_keys, parse_api_keys  # noqa: F401
from retrieval.serving.core import (  # noqa: F401  (re-exported: the service's names before the core existed)
    SERVICE,
    Caller,
    ServiceCore,
    ServiceState,
    caller_message,
    status_for,
    to_response,
)
from retrieval.serving.http import HttpConfig, RunningHttp, start_http
from retrieval.serving.metrics import MetricsConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerConfig:
    """``max_in_flight``: requests served at once; more are refused with RESOURCE_EXHAUSTED (no queue).
    ``api_keys_file``: JSON ``{"key": ["tenant", ...]}`` (``"*"`` = every tenant); empty = no authentication.
    Keys live outside the repository (a file path from config or ``HYBRIDRAG_SERVER__API_KEYS_FILE``)."""

    host: str = "127.0.0.1"
    port: int = 50051
    max_in_flight: int = 64
    # Writes (Upsert, Delete, Rebuild) have their own budget: each write encodes its documents (model CPU), so
    # a flood of them would otherwise take the cores from queries; past it writes get RESOURCE_EXHAUSTED.
    max_writes_in_flight: int = 2
    grace_s: float = 10.0
    tls_cert: str = ""
    tls_key: str = ""
    api_keys_file: str = ""
    max_message_mb: int = 16
    # How often a thread holding the GIL hands it over (sys.setswitchinterval, process-wide; 0 = Python's 5 ms).
    # The gRPC event loop is I/O work competing for the GIL with the pipeline's compute threads; at 5 ms each of
    # its callbacks can wait 5 ms per busy thread, so past saturation calls queue before admission control sees
    # them. 0.5 ms kept refusals fast and admitted latency bounded (bench.load open loop, README: Results).
    switch_interval_ms: float = 0.5
    # true: the pipeline's stages and batchers run on the server's own event loop (Pipeline.bind_loop), with no
    # cross-thread hand-off from the door. Measured, it did not pay: equal at one caller, -10% QPS at 16 callers
    # in two SciFact runs (a second loop thread lets the pipeline's Python overlap the door's), so it is off.
    pipeline_on_server_loop: bool = False
    # The nice value of the compute threads (models, BM25/faiss pools; retrieval/serving/priority.py): past
    # saturation the event loop, which admits and refuses calls, gets the cores first. 0 = off.
    compute_nice: int = 10
    # Server processes over one memory-mapped snapshot, all listening on the same port (SO_REUSEPORT: the kernel
    # spreads connections over them). 1 = one process, as before. More serve a read-only snapshot or an engine
    # backend; a document store (--store) has one writer, so it needs one process.
    processes: int = 1
    # Set by the supervisor in each of its processes: listen with SO_REUSEPORT beside the others on this port.
    reuse_port: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535 or self.max_in_flight < 1 or self.max_writes_in_flight < 1 or self.grace_s < 0:
            raise ValueError("server needs 0 <= port <= 65535, max_in_flight >= 1, max_writes_in_flight >= 1 and "
                             "grace_s >= 0")
        if not 1 <= self.processes <= 64:
            raise ValueError(f"server.processes must be in [1, 64], got {self.processes}")
        if not 0 <= self.compute_nice <= 19:
            raise ValueError(f"server.compute_nice must be in [0, 19] (0 = off), got {self.compute_nice}")
        if not 0 <= self.switch_interval_ms <= 100:
            raise ValueError(f"server.switch_interval_ms must be in [0, 100], got {self.switch_interval_ms}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("server.tls_cert and server.tls_key go together")


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line (time, level, logger, message, request_id and timings when the record has them)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
               "message": record.getMessage()}
        for key in ("request_id", "timings_ms"):
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


class Undecodable:
    """Stands in for a request whose bytes do not parse (the handler answers INVALID_ARGUMENT with one short log
    line; grpc's own path logs a traceback and answers UNKNOWN)."""

    def __init__(self, message_type: str, size: int, error: Exception) -> None:
        self.message_type, self.size, self.error = message_type, size, error


def _lenient(message_cls):
    def deserialize(data: bytes):
        try:
            return message_cls.FromString(data)
        except Exception as e:  # noqa: BLE001  (DecodeError, invalid UTF-8 in a string field, ...)
            return Undecodable(message_cls.DESCRIPTOR.name, len(data), e)
    return deserialize


def add_service(servicer: RetrieverService, server: grpc.aio.Server) -> None:
    """Register the Retriever methods with deserializers that never raise (see :class:`Undecodable`); otherwise
    what ``retriever_pb2_grpc.add_RetrieverServicer_to_server`` does."""
    handlers = {}
    for name, method in pb.DESCRIPTOR.services_by_name["Retriever"].methods_by_name.items():
        request_cls = getattr(pb, method.input_type.name)
        response_cls = getattr(pb, method.output_type.name)
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[name] = make(getattr(servicer, name), request_deserializer=_lenient(request_cls),
                              response_serializer=response_cls.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


def _decoded(request, request_id: str):
    if isinstance(request, Undecodable):
        log.info("request %s: undecodable %s (%d bytes): %s", request_id, request.message_type, request.size,
                 str(request.error)[:120], extra={"request_id": request_id})
        raise InvalidRequest(f"the request is not a valid {request.message_type} message ({request.size} bytes)")
    return request


class RetrieverService(pb_grpc.RetrieverServicer):
    """Thin handlers: each reads the caller off the gRPC context (its key, its deadline), calls the core
    (:class:`ServiceCore`, shared with the HTTP door), and maps errors to status codes in one place
    (:meth:`_fail`, :func:`status_for`)."""

    def __init__(self, state: ServiceState, config: ServerConfig) -> None:
        self.state = state
        self.config = config
        self.core = ServiceCore(state, config.max_in_flight, config.max_writes_in_flight)

    @staticmethod
    def _caller(context: grpc.aio.ServicerContext) -> Caller:
        return Caller.of(dict(context.invocation_metadata() or ()), context.time_remaining(), "grpc")

    async def _fail(self, context: grpc.aio.ServicerContext, exc: BaseException, request_id: str) -> None:
        code = status_for(exc)
        if code == grpc.StatusCode.INTERNAL:
            log.error("request %s failed", request_id, exc_info=exc, extra={"request_id": request_id})
            await context.abort(code, f"internal error (request id {request_id})")
        await context.abort(code, caller_message(str(exc)))

    async def _unary(self, method: str, request, context: grpc.aio.ServicerContext, body):
        """One wrapper for every unary handler: request id, decoding check, span and metrics, cancellation log,
        and the one error-to-status mapping. ``body(caller, request, request_id)`` calls the core."""
        request_id = uuid.uuid4().hex[:16]
        context.set_trailing_metadata((("x-request-id", request_id),))
        t0 = time.perf_counter()
        try:
            with self.core.call(method, request_id):
                return await body(self._caller(context), _decoded(request, request_id), request_id)
        except asyncio.CancelledError:
            log.info("%s %s cancelled by the client after %.1f ms", method, request_id,
                     (time.perf_counter() - t0) * 1000, extra={"request_id": request_id})
            raise
        except Exception as e:  # noqa: BLE001  (mapped to a status code in one place)
            await self._fail(context, e, request_id)
            raise  # unreachable: abort raises

    # ------------------------------------------------------------------ RPCs

    async def Retrieve(self, request: pb.RetrieveRequest, context: grpc.aio.ServicerContext) -> pb.RetrieveResponse:
        return await self._unary("Retrieve", request, context, self.core.retrieve)

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        """Stream: the passages, the answer's tokens, the stats. A failure after the passages ends the stream with
        the error's status; what was sent stays valid. Cancellation closes the backend stream at once."""
        request_id = uuid.uuid4().hex[:16]
        context.set_trailing_metadata((("x-request-id", request_id),))
        t0 = time.perf_counter()
        try:
            with self.core.call("Generate", request_id) as span:
                events = self.core.generate(self._caller(context), _decoded(request, request_id), request_id, span)
                try:
                    async for message in events:
                        yield message
                finally:
                    await events.aclose()
        except asyncio.CancelledError:
            log.info("generate %s cancelled by the client after %.1f ms", request_id, (time.perf_counter() - t0) * 1000,
                     extra={"request_id": request_id})
            raise
        except Exception as e:  # noqa: BLE001
            await self._fail(context, e, request_id)

    async def GetIndexStatus(self, request: pb.GetIndexStatusRequest, context: grpc.aio.ServicerContext) -> pb.IndexStatus:
        async def body(caller: Caller, request: pb.GetIndexStatusRequest, request_id: str) -> pb.IndexStatus:
            return self.core.status(caller)
        return await self._unary("GetIndexStatus", request, context, body)

    async def Upsert(self, request: pb.UpsertRequest, context: grpc.aio.ServicerContext) -> pb.UpsertResponse:
        return await self._unary("Upsert", request, context, self.core.upsert)

    async def Rebuild(self, request: pb.RebuildRequest, context: grpc.aio.ServicerContext) -> pb.RebuildResponse:
        async def body(caller: Caller, request: pb.RebuildRequest, request_id: str) -> pb.RebuildResponse:
            return await self.core.rebuild(caller)
        return await self._unary("Rebuild", request, context, body)

    async def Delete(self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext) -> pb.DeleteResponse:
        async def body(caller: Caller, request: pb.DeleteRequest, request_id: str) -> pb.DeleteResponse:
            return await self.core.delete(caller, request)
        return await self._unary("Delete", request, context, body)


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    state: ServiceState
    http: RunningHttp | None = None  # the HTTP door, when [http] port is set

    @property
    def http_port(self) -> int | None:
        return self.http.port if self.http is not None else None

    async def set_serving(self, serving: bool) -> None:
        """gRPC health and the HTTP door's ``/readyz``."""
        self.state.serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE):
            await self.health.set(name, status)

    @property
    def metrics_port(self) -> int | None:
        """The port of ``/metrics`` (None when the HTTP endpoint is off)."""
        return self.state.metrics.port

    async def stop(self, grace_s: float) -> None:
        """Health NOT_SERVING, refuse new calls, let in-flight ones finish within ``grace_s``; then ``/metrics``
        closes."""
        await self.set_serving(False)
        if self.http is not None:  # both doors drain together
            await asyncio.gather(self.server.stop(grace_s), self.http.stop(grace_s))
        else:
            await self.server.stop(grace_s)
        self.state.metrics.close()


async def create_server(config: ServerConfig, pipeline: Pipeline | None = None,
                        api_keys: Mapping[str, frozenset[str]] | None = None,
                        generation: GeneratorSetup | None = None, *, metrics: MetricsConfig | None = None,
                        tracer: Tracer = NO_TRACER, http: HttpConfig | None = None,
                        live: LiveIndex | None = None) -> RunningServer:
    """Build and start a server (port 0 picks a free one). Health is NOT_SERVING until a pipeline is set and
    :meth:`RunningServer.set_serving` is called (``serve`` does both once the index and models are loaded).
    ``metrics``: where to serve ``/metrics`` (None: metrics are kept, not served); ``tracer``: the server spans'
    (the pipeline has its own, normally the same); ``http``: the HTTP door on the same loop and core (when its
    port is not -1). ``pipeline`` and ``live`` (where writes go) given here are attached before the first call
    can be accepted: a worker beside others on one port is handed connections the moment it listens."""
    limit = config.max_message_mb * 2**20
    server = grpc.aio.server(options=[("grpc.max_send_message_length", limit),
                                      ("grpc.max_receive_message_length", limit),
                                      ("grpc.so_reuseport", 1 if config.reuse_port else 0)])
    state = ServiceState(api_keys=dict(api_keys or load_api_keys(config.api_keys_file)), generation=generation,
                         tracer=tracer)
    if pipeline is not None:
        state.attach(pipeline, live)
    servicer = RetrieverService(state, config)
    add_service(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    address = f"{config.host}:{config.port}"
    if config.tls_cert:
        creds = grpc.ssl_server_credentials([(Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())])
        port = server.add_secure_port(address, creds)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise ConfigError(f"cannot listen on {address}")
    await server.start()
    if metrics is not None:
        try:
            state.metrics.start_http(metrics)
        except OSError as e:
            await server.stop(0)
            raise ConfigError(f"cannot serve metrics on {metrics.host}:{metrics.port}: {e}") from e
    running = RunningServer(server, port, health_servicer, state)
    if http is not None and http.enabled:
        try:
            running.http = await start_http(servicer.core, http, reuse_port=config.reuse_port)
        except BaseException:
            await server.stop(0)
            state.metrics.close()
            raise
    await running.set_serving(False)
    return running


class BackgroundServer:
    """A started server on its own event-loop thread, for blocking callers (tests, benchmarks, a service embedded
    in a synchronous program). ``target`` is its ``host:port``; ``http_url`` the HTTP door's base URL ("" = off)."""

    def __init__(self, pipeline: Pipeline | None, config: ServerConfig,
                 api_keys: Mapping[str, frozenset[str]] | None = None, generation: GeneratorSetup | None = None, *,
                 metrics: MetricsConfig | None = None, tracer: Tracer = NO_TRACER, http: HttpConfig | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="hybridrag-server", daemon=True)
        self.thread.start()
        self.running: RunningServer = self.run(create_server(config, pipeline, api_keys, generation, metrics=metrics,
                                                             tracer=tracer, http=http))
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
