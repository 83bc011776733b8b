"""The HTTP door's guard: one ASGI middleware in front of every route, so that what it checks holds by construction
(a new route cannot forget it). In order, before any route runs:

1. **Host** (DNS rebinding): on a server bound to a loopback address, a request whose ``Host`` is not a loopback
   name (``localhost``, ``127.0.0.1``, ``[::1]``) is refused, so a page of another site whose name was made to
   resolve to 127.0.0.1 cannot talk to it as "same origin"; ``[http] allowed_hosts`` lists the names otherwise.
2. **Origin** (cross-site request forgery): a browser request from another origin is refused with 403 unless that
   origin is in ``[http] allowed_origins`` (empty by default). ``Origin`` is compared with the request's own
   host; without ``Origin``, ``Sec-Fetch-Site: cross-site | same-site`` is refused but for a top-level navigation
   (a link to the playground). Other clients (curl, SDKs, the gRPC door) send neither header and are not affected.
   An allowed origin gets CORS headers, and its preflight is answered here.
3. **Authentication** of every ``/v1/`` route: 401 before anything about the request is looked at (as the gRPC
   door does). The core authenticates again; this makes the order the same on every route.
4. **Content type**: a request that carries a body must say ``content-type: application/json`` (UTF-8): 415
   otherwise. This is what makes the writes safe from HTML forms and ``fetch(..., {mode: "no-cors"})``, which can
   send only ``text/plain``, ``multipart/form-data`` and ``application/x-www-form-urlencoded`` without a preflight.
5. **Body size**: a declared ``content-length`` over ``max_body_mb`` gets 413 unread; a chunked body is counted as
   it arrives and refused once past the limit (413 in the service's error shape).

Every answer, refusals included, carries ``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY``, a
``Content-Security-Policy`` (``default-src 'none'; frame-ancestors 'none'`` unless the route set its own, as the
playground does), ``Referrer-Policy: no-referrer`` and ``Cross-Origin-Resource-Policy: same-origin``.
"""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from retrieval.errors import PermissionDenied, Unauthenticated
from retrieval.serving.core import Caller, ServiceCore
from retrieval.serving.http.door import TIMEOUT_HEADER
from retrieval.serving.http.errors import BodyTooLarge, UnsupportedMediaType, error_response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
DEFAULT_CSP = b"default-src 'none'; frame-ancestors 'none'"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CORS_HEADERS = "authorization, content-type, x-api-key, " + TIMEOUT_HEADER


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _hostport(netloc: str, scheme: str) -> tuple[str, int] | None:
    """(host, port) of ``host[:port]``, the port defaulting to the scheme's; None when it does not parse."""
    try:
        parts = urlsplit(f"//{netloc}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.hostname.lower(), port or (443 if scheme == "https" else 80)


class Guard:
    """The middleware (see the module docstring). ``core`` authenticates; ``loopback``: the door listens on a
    loopback address (the Host check's default)."""

    def __init__(self, app: Any, core: ServiceCore, *, allowed_origins: tuple[str, ...] = (),
                 allowed_hosts: tuple[str, ...] = (), loopback: bool = True, max_body: int = 16 * 2**20) -> None:
        self.app, self.core, self.max_body = app, core, max_body
        self.any_origin = "*" in allowed_origins
        self.origins = frozenset(o.rstrip("/").lower() for o in allowed_origins if o != "*")
        self.any_host = "*" in allowed_hosts or (not allowed_hosts and not loopback)
        self.hosts = frozenset(h.lower() for h in allowed_hosts) if allowed_hosts else LOOPBACK_NAMES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers") or ():
            headers.setdefault(k, v)  # the first of a repeated header
        origin = headers.get(b"origin", b"").decode("latin-1")
        cors = origin if origin and self._origin_allowed(origin) and not self._same_origin(origin, headers) else ""
        send = self._with_headers(send, cors)
        method = scope["method"]
        refusal = self._refusal(scope, headers, origin, method)
        if refusal is not None:
            await error_response(refusal, uuid.uuid4().hex[:16])(scope, receive, send)
            return
        if cors and method == "OPTIONS" and b"access-control-request-method" in headers:
            await send({"type": "http.response.start", "status": 204, "headers": [
                (b"access-control-allow-methods", b"GET, POST, DELETE"),
                (b"access-control-allow-headers", CORS_HEADERS.encode()), (b"access-control-max-age", b"600")]})
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, self._counted(receive), send)

    # ------------------------------------------------------------------ the checks

    def _refusal(self, scope: Scope, headers: dict[bytes, bytes], origin: str, method: str) -> Exception | None:
        host = headers.get(b"host", b"").decode("latin-1")
        if not self.any_host:
            hp = _hostport(host, "http")
            if hp is None or hp[0] not in self.hosts:
                return PermissionDenied(f"Host {host[:100]!r} is not allowed: this server answers to "
                                        f"{sorted(self.hosts)} ([http] allowed_hosts)")
        if origin:
            if not self._same_origin(origin, headers) and not self._origin_allowed(origin):
                return PermissionDenied(f"requests from origin {origin[:100]!r} are not allowed "
                                        "([http] allowed_origins)")
        else:
            site = headers.get(b"sec-fetch-site", b"").decode("latin-1").lower()
            if site in ("cross-site", "same-site"):
                navigation = method in ("GET", "HEAD") and headers.get(b"sec-fetch-mode") == b"navigate"
                if not navigation:
                    return PermissionDenied(f"{site} browser requests are not allowed ([http] allowed_origins)")
        if origin and method == "OPTIONS" and b"access-control-request-method" in headers:
            return None  # an allowed origin's preflight: answered without a key (browsers send none)
        path: str = scope.get("path", "")
        if path.startswith("/v1/"):
            try:
                self.core.authenticate(Caller.of(_str_headers(headers), None, "http"))
            except Unauthenticated as e:
                return e
        if method in BODY_METHODS and (refused := self._content_type_refusal(headers)) is not None:
            return refused
        declared = headers.get(b"content-length", b"").strip()
        if declared.isdigit() and int(declared) > self.max_body:
            return BodyTooLarge(f"the request body is {int(declared)} bytes; at most {self.max_body} are allowed "
                                "(http.max_body_mb)")
        return None

    @staticmethod
    def _content_type_refusal(headers: dict[bytes, bytes]) -> Exception | None:
        ctype = headers.get(b"content-type")
        if ctype is None:
            length = headers.get(b"content-length", b"0").strip()
            if length not in (b"", b"0") or b"transfer-encoding" in headers:
                return UnsupportedMediaType("a request body needs 'content-type: application/json'")
            return None
        media, _, params = ctype.decode("latin-1").partition(";")
        if media.strip().lower() != "application/json":
            return UnsupportedMediaType(f"content-type {media.strip()[:80]!r} is not accepted: bodies are JSON "
                                        "('content-type: application/json')")
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
                return UnsupportedMediaType(f"charset {value.strip()[:40]!r} is not accepted: JSON bodies are UTF-8")
        return None

    def _origin_allowed(self, origin: str) -> bool:
        return self.any_origin or origin.rstrip("/").lower() in self.origins

    @staticmethod
    def _same_origin(origin: str, headers: dict[bytes, bytes]) -> bool:
        if origin == "null":
            return False
        try:
            parts = urlsplit(origin)
        except ValueError:
            return False
        mine = _hostport(parts.netloc, parts.scheme)
        host = _hostport(headers.get(b"host", b"").decode("latin-1"), parts.scheme)
        return mine is not None and mine == host

    # ------------------------------------------------------------------ what wraps the app

    def _with_headers(self, send: Send, cors: str) -> Send:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = list(message.get("headers") or ())
                present = {k.lower() for k, _ in out}
                out += [h for h in SECURITY_HEADERS if h[0] not in present]
                if b"content-security-policy" not in present:
                    out.append((b"content-security-policy", DEFAULT_CSP))
                if cors:
                    out += [(b"access-control-allow-origin", cors.encode("latin-1")), (b"vary", b"Origin"),
                            (b"access-control-expose-headers", b"x-request-id")]
                message["headers"] = out
            await send(message)
        return sending

    def _counted(self, receive: Receive) -> Receive:
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise BodyTooLarge(f"the request body is over {self.max_body} bytes (http.max_body_mb)")
            return message
        return counted


def _str_headers(headers: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers.items()
            if k in (b"authorization", b"x-api-key")}
