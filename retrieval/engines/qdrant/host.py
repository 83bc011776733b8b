"""A development host for one Qdrant engine shared by several replicas: Qdrant's local engine (the one inside
``qdrant-client``, the same code ``location = ":memory:"`` or a folder runs in-process) behind the part of
Qdrant's REST API that :mod:`retrieval.engines.qdrant` uses.

Why it exists: no Qdrant server installs on the development machines (no binary on PyPI, npm or apt), and a
folder of the local engine can be opened by one process only. With this host, N ``hybridrag serve`` replicas
talk to one engine over HTTP through qdrant-client's *remote* code path (``location = "http://..."``), exactly
as they would talk to a Qdrant server or cluster, so the replica tests exercise that path. It is not a Qdrant
server: one process, requests serialised under one lock, exact (brute-force) search, no payload indexes, no
sharding, replication or authentication. In production, point ``[backend] location`` at Qdrant itself.

It is more than a test helper (``bench`` runs the REST backend through it, docs/results/scale-out.md measured it),
so it is held to the HTTP door's rules (:mod:`retrieval.serving.http.guard`, whose checks it reuses), because it
has no key and a browser on the same machine can reach a loopback port:

- **Host**: a ``Host`` that is not an IP address, ``localhost`` or a name given with ``--allowed-host`` gets 403
  (DNS rebinding: an attacker's name made to resolve to this machine is still the attacker's name).
- **Origin**: a request with an ``Origin`` other than the host's own, or marked ``Sec-Fetch-Site: cross-site |
  same-site``, gets 403 (nothing here is for browsers; no CORS is ever granted).
- **Content type**: a body must be ``application/json`` (UTF-8), else 415: an HTML form or a ``no-cors`` fetch
  cannot send that type without a preflight, which the Origin rule refuses.
- **Size and time**: a body over ``max_body_mb`` gets 413; the HTTP door's slow-client timeouts (headers, body
  rate, a stalled reader, idle keep-alive: :mod:`retrieval.serving.http.timeouts`); at most ``max_connections``
  connections and requests at once (503 past it). Connections live on one asyncio loop (uvicorn), so a silent
  one costs a socket, not a thread; the engine's work runs on one worker thread (the local engine is not
  thread-safe, so requests are serialised as before).
- **Bind**: beyond loopback it prints a warning that anyone who reaches the port reads and writes every
  collection.

Endpoints (Qdrant's paths and bodies, answers in Qdrant's ``{"result", "status", "time"}`` envelope): ``GET /``,
``/healthz``, ``GET|PUT|DELETE /collections/{c}``, ``GET /collections/{c}/exists``, ``PUT /collections/{c}/index``,
``PUT /collections/{c}/points``, ``POST /collections/{c}/points`` (retrieve), ``.../points/{delete,batch,scroll,
count,query,query/groups}``. Anything else answers 404 naming the path.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import socket
import sys
import time
import warnings
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from retrieval.serving.http.guard import (
    BODY_METHODS,
    DEFAULT_CSP,
    LOOPBACK_NAMES,
    SECURITY_HEADERS,
    Guard,
    _hostport,
    is_loopback,
)
from retrieval.serving.http.timeouts import ConnectionTimeouts, server_config

log = logging.getLogger(__name__)

_PATH = re.compile(r"^/collections/([A-Za-z0-9_\-]+)(/.*)?$")


def _dump(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if isinstance(obj, list | tuple):
        return [_dump(o) for o in obj]
    return obj


class EngineHost:
    """The REST routes over one local engine (``location``: a folder, or ``":memory:"``)."""

    def __init__(self, location: str) -> None:
        from qdrant_client import QdrantClient, models

        self.m = models
        self.client = QdrantClient(location=":memory:") if location == ":memory:" else QdrantClient(path=location)

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        m, c = self.m, self.client
        if path in ("/", "/healthz", "/readyz", "/livez"):
            return 200, {"title": "hybridrag engine host (qdrant local engine)", "version": "1.16.0"}
        match = _PATH.match(path)
        if not match:
            return 404, f"no such endpoint: {method} {path}"
        name, rest = match.group(1), match.group(2) or ""
        if rest == "/exists" and method == "GET":
            return 200, {"exists": c.collection_exists(name)}
        if rest == "" and method == "GET":
            return 200, c.get_collection(name)
        if rest == "" and method == "DELETE":
            return 200, c.delete_collection(name)
        if rest == "" and method == "PUT":
            cc = m.CreateCollection.model_validate(body)
            return 200, c.create_collection(name, vectors_config=cc.vectors, sparse_vectors_config=cc.sparse_vectors,
                                            metadata=cc.metadata)
        if rest == "/index" and method == "PUT":
            fi = m.CreateFieldIndex.model_validate(body)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return 200, c.create_payload_index(name, fi.field_name, fi.field_schema)
        if rest == "/points" and method == "PUT":
            ops: Any = body
            points = m.PointsBatch.model_validate(ops).batch if "batch" in ops else \
                m.PointsList.model_validate(ops).points
            return 200, c.upsert(name, points, wait=True)
        if rest == "/points" and method == "POST":
            pr = m.PointRequest.model_validate(body)
            return 200, c.retrieve(name, pr.ids, with_payload=pr.with_payload if pr.with_payload is not None else True,
                                   with_vectors=pr.with_vector or False)
        if rest == "/points/delete" and method == "POST":
            sel = m.FilterSelector.model_validate(body) if "filter" in body else m.PointIdsList.model_validate(body)
            return 200, c.delete(name, sel, wait=True)
        if rest == "/points/batch" and method == "POST":
            uo = m.UpdateOperations.model_validate(body)
            return 200, c.batch_update_points(name, uo.operations, wait=True)
        if rest == "/points/scroll" and method == "POST":
            sr = m.ScrollRequest.model_validate(body)
            points, offset = c.scroll(name, scroll_filter=sr.filter, limit=sr.limit or 10, offset=sr.offset,
                                      with_payload=sr.with_payload if sr.with_payload is not None else True,
                                      with_vectors=sr.with_vector or False, order_by=sr.order_by)
            return 200, {"points": _dump(points), "next_page_offset": offset}
        if rest == "/points/count" and method == "POST":
            cr = m.CountRequest.model_validate(body)
            return 200, c.count(name, count_filter=cr.filter, exact=cr.exact if cr.exact is not None else True)
        if rest == "/points/query" and method == "POST":
            q = m.QueryRequest.model_validate(body)
            return 200, c.query_points(name, query=q.query, using=q.using, prefetch=q.prefetch, query_filter=q.filter,
                                       search_params=q.params, limit=q.limit or 10, offset=q.offset,
                                       with_payload=q.with_payload if q.with_payload is not None else False,
                                       with_vectors=q.with_vector or False, score_threshold=q.score_threshold)
        if rest == "/points/query/groups" and method == "POST":
            g = m.QueryGroupsRequest.model_validate(body)
            return 200, c.query_points_groups(name, g.group_by, query=g.query, using=g.using, prefetch=g.prefetch,
                                              query_filter=g.filter, search_params=g.params, limit=g.limit or 10,
                                              group_size=g.group_size or 3,
                                              with_payload=g.with_payload if g.with_payload is not None else False,
                                              with_vectors=g.with_vector or False, score_threshold=g.score_threshold)
        return 404, f"no such endpoint: {method} {path}"


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class HostLimits:
    """What one client may hold. The timeouts are the HTTP door's (``[http]``), with its defaults;
    ``max_connections``: connections and requests at once (uvicorn's ``limit_concurrency``: a request past it is
    answered 503); ``allowed_hosts``: names the ``Host`` header may carry besides IP addresses and ``localhost``
    (``"*"``: any, which gives up the DNS-rebinding check)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    body_min_rate: int = 1024
    send_timeout_s: float = 30.0
    keepalive_timeout_s: int = 30
    max_connections: int = 256
    max_body_mb: int = 64
    allowed_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "send_timeout_s", "keepalive_timeout_s",
                     "max_connections", "max_body_mb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")


