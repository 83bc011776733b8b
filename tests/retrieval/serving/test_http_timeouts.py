"""The slow-client timeouts' seam (retrieval/serving/http/timeouts.py) against a real uvicorn on loopback, with a
small ASGI app (no model): each test names what the seam relies on of uvicorn, so a uvicorn that changes it fails
here, by name, rather than in the door's slower tests (tests/retrieval/serving/test_http_hardening.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator

import uvicorn
from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.importer import import_from_string

from retrieval.serving.http import timeouts as seam
from retrieval.serving.http.timeouts import ConnectionTimeouts, server_config

FAST = ConnectionTimeouts(header_timeout_s=0.3, body_timeout_s=0.3, body_min_rate=1024, send_timeout_s=0.5)
SEEN: list[object] = []  # the connection each request's task found in its context


async def app(scope, receive, send) -> None:
    """``/stream`` answers a first chunk, then holds the answer open until the client goes; anything else reads its
    body and answers 200."""
    SEEN.append(seam._CONNECTION.get())
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    if scope["path"] == "/stream":
        await send({"type": "http.response.body", "body": b"first chunk\n", "more_body": True})
        while (await receive())["type"] != "http.disconnect":
            pass
        return
    await send({"type": "http.response.body", "body": b"ok"})


@contextlib.asynccontextmanager
async def serving(timeouts: ConnectionTimeouts = FAST) -> AsyncIterator[tuple[uvicorn.Server, int]]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.setblocking(False)
    server = uvicorn.Server(server_config(app, timeouts, log_level="warning", access_log=False, lifespan="off",
                                          loop="none", ws="none", timeout_keep_alive=5))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), task.result()
        await asyncio.sleep(0.01)
    try:
        yield server, sock.getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def read_until_closed(reader: asyncio.StreamReader, wait: float = 10.0) -> bytes:
    """What the server sent before it closed the connection (the test fails if it is still open after ``wait``; a
    reset after the answer, from bytes the client sent meanwhile, ends it too)."""
    got = b""
    async with asyncio.timeout(wait):
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while chunk := await reader.read(65536):
                got += chunk
    return got


def test_uvicorn_builds_the_wrapper_around_its_own_protocol_and_the_app_task_finds_its_connection():
    """Relied on: ``Config(http=cls)`` builds ``cls`` with its protocol's keyword arguments (handed on unread); the
    protocol uvicorn names ``httptools`` keeps the transport it is given (it registers itself among the server's
    connections, as the door's tests read them); a request's task is created while uvicorn handles the bytes, so
    it inherits the context the wrapper set (also a pipelined request, started from the previous one's task)."""
    async def run() -> None:
        SEEN.clear()
        async with serving() as (server, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            request = b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n"
            writer.write(request * 2)  # pipelined: the second starts from the first one's task
            await writer.drain()
            answers = b""
            while answers.count(b"HTTP/1.1 200") < 2:
                answers += await asyncio.wait_for(reader.read(65536), 10)
            inner = import_from_string(HTTP_PROTOCOLS[seam.INNER])
            assert [type(c) for c in server.server_state.connections] == [inner]
            writer.close()
        assert len(SEEN) == 2 and all(isinstance(c, seam.Answering) for c in SEEN) and SEEN[0] is SEEN[1]

    asyncio.run(run())


def test_slow_and_malformed_requests_are_cut_off_in_the_service_error_shape():
    """Nothing sent: closed silently; half a request line or a trickled body: 408; bytes that are not HTTP: a 400
    in the service's JSON shape (uvicorn's own is text/plain)."""
    async def run() -> None:
        async with serving() as (_, port):
            async def probe(data: bytes, trickle: bool = False) -> bytes:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(data)
                answer = asyncio.ensure_future(read_until_closed(reader))
                while trickle and not answer.done():  # 10 bytes a second: far below 1 KiB/s
                    await asyncio.wait({answer}, timeout=0.1)
                    with contextlib.suppress(OSError):
                        writer.write(b" ")
                got = await answer
                writer.close()
                return got

            idle, half, body, bad = await asyncio.gather(
                probe(b""), probe(b"POST /a HT"),
                probe(b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n{", trickle=True),
                probe(b"NOT HTTP AT ALL\r\n\r\n"))
        assert idle == b""
        assert half.startswith(b"HTTP/1.1 408") and body.startswith(b"HTTP/1.1 408")
        head, _, payload = bad.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head
        assert json.loads(payload)["error"]["status"] == "INVALID_ARGUMENT"

    asyncio.run(run())


def test_a_slow_request_behind_an_answer_in_flight_closes_without_a_408_in_that_answer():
    """Where the answer stands comes from the app's ASGI messages: a client that pipelines half a request behind a
    streamed answer is cut off at the header timeout, and no 408 is written into the middle of the stream."""
    async def run() -> None:
        async with serving() as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\nGET /a HT")
            await writer.drain()
            got = await read_until_closed(reader)
            writer.close()
        assert got.startswith(b"HTTP/1.1 200") and b"first chunk" in got and b"408" not in got

    asyncio.run(run())
