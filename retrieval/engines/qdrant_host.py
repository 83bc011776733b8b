"""A development host for one Qdrant engine shared by several replicas: Qdrant's local engine (the one inside
``qdrant-client``, the same code ``location = ":memory:"`` or a folder runs in-process) behind the part of
Qdrant's REST API that :mod:`retrieval.engines.qdrant` uses.

Why it exists: no Qdrant server installs on the development machines (no binary on PyPI, npm or apt), and a
folder of the local engine can be opened by one process only. With this host, N ``hybridrag serve`` replicas
talk to one engine over HTTP through qdrant-client's *remote* code path (``location = "http://..."``), exactly
as they would talk to a Qdrant server or cluster, so the replica tests exercise that path. It is not a Qdrant
server: one process, requests serialised under one lock, exact (brute-force) search, no payload indexes, no
sharding, replication or authentication. In production, point ``[backend] location`` at Qdrant itself.

Endpoints (Qdrant's paths and bodies, answers in Qdrant's ``{"result", "status", "time"}`` envelope): ``GET /``,
``/healthz``, ``GET|PUT|DELETE /collections/{c}``, ``GET /collections/{c}/exists``, ``PUT /collections/{c}/index``,
``PUT /collections/{c}/points``, ``POST /collections/{c}/points`` (retrieve), ``.../points/{delete,batch,scroll,
count,query,query/groups}``. Anything else answers 404 naming the path.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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
        self.lock = threading.Lock()

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


def make_server(location: str, host: str = "127.0.0.1", port: int = 6333) -> ThreadingHTTPServer:
    engine = EngineHost(location)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self, method: str) -> None:
            t = time.perf_counter()
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            path = self.path.split("?", 1)[0]
            try:
                body = json.loads(raw) if raw else None
                with engine.lock:  # the local engine is not thread-safe
                    status, result = engine.handle(method, path, body)
            except Exception as e:  # noqa: BLE001 -- the client gets Qdrant's error shape, the host keeps serving
                status, result = (400 if isinstance(e, ValueError | KeyError) else 500), f"{type(e).__name__}: {e}"
            if status == 200:
                out = {"result": _dump(result), "status": "ok", "time": time.perf_counter() - t}
            else:
                out = {"status": {"error": str(result)}, "time": time.perf_counter() - t}
            data = json.dumps(out).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 -- http.server's names
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._serve("PUT")

        def do_DELETE(self) -> None:  # noqa: N802
            self._serve("DELETE")

        def do_PATCH(self) -> None:  # noqa: N802
            self._serve("PATCH")

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("engine host: " + format, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve_host(location: str, host: str = "127.0.0.1", port: int = 6333) -> None:
    server = make_server(location, host, port)
    log.info("engine host on http://%s:%d over %s", host, server.server_address[1], location)
    print(f"engine host listening on http://{host}:{server.server_address[1]} ({location})", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
