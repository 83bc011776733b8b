"""The HTTP door: REST + Server-Sent Events on FastAPI/uvicorn, beside gRPC, in the same process, on the same event
loop and the same core (:class:`~retrieval.serving.core.ServiceCore`: auth, tenants, admission, deadlines, the
pipeline, the semantic cache, spans and metrics).

- ``POST /v1/retrieve``, ``POST /v1/generate`` (SSE: ``passages``, ``token``..., ``stats``, ``done``),
  ``POST /v1/documents`` (upsert), ``DELETE /v1/documents``, ``POST /v1/rebuild``, ``GET /v1/status``: JSON bodies
  are the proto messages in proto3's JSON mapping (field names as in ``proto/``; 64-bit integers are numbers, but
  ``chunk_id``, a string: on an engine backend it is a 63-bit hash, past what JSON numbers hold exactly), parsed
  with ``google.protobuf.json_format`` so an unknown field or a wrong type is a 400 that names it. Their schemas
  in ``/openapi.json`` are generated from the proto.
- OpenAI-compatible (:mod:`retrieval.serving.openai_api`): ``/v1/chat/completions``, ``/v1/embeddings``,
  ``/v1/models``; Cohere-style ``/v1/rerank``.
- ``/healthz`` (the process answers), ``/readyz`` (the index and models are loaded), ``/metrics``, ``/playground``.

Errors: the core's error -> gRPC code (:func:`status_for`) -> one HTTP status (:data:`HTTP_STATUS`), with the
gRPC door's message, as ``{"error": {"code", "status", "message", "type"}, "request_id"}``. The caller's key is
``Authorization: Bearer KEY`` (or ``x-api-key``); its deadline ``x-timeout-ms``. Bodies over ``max_body_mb`` get
413 before they are read. A client that disconnects cancels its call, as a gRPC cancellation does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import re
import socket
import uuid
from dataclasses import dataclass
from importlib import resources
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from google.protobuf.message import Message
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from index_builder.errors import ConfigError
from retrieval.api import retriever_pb2 as pb
from retrieval.errors import InvalidRequest
from retrieval.serving.core import Caller, ServiceCore, caller_message
from retrieval.serving.http_common import (
    ERROR_SCHEMA,
    ERROR_TYPE,
    HttpDoor,
    body_spec,
    error_response,
    error_spec,
    model_schemas,
    ok_spec,
    parse_json,
    proto_schemas,
    read_body,
)
from retrieval.serving.http_guard import Guard, is_loopback
from retrieval.serving.http_timeouts import ConnectionTimeouts, protocol_class
from retrieval.serving.openai_api import MODELS, add_openai_routes
from retrieval.serving.settings import HttpConfig  # noqa: F401  (re-exported: its section)


def create_app(core: ServiceCore, config: HttpConfig) -> FastAPI:
    """The FastAPI app of the HTTP door over ``core`` (the same object the gRPC servicer calls)."""
    door = HttpDoor(core)
    app = FastAPI(title="hybridrag", version="1", docs_url=None, redoc_url=None,
                  description="Hybrid retrieval (BM25 + dense, RRF, late interaction, cross-encoder) and "
                              "retrieval-augmented generation. The REST bodies are the gRPC messages of "
                              "proto/hybridrag/v1/retriever.proto in proto3 JSON.")
    state = core.state

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors()[:5]:
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            parts.append(f"{where or 'body'}: {err.get('msg')}")
        return error_response(InvalidRequest("; ".join(parts)), uuid.uuid4().hex[:16])

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        request_id = uuid.uuid4().hex[:16]
        body = {"error": {"code": status, "status": {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(status, "ERROR"),
                          "message": caller_message(f"{request.method} {request.url.path}: {exc.detail}"),
                          "type": ERROR_TYPE.get(status, "error")}, "request_id": request_id}
        return JSONResponse(body, status_code=status, headers={**(exc.headers or {}), "x-request-id": request_id})

    @app.post("/v1/retrieve", tags=["retrieval"], openapi_extra=body_spec("RetrieveRequest"),
              responses=ok_spec("RetrieveResponse"), summary="Retrieve passages (the gRPC Retrieve)")
    async def retrieve(request: Request) -> Response:
        async def work(caller: Caller, request_id: str) -> Message:
            body = parse_json(await read_body(request), pb.RetrieveRequest, "RetrieveRequest")
            return await core.retrieve(caller, body, request_id)
        return await door.unary(request, "Retrieve", work)

    @app.post("/v1/generate", tags=["retrieval"], openapi_extra=body_spec("GenerateRequest"),
              responses={200: {"description": "Server-Sent Events: passages (a RetrieveResponse), token ({text}) "
                                              "..., stats (a GenerateStats), done ({request_id}); error ({error}) "
                                              "when the answer fails after it started",
                               "content": {"text/event-stream": {"schema": {"type": "string"}}}}, **error_spec()},
              summary="Retrieve, then stream an answer (SSE: passages, token..., stats, done; error on failure)")
    async def generate(request: Request) -> Response:
        return await door.generate(request)

    @app.post("/v1/documents", tags=["documents"], openapi_extra=body_spec("UpsertRequest"), responses=ok_spec("UpsertResponse"),
              summary="Upsert documents (durable when acknowledged; searchable at once)")
    async def upsert(request: Request) -> Response:
        async def work(caller: Caller, request_id: str) -> Message:
            body = parse_json(await read_body(request), pb.UpsertRequest, "UpsertRequest")
            return await core.upsert(caller, body, request_id)
        return await door.unary(request, "Upsert", work)

    @app.delete("/v1/documents", tags=["documents"], openapi_extra=body_spec("DeleteRequest", required=False),
                responses=ok_spec("DeleteResponse"),
                summary="Delete documents by id (a JSON body, or ?ids=a&ids=b&tenant=t)")
    async def delete(request: Request) -> Response:
        async def work(caller: Caller, request_id: str) -> Message:
            body = parse_json(await read_body(request), pb.DeleteRequest, "DeleteRequest")
            if request.query_params:
                unknown = set(request.query_params) - {"ids", "tenant"}
                if unknown:
                    raise InvalidRequest(f"unknown query parameter(s) {sorted(unknown)}; allowed: ['ids', 'tenant']")
                body.ids.extend(request.query_params.getlist("ids"))
                body.tenant = body.tenant or request.query_params.get("tenant", "")
            return await core.delete(caller, body)
        return await door.unary(request, "Delete", work)

    @app.get("/v1/documents", tags=["documents"], responses=ok_spec("ListDocumentsResponse"),
             summary="List documents, a page at a time, without their text (?tenant=t&filter=key=value&after=id&limit=n)")
    async def list_documents(request: Request) -> Response:
        async def work(caller: Caller, request_id: str) -> Message:
            q = request.query_params
            unknown = set(q) - {"tenant", "filter", "after", "limit"}
            if unknown:
                raise InvalidRequest(f"unknown query parameter(s) {sorted(unknown)}; allowed: "
                                     "['after', 'filter', 'limit', 'tenant']")
            body = pb.ListDocumentsRequest(tenant=q.get("tenant", ""), after=q.get("after", ""))
            try:
                body.limit = int(q.get("limit", "0"))
            except ValueError:
                raise InvalidRequest(f"'limit' must be an integer, got {q.get('limit')!r:.40}") from None
            for item in q.getlist("filter"):
                key, sep, value = item.partition("=")
                if not sep:
                    raise InvalidRequest(f"'filter' must be KEY=VALUE, got {item!r:.80}")
                body.filters[key] = value
            return await core.list_documents(caller, body)
        return await door.unary(request, "ListDocuments", work)

    @app.post("/v1/rebuild", tags=["documents"], responses=ok_spec("RebuildResponse"),
              summary="Build a new snapshot from the document store now (a key for all tenants)")
    async def rebuild(request: Request) -> Response:
        async def work(caller: Caller, request_id: str) -> Message:
            return await core.rebuild(caller)
        return await door.unary(request, "Rebuild", work)

    @app.get("/v1/status", tags=["service"], responses=ok_spec("IndexStatus"), summary="Index, models and backends")
    async def status(request: Request) -> Response:
        async def work(caller: Caller, request_id: str) -> Message:
            return core.status(caller)
        return await door.unary(request, "GetIndexStatus", work)

    @app.get("/healthz", tags=["service"], summary="Liveness: the process answers")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["service"], summary="Readiness: the index and models are loaded (503 until then)",
             responses={503: {"description": "loading or draining", "content": {"application/json": {
                 "schema": {"type": "object", "properties": {"status": {"type": "string"}}}}}}})
    async def readyz() -> JSONResponse:
        ready = state.serving and state.pipeline is not None
        return JSONResponse({"status": "ready" if ready else "loading"}, status_code=200 if ready else 503)

    @app.get("/metrics", tags=["service"], summary="Prometheus metrics (the same registry as the metrics port)",
             response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    if config.playground:
        page = resources.files("retrieval.serving").joinpath("static/playground.html").read_text(encoding="utf-8")
        page_headers = {"cache-control": "no-cache", "content-security-policy": page_csp(page)}

        @app.get("/playground", include_in_schema=False)
        async def playground() -> HTMLResponse:
            return HTMLResponse(page, headers=page_headers)

        @app.get("/", include_in_schema=False)
        async def root() -> RedirectResponse:
            return RedirectResponse("/playground")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        page = get_swagger_ui_html(openapi_url="/openapi.json", title="hybridrag API")
        return HTMLResponse(page.body, headers={"content-security-policy": DOCS_CSP})

    add_openai_routes(app, door)
    app.add_middleware(Guard, core=core, allowed_origins=config.allowed_origins, allowed_hosts=config.allowed_hosts,
                       loopback=is_loopback(config.host), max_body=int(config.max_body_mb * 2**20))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {}).update(proto_schemas(
                pb.RetrieveRequest.DESCRIPTOR, pb.RetrieveResponse.DESCRIPTOR, pb.GenerateRequest.DESCRIPTOR,
                pb.GenerateResponse.DESCRIPTOR, pb.UpsertRequest.DESCRIPTOR, pb.UpsertResponse.DESCRIPTOR,
                pb.DeleteRequest.DESCRIPTOR, pb.DeleteResponse.DESCRIPTOR, pb.RebuildResponse.DESCRIPTOR,
                pb.IndexStatus.DESCRIPTOR))
            components["schemas"].update(model_schemas(*MODELS))
            components["schemas"]["Error"] = ERROR_SCHEMA
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            for path, operations in schema["paths"].items():  # a key on the API; the probes and pages need none
                if path.startswith("/v1/"):
                    for operation in operations.values():
                        operation["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


# Swagger UI (FastAPI's page) loads its script and style from jsDelivr and runs one inline script
DOCS_CSP = ("default-src 'none'; script-src 'unsafe-inline' https://cdn.jsdelivr.net; style-src https://cdn.jsdelivr.net; "
            "img-src 'self' data: https://fastapi.tiangolo.com; connect-src 'self'; frame-ancestors 'none'")


def page_csp(page: str) -> str:
    """The playground's Content-Security-Policy: its own inline script and style (by hash, so nothing injected into
    the page could run), calls to its own origin only, never framed."""
    def hashes(tag: str) -> str:
        bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.S)
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in bodies)
    return (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; connect-src 'self'; "
            "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def timeouts(config: HttpConfig) -> ConnectionTimeouts:
    """The slow-client timeouts of ``[http]`` (:mod:`retrieval.serving.http_timeouts`)."""
    return ConnectionTimeouts(config.header_timeout_s, config.body_timeout_s, config.body_min_rate,
                              config.send_timeout_s)


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn inside our process: the signals stay ours (``serve`` drains gRPC and HTTP together on SIGTERM)."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


@dataclass
class RunningHttp:
    server: uvicorn.Server
    task: asyncio.Task[None]
    port: int
    host: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, let open requests finish within ``grace_s``, then close."""
        self.server.config.timeout_graceful_shutdown = max(int(grace_s + 0.999), 1)
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), grace_s + 5)
        except TimeoutError:
            self.server.force_exit = True
            await self.task


async def start_http(core: ServiceCore, config: HttpConfig, *, reuse_port: bool = False) -> RunningHttp:
    """Listen (port 0 = any free one) and serve the HTTP door on the running event loop; returns once it accepts.
    ``reuse_port``: listen beside the other server processes on the same port (SO_REUSEPORT)."""
    # proto IPPROTO_TCP, not 0: asyncio turns Nagle off only on sockets that say they are TCP, and with Nagle a
    # response written as headers + body waits for the client's delayed ACK (~40 ms a call, measured by bench.load)
    sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM,
                         socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted connections on Linux
    try:
        sock.bind((config.host, config.port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot serve HTTP on {config.host}:{config.port}: {e}") from None
    sock.listen(2048)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    server = _EmbeddedUvicorn(uvicorn.Config(create_app(core, config), log_level="warning", access_log=False,
                                             lifespan="off", loop="none", http=protocol_class(timeouts(config)),
                                             ws="none", timeout_keep_alive=config.keepalive_timeout_s))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # raises the start-up error
            raise ConfigError("the HTTP server stopped during start-up")
        await asyncio.sleep(0.01)
    return RunningHttp(server, task, port, config.host)