def _error(status: int, message: str, started: float) -> tuple[int, bytes]:
    """Qdrant's error envelope."""
    return status, json.dumps({"status": {"error": message}, "time": time.perf_counter() - started}).encode()


class EngineApp:
    """The ASGI application: the checks (module docstring), then :meth:`EngineHost.handle` on the worker thread."""

    def __init__(self, engine: EngineHost, limits: HostLimits) -> None:
        self.engine, self.limits = engine, limits
        self.max_body = limits.max_body_mb * 2**20
        self.any_host = "*" in limits.allowed_hosts
        self.hosts = LOOPBACK_NAMES | {h.lower() for h in limits.allowed_hosts}
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="engine")

    def refusal(self, method: str, headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        host = headers.get(b"host", b"").decode("latin-1")
        if not self.any_host:
            hp = _hostport(host, "http")
            if hp is None or not (hp[0] in self.hosts or _is_address(hp[0])):
                return 403, (f"Host {host[:100]!r} is not allowed: this engine host answers to IP addresses, "
                             f"{sorted(self.hosts)} (--allowed-host)")
        origin = headers.get(b"origin", b"").decode("latin-1")
        if origin and not Guard._same_origin(origin, headers):
            return 403, f"requests from origin {origin[:100]!r} are not allowed: the engine host is not for browsers"
        site = headers.get(b"sec-fetch-site", b"").decode("latin-1").lower()
        if not origin and site in ("cross-site", "same-site"):
            return 403, f"{site} browser requests are not allowed: the engine host is not for browsers"
        if method in BODY_METHODS and (refused := Guard._content_type_refusal(headers)) is not None:
            return 415, str(refused)
        declared = headers.get(b"content-length", b"").strip()
        if declared.isdigit() and int(declared) > self.max_body:
            return 413, f"the request body is {int(declared)} bytes; at most {self.max_body} are allowed (--max-body-mb)"
        return None

    def work(self, method: str, path: str, raw: bytes, started: float) -> tuple[int, bytes]:
        """On the worker thread: parse, run, encode (a large answer's JSON is built off the event loop too)."""
        try:
            body = json.loads(raw) if raw else None
            status, result = self.engine.handle(method, path, body)
        except Exception as e:  # noqa: BLE001 -- the client gets Qdrant's error shape, the host keeps serving
            status, result = (400 if isinstance(e, ValueError | KeyError) else 500), f"{type(e).__name__}: {e}"
        if status != 200:
            return _error(status, str(result), started)
        return 200, json.dumps({"result": _dump(result), "status": "ok", "time": time.perf_counter() - started}).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        started = time.perf_counter()
        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers") or ():
            headers.setdefault(k, v)  # the first of a repeated header
        method = scope["method"]
        refused = self.refusal(method, headers)
        if refused is not None:
            await self._answer(send, *_error(refused[0], refused[1], started), close=True)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await self._answer(send, *_error(413, f"the request body is over {self.max_body} bytes "
                                                      "(--max-body-mb)", started), close=True)
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        loop = asyncio.get_running_loop()
        status, data = await loop.run_in_executor(self.worker, self.work, method, scope["path"], b"".join(chunks),
                                                  started)
        await self._answer(send, status, data)

    @staticmethod
    async def _answer(send: Send, status: int, data: bytes, close: bool = False) -> None:
        out = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
               *SECURITY_HEADERS, (b"content-security-policy", DEFAULT_CSP)]
        if close:  # a refused request's body is not read: the connection cannot carry another one
            out.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": data})


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def beyond_loopback_warning(host: str, port: int) -> str:
    return (f"WARNING: the engine host listens on {host or '*'}:{port}, beyond loopback, and has no authentication: "
            "anyone who can reach this port can read, write and delete every collection. Bind 127.0.0.1 (the "
            "default), or let only the replicas' addresses reach the port (a firewall); for anything beyond a "
            "development machine, run Qdrant itself (docs/deployment.md).")


