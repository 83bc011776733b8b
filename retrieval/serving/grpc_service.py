"""The gRPC door: ``hybridrag.v1.Retriever`` on ``grpc.aio``, with health, reflection, deadlines, API keys and TLS.

The handlers are thin: each reads the caller (API key, deadline) off the gRPC context and calls the transport-neutral
core (:mod:`retrieval.serving.core`: checks, admission, the pipeline, the span and the metrics), which the HTTP door
(:mod:`retrieval.serving.http`) calls too; every unary handler goes through one wrapper (``_unary``), and errors
are mapped to status codes in one place (:func:`~retrieval.serving.status.status_for`). :func:`start_grpc` starts
this door over a core; :mod:`retrieval.serving.server` starts it beside the HTTP door and the metrics port.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from index_builder.errors import ConfigError
from retrieval.api import retriever_pb2 as pb
from retrieval.api import retriever_pb2_grpc as pb_grpc
from retrieval.errors import InvalidRequest
from retrieval.serving.core import SERVICE, Caller, ServiceCore
from retrieval.serving.settings import ServerConfig
from retrieval.serving.status import caller_message, status_for

log = logging.getLogger(__name__)


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

    def __init__(self, core: ServiceCore) -> None:
        self.core = core

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

    async def ListDocuments(self, request: pb.ListDocumentsRequest,
                            context: grpc.aio.ServicerContext) -> pb.ListDocumentsResponse:
        async def body(caller: Caller, request: pb.ListDocumentsRequest, request_id: str) -> pb.ListDocumentsResponse:
            return await self.core.list_documents(caller, request)
        return await self._unary("ListDocuments", request, context, body)


@dataclass
class RunningGrpc:
    """The started gRPC door: its server, the port it listens on, and its health service."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE):
            await self.health.set(name, status)

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls, let in-flight ones finish within ``grace_s``."""
        await self.server.stop(grace_s)


async def start_grpc(core: ServiceCore, config: ServerConfig) -> RunningGrpc:
    """Listen (port 0 = any free one; TLS when configured; SO_REUSEPORT with ``reuse_port``) and serve the
    Retriever, health (NOT_SERVING until :meth:`RunningGrpc.set_serving`) and reflection over ``core``."""
    limit = config.max_message_mb * 2**20
    server = grpc.aio.server(options=[("grpc.max_send_message_length", limit),
                                      ("grpc.max_receive_message_length", limit),
                                      ("grpc.so_reuseport", 1 if config.reuse_port else 0)])
    add_service(RetrieverService(core), server)
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
    running = RunningGrpc(server, port, health_servicer)
    await running.set_serving(False)
    return running
