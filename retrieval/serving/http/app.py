"""The HTTP door's app: its routes over the core, its pages, and uvicorn serving it in-process
(:func:`start_http`, on the running event loop).

Errors: the core's error -> gRPC code -> one HTTP status (:mod:`retrieval.serving.http.errors`), with the gRPC door's
message. The caller's key is ``Authorization: Bearer KEY`` (or ``x-api-key``); its deadline ``x-timeout-ms``. Bodies
over ``max_body_mb`` get 413 before they are read (:mod:`retrieval.serving.http.guard`). A client that disconnects
cancels its call, as a gRPC cancellation does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import re
import socket
from dataclasses import dataclass
from importlib import resources

import uvicorn
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from google.protobuf.message import Message
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from index_builder.errors import ConfigError
from retrieval.api import retriever_pb2 as pb
from retrieval.errors import InvalidRequest
from retrieval.serving.core import Caller, ServiceCore
from retrieval.serving.http.body import read_body
from retrieval.serving.http.convert import parse_json
from retrieval.serving.http.door import HttpDoor
from retrieval.serving.http.errors import add_error_handlers
from retrieval.serving.http.guard import Guard, is_loopback
from retrieval.serving.http.openai import MODELS, add_openai_routes
from retrieval.serving.http.openapi import body_spec, error_spec, install_openapi, ok_spec
from retrieval.serving.http.timeouts import ConnectionTimeouts, server_config
from retrieval.serving.settings import HttpConfig


def create_app(core: ServiceCore, config: HttpConfig) -> FastAPI:
    """The FastAPI app of the HTTP door over ``core`` (the same object the gRPC servicer calls)."""
    door = HttpDoor(core)
    app = FastAPI(title="hybridrag", version="1", docs_url=None, redoc_url=None,
                  description="Hybrid retrieval (BM25 + dense, RRF, late interaction, cross-encoder) and "
                              "retrieval-augmented generation. The REST bodies are the gRPC messages of "
                              "proto/hybridrag/v1/retriever.proto in proto3 JSON.")
    add_error_handlers(app)
    _retrieval_routes(app, door)
    _document_routes(app, door)
    _service_routes(app, door)
    _pages(app, config)
    add_openai_routes(app, door)
    app.add_middleware(Guard, core=core, allowed_origins=config.allowed_origins, allowed_hosts=config.allowed_hosts,
                       loopback=is_loopback(config.host), max_body=int(config.max_body_mb * 2**20))
    install_openapi(app, MODELS)
    return app


def _retrieval_routes(app: FastAPI, door: HttpDoor) -> None:
    core = door.core

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


def _document_routes(app: FastAPI, door: HttpDoor) -> None:
    core = door.core

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
            return await core.list_documents(caller, _list_request(request))
        return await door.unary(request, "ListDocuments", work)

    @app.post("/v1/rebuild", tags=["documents"], responses=ok_spec("RebuildResponse"),
              summary="Build a new snapshot from the document store now (a key for all tenants)")
    async def rebuild(request: Request) -> Response:
        async def work(caller: Caller, request_id: str) -> Message:
            return await core.rebuild(caller)
        return await door.unary(request, "Rebuild", work)


def _list_request(request: Request) -> pb.ListDocumentsRequest:
    """``GET /v1/documents``'s query string as a ListDocumentsRequest."""
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
    return body


def _service_routes(app: FastAPI, door: HttpDoor) -> None:
    core, state = door.core, door.core.state

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


def _pages(app: FastAPI, config: HttpConfig) -> None:
    """The playground (when ``[http] playground``) and the API's Swagger page, each with its own CSP."""
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
    """The slow-client timeouts of ``[http]`` (:mod:`retrieval.serving.http.timeouts`)."""
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
    server = _EmbeddedUvicorn(server_config(create_app(core, config), timeouts(config), log_level="warning",
                                            access_log=False, lifespan="off", loop="none", ws="none",
                                            timeout_keep_alive=config.keepalive_timeout_s))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # raises the start-up error
            raise ConfigError("the HTTP server stopped during start-up")
        await asyncio.sleep(0.01)
    return RunningHttp(server, task, port, config.host)