def serve_host(location: str, host: str = "127.0.0.1", port: int = 6333, limits: HostLimits | None = None) -> None:
    """Serve until SIGTERM / SIGINT. Raises ``ValueError`` (a one-line message) for a port it cannot bind."""
    import uvicorn

    limits = limits or HostLimits()
    sock = _bind(host, port)
    port = sock.getsockname()[1]
    if not is_loopback(host):
        log.warning("%s", beyond_loopback_warning(host, port))
        print(beyond_loopback_warning(host, port), file=sys.stderr, flush=True)
    engine = EngineHost(location)
    app = EngineApp(engine, limits)
    timeouts = ConnectionTimeouts(header_timeout_s=limits.header_timeout_s, body_timeout_s=limits.body_timeout_s,
                                  body_min_rate=limits.body_min_rate, send_timeout_s=limits.send_timeout_s)
    server = uvicorn.Server(server_config(app, timeouts, log_level="warning", access_log=False, lifespan="off", ws="none",
                                          timeout_keep_alive=limits.keepalive_timeout_s,
                                          limit_concurrency=limits.max_connections))
    log.info("engine host on http://%s:%d over %s", host, port, location)
    print(f"engine host listening on http://{host}:{port} ({location})", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        app.worker.shutdown(wait=True)
        engine.client.close()
        sock.close()
