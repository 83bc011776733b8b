"""Slow clients cut off: uvicorn's HTTP/1.1 protocol (httptools) with the timeouts it lacks.

uvicorn times out only an idle keep-alive connection *after* a response. A client that connects and sends
nothing, sends half a request line, or declares ``content-length: 100000`` and trickles the body holds its socket,
its file descriptor and (for the body) a task forever: enough of them exhaust the process (slowloris). Here, per
connection, on the event loop (one timer each, no polling task):

- ``header_timeout_s``: the request line and headers must be complete this long after the connection opens, or
  after a keep-alive connection's next request starts. Past it the connection is closed (with a 408 if any of the
  request had arrived).
- ``body_timeout_s`` / ``body_min_rate``: after the headers, the body must keep arriving at ``body_min_rate``
  bytes per second on average, checked once ``body_timeout_s`` has passed (so a short pause costs nothing and a
  large upload at a fair rate is never cut); past that, 408 and close. The check pauses while the server itself
  stops reading (flow control: the app has not taken what was read).
- ``send_timeout_s``: a client that stops reading a response (the server's writes back up past the transport's
  high-water mark) for this long is cut off: a stalled SSE reader no longer holds its answer's task.
- idle keep-alive: uvicorn's own ``timeout_keep_alive`` (``keepalive_timeout_s``).

The same timeouts, with the same defaults, are set in the nginx front (:mod:`retrieval.serving.front`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


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


def protocol_class(timeouts: ConnectionTimeouts) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with ``timeouts`` (pass as ``uvicorn.Config(http=...)``)."""

    class GuardedHttpProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._timer: asyncio.TimerHandle | None = None
            self._send_timer: asyncio.TimerHandle | None = None
            self._in_request = False  # bytes of a request have arrived since the last one completed
            self._body_started = 0.0
            self._body_bytes = 0

        def _arm(self, delay: float, fn: Any) -> None:
            self._disarm()
            self._timer = self.loop.call_later(delay, fn)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _cut(self) -> None:
            self._timer = None
            if self.transport is None or self.transport.is_closing():
                return
            cycle = self.cycle
            if self._in_request and (cycle is None or not cycle.response_started or cycle.response_complete):
                self.transport.write(timeout_response())
            self.transport.close()

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to bytes that are not HTTP (a bad request line, chunk size or content-length), in
            the service's error shape rather than its text/plain one."""
            self._disarm()
            self.transport.write(raw_error(400, "Bad Request", "INVALID_ARGUMENT", f"not a valid HTTP request: {msg}"))
            self.transport.close()

        # ----------------------------------------------------------- the parser's steps

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm(timeouts.header_timeout_s, self._cut)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_request = True
            if self._timer is None:  # a keep-alive connection's next request: its headers get the same time
                self._arm(timeouts.header_timeout_s, self._cut)

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()
            if self.parser is not None and not self.cycle.response_complete:
                self._body_started, self._body_bytes = time.monotonic(), 0
                self._arm(timeouts.body_timeout_s, self._check_body)

        def on_body(self, body: bytes) -> None:
            self._body_bytes += len(body)
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._disarm()
            self._in_request = False
            super().on_message_complete()

        def _check_body(self) -> None:
            self._timer = None
            if self.cycle is None or not self.cycle.more_body:
                return
            if self.flow is not None and self.flow.read_paused:  # we stopped reading, not the client
                self._arm(1.0, self._check_body)
                return
            elapsed = time.monotonic() - self._body_started
            if self._body_bytes < timeouts.body_min_rate * elapsed:
                self._cut()
            else:
                self._arm(1.0, self._check_body)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._send_timer is not None:
                self._send_timer.cancel()
                self._send_timer = None
            super().connection_lost(exc)

        # ----------------------------------------------------------- writing

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._send_timer is None:
                self._send_timer = self.loop.call_later(timeouts.send_timeout_s, self._stalled)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._send_timer is not None:
                self._send_timer.cancel()
                self._send_timer = None

        def _stalled(self) -> None:
            self._send_timer = None
            if self.transport is not None and not self.transport.is_closing():
                self.transport.abort()  # the client reads nothing: what is buffered for it is dropped

    return GuardedHttpProtocol
