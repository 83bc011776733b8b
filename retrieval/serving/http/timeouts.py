"""Slow clients cut off: the timeouts uvicorn's HTTP/1.1 protocol lacks, around it rather than inside it.

uvicorn times out only an idle keep-alive connection *after* a response. A client that connects and sends
nothing, sends half a request line, or declares ``content-length: 100000`` and trickles the body holds its socket,
its file descriptor and (for the body) a task forever: enough of them exhaust the process (slowloris). Here, per
connection, on the event loop (one timer each, no polling task):

- ``header_timeout_s``: the request line and headers must be complete this long after the connection opens, or
  after a keep-alive connection's next request starts. Past it the connection is closed (with a 408 if any of the
  request had arrived and no answer is on its way out).
- ``body_timeout_s`` / ``body_min_rate``: after the headers, the body must keep arriving at ``body_min_rate``
  bytes per second on average, checked once ``body_timeout_s`` has passed (so a short pause costs nothing and a
  large upload at a fair rate is never cut); past that, 408 and close. The check pauses while the server itself
  stops reading (flow control: the app has not taken what was read).
- ``send_timeout_s``: a client that stops reading a response (the server's writes back up past the transport's
  high-water mark) for this long is cut off: a stalled SSE reader no longer holds its answer's task.
- idle keep-alive: uvicorn's own ``timeout_keep_alive`` (``keepalive_timeout_s``).
- bytes that are not HTTP get a 400 in the service's error shape (uvicorn's own is text/plain); nothing of the read
  that held them reaches the app.

The same timeouts, with the same defaults, are set in the nginx front (:mod:`retrieval.serving.front`).

**The seam** (:func:`server_config`). uvicorn has no setting for any of these and no hook into its parser; what it
takes publicly is a protocol class (``uvicorn.Config(http=...)``: a name or an ``asyncio.Protocol`` class). The class
given here *wraps* the protocol uvicorn names ``httptools`` instead of subclassing it, so it uses none of uvicorn's
internals (its parser callbacks, its request cycle, its flow-control object, its 400 answer), only what asyncio
shows every protocol:

- the bytes in: the wrapper follows the requests' framing with its own ``httptools`` parser (the same C parser, the
  same leniency; each request's bytes are parsed twice, about a microsecond);
- the transport: ``is_reading()`` (has the server paused reading?), ``pause_writing`` / ``resume_writing``;
- where the connection's answer stands (a 408 must not land in the middle of a response): from the ASGI messages of
  the app, which :func:`track_responses` wraps; the app's task finds its connection in a context variable set
  while uvicorn handles the bytes, because uvicorn starts a request's task from inside ``data_received`` (tasks
  copy the context current when they are created).

What this relies on of uvicorn, each checked by ``tests/retrieval/serving/test_http_timeouts.py`` (which fails if a
new uvicorn changes it): that ``Config(http=cls)`` builds ``cls`` with the keyword arguments its own protocol takes
(passed through unread); that the ``httptools`` protocol is an ``asyncio.Protocol`` that keeps the transport it is
given; that a request's task is created inside ``data_received`` (or, pipelined, inside the previous request's
task), never with a fresh context (``Config(reset_contextvars=True)`` would break that: not used here).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, cast

import httptools
import uvicorn
from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.importer import import_from_string

Scope = MutableMapping[str, Any]
ASGIMessage = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[ASGIMessage]], Callable[[ASGIMessage], Awaitable[None]]],
                   Awaitable[None]]

INNER = "httptools"  # uvicorn's HTTP/1.1 protocol, by the name its ``--http`` option takes


@dataclass(frozen=True)
class ConnectionTimeouts:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    body_min_rate: int = 1024
    send_timeout_s: float = 30.0


def raw_error(status: int, reason: str, grpc_status: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer in the service's error shape (``connection: close``), for what the protocol answers
    itself, before any route runs."""
    request_id = uuid.uuid4().hex[:16]
    body = json.dumps({"error": {"code": status, "status": grpc_status, "type": "invalid_request_error",
                                 "message": message}, "request_id": request_id}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"x-request-id: {request_id}\r\nx-content-type-options: nosniff\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def timeout_response() -> bytes:
    return raw_error(408, "Request Timeout", "DEADLINE_EXCEEDED", "the request did not arrive in time "
                     "(http.header_timeout_s; the body: http.body_timeout_s and http.body_min_rate)")


class Answering:
    """Where a connection's answer stands, as its app's ASGI messages say: ``responding`` from ``http.response.start``
    until the last ``http.response.body`` has been handed over."""

    __slots__ = ("responding",)

    def __init__(self) -> None:
        self.responding = False


# The connection whose bytes uvicorn is handling: set around its data_received, inherited by the tasks it starts.
_CONNECTION: contextvars.ContextVar[Answering | None] = contextvars.ContextVar("hybridrag_http_connection",
                                                                               default=None)


def track_responses(app: ASGIApp) -> ASGIApp:
    """``app`` reporting each response's start and end to its connection's :class:`Answering` (one attribute set per
    message; a request with no connection in its context, e.g. a test calling the app directly, passes through)."""

    async def tracked(scope: Scope, receive: Callable[[], Awaitable[ASGIMessage]],
                      send: Callable[[ASGIMessage], Awaitable[None]]) -> None:
        answering = _CONNECTION.get()
        if answering is None or scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def sending(message: ASGIMessage) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                answering.responding = True
            await send(message)
            if kind == "http.response.body" and not message.get("more_body", False):
                answering.responding = False

        await app(scope, receive, sending)

    return tracked


class _Framing:
    """The parser's callbacks, handed on to the protocol (httptools calls ``on_*`` methods of the object it is given;
    the protocol's own method names stay free)."""

    __slots__ = ("owner",)

    def __init__(self, owner: _TimedProtocol) -> None:
        self.owner = owner

    def on_message_begin(self) -> None:
        self.owner.request_begins()

    def on_headers_complete(self) -> None:
        self.owner.headers_complete()

    def on_body(self, body: bytes) -> None:
        self.owner.body_bytes += len(body)

    def on_message_complete(self) -> None:
        self.owner.request_complete()


class _TimedProtocol(asyncio.Protocol):
    """One connection: uvicorn's protocol (``inner``) with the timeouts of ``timeouts`` around it."""

    inner_class: type[asyncio.Protocol]
    timeouts: ConnectionTimeouts

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.inner = self.inner_class(*args, **kwargs)
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.answering = Answering()
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(_Framing(self))
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn's own parser
        self.timer: asyncio.TimerHandle | None = None
        self.send_timer: asyncio.TimerHandle | None = None
        self.in_request = False  # bytes of a request have arrived since the last one completed
        self.body_started = 0.0
        self.body_bytes = 0

    # ----------------------------------------------------------- asyncio's calls, handed on

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream transport: uvicorn serves TCP and Unix sockets
        self.inner.connection_made(transport)
        self._arm(self.timeouts.header_timeout_s, self._cut)

    def data_received(self, data: bytes) -> None:
        if self.parser is not None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                pass  # uvicorn answers an upgrade it does not serve as a plain request; the framing stays followed
            except httptools.HttpParserError as e:
                self._refuse(e)
                return
        token = _CONNECTION.set(self.answering)
        try:
            self.inner.data_received(data)
        finally:
            _CONNECTION.reset(token)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None
        self.parser = None
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()
        if self.send_timer is None:
            self.send_timer = self.loop.call_later(self.timeouts.send_timeout_s, self._stalled)

    def resume_writing(self) -> None:
        self.inner.resume_writing()
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    # ----------------------------------------------------------- the requests' framing (the parser's calls)

    def request_begins(self) -> None:
        self.in_request = True
        if self.timer is None:  # a keep-alive connection's next request: its headers get the same time
            self._arm(self.timeouts.header_timeout_s, self._cut)

    def headers_complete(self) -> None:
        self.body_started, self.body_bytes = time.monotonic(), 0
        self._arm(self.timeouts.body_timeout_s, self._check_body)

    def request_complete(self) -> None:
        self._disarm()
        self.in_request = False

    # ----------------------------------------------------------- the timers

    def _arm(self, delay: float, fn: Callable[[], None]) -> None:
        self._disarm()
        self.timer = self.loop.call_later(delay, fn)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _check_body(self) -> None:
        self.timer = None
        if self.transport is None or not self.transport.is_reading():  # we stopped reading, not the client
            self._arm(1.0, self._check_body)
            return
        elapsed = time.monotonic() - self.body_started
        if self.body_bytes < self.timeouts.body_min_rate * elapsed:
            self._cut()
        else:
            self._arm(1.0, self._check_body)

    def _cut(self) -> None:
        self.timer = None
        if self.transport is None or self.transport.is_closing():
            return
        if self.in_request and not self.answering.responding:
            self.transport.write(timeout_response())
        self.transport.close()

    def _stalled(self) -> None:
        self.send_timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()  # the client reads nothing: what is buffered for it is dropped

    def _refuse(self, error: Exception) -> None:
        """Bytes that are not HTTP (a bad request line, chunk size or content-length): a 400 in the service's
        error shape, then close (uvicorn answers text/plain)."""
        self._disarm()
        self.parser = None
        if self.transport is not None and not self.transport.is_closing():
            if not self.answering.responding:
                self.transport.write(raw_error(400, "Bad Request", "INVALID_ARGUMENT",
                                               f"not a valid HTTP request: {error}"))
            self.transport.close()


def protocol_class(timeouts: ConnectionTimeouts) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol with ``timeouts`` around it (an ``asyncio.Protocol`` class for
    ``uvicorn.Config(http=...)``; use :func:`server_config`, which also tracks the answers)."""
    inner: type[asyncio.Protocol] = import_from_string(HTTP_PROTOCOLS[INNER])
    return type("TimedHttpProtocol", (_TimedProtocol,), {"inner_class": inner, "timeouts": timeouts})


def server_config(app: ASGIApp, timeouts: ConnectionTimeouts, **options: Any) -> uvicorn.Config:
    """The uvicorn configuration that serves ``app`` with ``timeouts`` (``options``: uvicorn's own settings, but
    ``http``)."""
    return uvicorn.Config(track_responses(app), http=protocol_class(timeouts), **options)
