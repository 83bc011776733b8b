"""The door's plumbing, shared by its REST routes (:mod:`retrieval.serving.http.app`) and its OpenAI-compatible ones
(:mod:`retrieval.serving.http.openai`): the caller of a request (its key and its ``x-timeout-ms`` deadline), one
unary call through the core with cancellation on disconnect and deadline, and a Generate streamed as Server-Sent
Events from a bounded event feed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from fastapi import Request
from fastapi.responses import EventSourceResponse, JSONResponse, Response

from retrieval.api import retriever_pb2 as pb
from retrieval.errors import DeadlineExceeded, InvalidRequest
from retrieval.serving.core import Caller, CallerGone, ServiceCore
from retrieval.serving.http.body import read_body
from retrieval.serving.http.convert import parse_json, to_json
from retrieval.serving.http.errors import error_body, error_response
from retrieval.serving.status import status_for

log = logging.getLogger(__name__)
T = TypeVar("T")

TIMEOUT_HEADER = "x-timeout-ms"  # the caller's deadline, milliseconds from now (gRPC has its own)


def caller_of(request: Request) -> Caller:
    """The caller of an HTTP request: its key (``Authorization: Bearer`` or ``x-api-key``) and its deadline
    (``x-timeout-ms``, milliseconds from now)."""
    raw = request.headers.get(TIMEOUT_HEADER)
    timeout_s: float | None = None
    if raw is not None:
        try:
            timeout_s = float(raw) / 1000.0
        except ValueError:
            raise InvalidRequest(f"{TIMEOUT_HEADER} must be a number of milliseconds, got {raw!r}") from None
        if not timeout_s == timeout_s or timeout_s < 0:  # NaN or negative
            raise InvalidRequest(f"{TIMEOUT_HEADER} must be >= 0, got {raw!r}")
    return Caller.of(request.headers, timeout_s, "http")


async def until_disconnect(request: Request, work: Awaitable[T], caller: Caller | None = None) -> T:
    """Await ``work`` on its own task; if the client disconnects first, cancel it and raise :class:`CallerGone`
    (as a gRPC cancellation cancels the handler); if the caller's deadline passes first, cancel it and raise
    DeadlineExceeded (as gRPC does)."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    remaining = caller.remaining() if caller is not None else None
    try:
        done, _ = await asyncio.wait({task, watch}, timeout=None if remaining is None else max(0.0, remaining),
                                     return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    if watch in done:
        raise CallerGone("the client disconnected")
    raise DeadlineExceeded("the call's deadline passed")


class DisconnectAwareSSE(EventSourceResponse):
    """An SSE response that also listens for the client's disconnect while the stream is idle (Starlette notices a
    gone client only when a write fails, and a prompt can take seconds before the first token): on disconnect the
    body iterator is cancelled, which closes the answer and the backend stream."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        stream = asyncio.ensure_future(self.stream_response(send))
        watch = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait({stream, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (stream, watch):
                t.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError, Exception):
                await stream


_END = object()


class EventFeed:
    """One Generate running on its own task (its span, its deadline, its admission slot), feeding a bounded queue:
    the HTTP handler reads the first event before it answers (so a refused request gets its own status code), then
    streams the rest. ``close()`` cancels the task: the answer and the backend stream end at once."""

    def __init__(self, core: ServiceCore, caller: Caller, request: pb.GenerateRequest, request_id: str,
                 method: str) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=256)
        self.task = asyncio.ensure_future(self._run(core, caller, request, request_id, method))

    async def _run(self, core: ServiceCore, caller: Caller, request: pb.GenerateRequest, request_id: str,
                   method: str) -> None:
        try:
            with core.call(method, request_id, "http") as span:
                events = core.generate(caller, request, request_id, span)
                remaining = caller.remaining()
                try:
                    async with asyncio.timeout(None if remaining is None else max(0.0, remaining)):
                        async for message in events:
                            await self.queue.put(message)
                except TimeoutError:
                    raise DeadlineExceeded("the call's deadline passed while answering") from None
                finally:
                    await events.aclose()
            await self.queue.put(_END)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001  (handed to the reader, which answers it)
            await self.queue.put(e)

    async def next(self) -> pb.GenerateResponse | BaseException | None:
        """The next event, the error that ended the answer, or None at its end."""
        item = await self.queue.get()
        return None if item is _END else item

    async def close(self) -> None:
        if not self.task.done():
            self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


def sse(event: str, data: Any) -> str:
    """One Server-Sent Event (``data`` as one line of JSON)."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n"


# ---------------------------------------------------------------------- the app


class HttpDoor:
    """The two ways a route calls the core: one unary call, or a Generate streamed as SSE."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core

    async def unary(self, request: Request, method: str, work: Callable[[Caller, str], Awaitable[Any]],
                    answer: Callable[[Any, str], dict[str, Any]] | None = None) -> Response:
        """One call of any route but a stream: the caller, the span and metrics (in the core), disconnect and
        deadline, the one error mapping; the answer as ``answer(result, request_id)`` (default: the proto
        message's JSON)."""
        request_id = uuid.uuid4().hex[:16]
        t0 = time.perf_counter()
        try:
            caller = caller_of(request)
            await read_body(request)  # now, before the disconnect watch reads the connection (cached for work)
            with self.core.call(method, request_id, "http"):
                result = await until_disconnect(request, work(caller, request_id), caller)
            body = to_json(result) if answer is None else answer(result, request_id)
        except CallerGone:
            log.info("%s %s cancelled by the client after %.1f ms", method, request_id,
                     (time.perf_counter() - t0) * 1000, extra={"request_id": request_id})
            return Response(status_code=499)
        except Exception as e:  # noqa: BLE001  (mapped in one place)
            if status_for(e) == grpc.StatusCode.INTERNAL:
                log.error("request %s failed", request_id, exc_info=e, extra={"request_id": request_id})
            return error_response(e, request_id)
        return JSONResponse(body, headers={"x-request-id": request_id})

    async def start_feed(self, request: Request, generate: pb.GenerateRequest, method: str,
                         request_id: str) -> tuple[EventFeed, pb.GenerateResponse]:
        """Start a Generate and wait for its first event (the passages): errors before it raise here, so the
        handler answers them with their status code."""
        caller = caller_of(request)
        feed = EventFeed(self.core, caller, generate, request_id, method)
        try:
            first = await until_disconnect(request, feed.next())
        except BaseException:
            await feed.close()
            raise
        if first is None or isinstance(first, BaseException):
            await feed.close()
            raise first if isinstance(first, BaseException) else InvalidRequest("the answer ended before it started")
        return feed, first

    async def generate(self, request: Request) -> Response:
        request_id = uuid.uuid4().hex[:16]
        try:
            generate = parse_json(await read_body(request), pb.GenerateRequest, "GenerateRequest")
            feed, first = await self.start_feed(request, generate, "Generate", request_id)
        except CallerGone:
            return Response(status_code=499)
        except Exception as e:  # noqa: BLE001
            return error_response(e, request_id)

        async def events() -> AsyncIterator[str]:
            item: Any = first
            try:
                while item is not None:
                    if isinstance(item, BaseException):
                        yield sse("error", error_body(item, request_id)[1])
                        return
                    kind = item.WhichOneof("event")
                    if kind == "passages":
                        yield sse("passages", to_json(item.passages))
                    elif kind == "token":
                        yield sse("token", {"text": item.token})
                    elif kind == "stats":
                        yield sse("stats", to_json(item.stats))
                    item = await feed.next()
                yield sse("done", {"request_id": request_id})
            finally:
                await feed.close()

        return DisconnectAwareSSE(events(), headers={"x-request-id": request_id, "cache-control": "no-cache",
                                                     "x-accel-buffering": "no"})


