"""What the HTTP door's routes share (:mod:`retrieval.serving.http` for REST, :mod:`retrieval.serving.openai_api` for
the OpenAI-compatible ones): the one error mapping, proto <-> JSON, the caller of a request, cancellation on
disconnect and deadline, the Generate event feed behind both streaming routes."""

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
import numpy as np
from fastapi import Request
from fastapi.responses import EventSourceResponse, JSONResponse, Response
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from pydantic import BaseModel, ValidationError

from retrieval.api import retriever_pb2 as pb
from retrieval.errors import DeadlineExceeded, InvalidRequest
from retrieval.serving.core import Caller, CallerGone, ServiceCore, caller_message, status_for
from retrieval.serving.http_json import load_json

log = logging.getLogger(__name__)
T = TypeVar("T")

TIMEOUT_HEADER = "x-timeout-ms"

# One HTTP status per gRPC code (Google's HTTP mapping, but for FAILED_PRECONDITION: the core raises it only when a
# backend refused a request, a server-side fault: 502). CANCELLED: nginx's 499, only ever in logs and metrics.
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.FAILED_PRECONDITION: 502,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
ERROR_TYPE = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "invalid_request_error", 413: "invalid_request_error",
               415: "invalid_request_error", 429: "rate_limit_error"}


class TransportRefusal(InvalidRequest):
    """A request the HTTP door refuses for how it was sent, with an HTTP status of its own (INVALID_ARGUMENT in the
    metrics, as its gRPC twin would be)."""

    http_status = 400


class BodyTooLarge(TransportRefusal):
    """A request body over ``http.max_body_mb``."""

    http_status = 413


class UnsupportedMediaType(TransportRefusal):
    """A body that is not ``application/json`` in UTF-8."""

    http_status = 415


def error_body(exc: BaseException, request_id: str) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON error of one of our errors (the gRPC door's message; INTERNAL hides the detail)."""
    code = status_for(exc)
    status = exc.http_status if isinstance(exc, TransportRefusal) else HTTP_STATUS.get(code, 500)
    message = f"internal error (request id {request_id})" if code == grpc.StatusCode.INTERNAL else caller_message(str(exc))
    return status, {"error": {"code": status, "status": code.name, "message": message,
                              "type": ERROR_TYPE.get(status, "server_error" if status >= 500 else "error")},
                    "request_id": request_id}


def error_response(exc: BaseException, request_id: str) -> JSONResponse:
    status, body = error_body(exc, request_id)
    headers = {"x-request-id": request_id}
    if status == 401:
        headers["www-authenticate"] = 'Bearer realm="hybridrag"'
    if status == 429:
        headers["retry-after"] = "1"
    return JSONResponse(body, status_code=status, headers=headers)


# ---------------------------------------------------------------------- proto <-> JSON


OPAQUE_INT64 = frozenset({"chunk_id"})  # 63-bit hashes on an engine backend: past JSON's exact integers, kept strings


def _numbers(data: dict[str, Any], descriptor: Descriptor) -> dict[str, Any]:
    """int64 fields back to JSON numbers (proto3 JSON writes them as strings), but for :data:`OPAQUE_INT64`."""
    for f in descriptor.fields:
        if f.name not in data:
            continue
        value = data[f.name]
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            vf = f.message_type.fields_by_name["value"]
            if vf.message_type is not None:
                data[f.name] = {k: _numbers(v, vf.message_type) for k, v in value.items()}
        elif f.message_type is not None:
            if f.is_repeated:
                data[f.name] = [_numbers(v, f.message_type) for v in value]
            else:
                data[f.name] = _numbers(value, f.message_type)
        elif f.type in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64) and f.name not in OPAQUE_INT64:
            data[f.name] = [int(v) for v in value] if f.is_repeated else int(value)
    return data


def _f32(x: float) -> float:
    """A float32 field as json_format writes it (the shortest decimal that round-trips the float32): numpy's
    shortest repr, the same digits (checked on 42,000 values) at a fifth of the cost."""
    return float(str(np.float32(x)))


def retrieve_json(m: pb.RetrieveResponse) -> dict[str, Any]:
    """:func:`to_json` of a RetrieveResponse, written out: the hot path of the door (json_format walks the
    descriptors in Python, 0.6 ms for 10 passages; this is the same dict, as a test checks, in a fraction)."""
    return {
        "passages": [{"doc_id": p.doc_id, "chunk_id": str(p.chunk_id), "title": p.title, "text": p.text,
                      "score": _f32(p.score),
                      "stages": [{"stage": s.stage, "rank": s.rank, "score": _f32(s.score)} for s in p.stages],
                      "tenant": p.tenant, "metadata": dict(p.metadata),
                      "highlights": [{"start": h.start, "end": h.end, "text": h.text, "score": _f32(h.score)}
                                     for h in p.highlights], "truncated": p.truncated, "text_chars": p.text_chars}
                     for p in m.passages],
        "timings_ms": {k: _f32(v) for k, v in m.timings_ms.items()}, "stages_run": list(m.stages_run),
        "skipped": [{"stage": s.stage, "reason": s.reason} for s in m.skipped], "degraded": m.degraded,
        "index_generation": m.index_generation, "request_id": m.request_id, "cache_hit": m.cache_hit,
        "cache_similarity": _f32(m.cache_similarity)}


def to_json(message: Message) -> dict[str, Any]:
    """A proto message as JSON: proto3's mapping with the proto field names and every field present; 64-bit
    integers are numbers, but ``chunk_id`` (a string: it may exceed 2**53)."""
    if isinstance(message, pb.RetrieveResponse):
        return retrieve_json(message)
    return _numbers(json_format.MessageToDict(message, preserving_proto_field_name=True,
                                              always_print_fields_with_no_presence=True), message.DESCRIPTOR)


def parse_json(raw: bytes, message_cls: type[Message], what: str) -> Any:
    """The request body as ``message_cls``; a 400 that names the problem otherwise (empty body = all defaults)."""
    data = load_json(raw)
    return message_cls() if data is None else parse_dict(data, message_cls, what)


M = TypeVar("M", bound=BaseModel)


def parse_model(raw: bytes, model: type[M], what: str) -> M:
    """The request body as the pydantic ``model`` (the OpenAI-compatible routes), bounded like :func:`parse_json`; a
    400 that names the fields otherwise."""
    data = load_json(raw)
    if data is None:
        raise InvalidRequest(f"{what}: the body is empty")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        parts = []
        for err in e.errors(include_url=False)[:5]:
            where = ".".join(str(p) for p in err.get("loc", ()))
            parts.append(f"{where or 'body'}: {err.get('msg')}")
        raise InvalidRequest(f"{what}: " + "; ".join(parts)) from None


def _check_fields(data: Any, descriptor: Descriptor, where: str) -> None:
    """Unknown fields named with the proto names (json_format's own message lists the camelCase ones)."""
    if not isinstance(data, dict):
        raise InvalidRequest(f"{where} must be a JSON object, got {type(data).__name__}")
    known = {f.name: f for f in descriptor.fields} | {f.json_name: f for f in descriptor.fields}
    for key, value in data.items():
        f = known.get(key)
        if f is None:
            raise InvalidRequest(f"{where}: unknown field {key!r:.80}; known: {[f.name for f in descriptor.fields]}")
        if value is None:
            continue  # proto3 JSON: null is the field's default
        if f.message_type is None:
            _check_scalar(f, value, f"{where}.{f.name}")
        elif f.message_type.GetOptions().map_entry and not isinstance(value, dict):
            raise InvalidRequest(f"{where}.{f.name} must be an object of strings, got {_json_type(value)}")
        if f.message_type is not None and not f.message_type.GetOptions().map_entry:
            if f.is_repeated:
                if not isinstance(value, list):
                    raise InvalidRequest(f"{where}.{f.name} must be a list, got {type(value).__name__}")
                for i, item in enumerate(value):
                    _check_fields(item, f.message_type, f"{where}.{f.name}[{i}]")
            else:
                _check_fields(value, f.message_type, f"{where}.{f.name}")


_INTEGER_TYPES = frozenset({FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
                            FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64})


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number"}.get(type(value), type(value).__name__)


def _check_scalar(f: FieldDescriptor, value: Any, where: str) -> None:
    """A scalar (or repeated scalar) field's JSON type, said in JSON's words (json_format's messages are Python's:
    "int() argument must be a string ..."). proto3 JSON also takes integers as decimal strings."""
    if f.is_repeated:
        if not isinstance(value, list):
            raise InvalidRequest(f"{where} must be a list, got {_json_type(value)}")
        for i, item in enumerate(value):
            _check_scalar_value(f, item, f"{where}[{i}]")
    else:
        _check_scalar_value(f, value, where)


def _check_scalar_value(f: FieldDescriptor, value: Any, where: str) -> None:
    if f.type == FieldDescriptor.TYPE_STRING:
        ok, want = isinstance(value, str), "a string"
    elif f.type == FieldDescriptor.TYPE_BOOL:
        ok, want = isinstance(value, bool), "a boolean"
    elif f.type in _INTEGER_TYPES:
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()) or (
            isinstance(value, str) and value.lstrip("-").isascii() and value.lstrip("-").isdigit() and len(value) <= 20)
        want = "an integer"
    elif f.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        ok, want = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    else:
        return  # enums, bytes: json_format's own checks
    if not ok:
        got = _json_type(value) if not isinstance(value, str) else f"the string {value[:40]!r}"
        raise InvalidRequest(f"{where} must be {want}, got {got}")


def parse_dict(data: Any, message_cls: type[Message], what: str) -> Any:
    _check_fields(data, message_cls.DESCRIPTOR, what)
    try:
        return json_format.ParseDict(data, message_cls())
    except json_format.ParseError as e:
        raise InvalidRequest(f"{what}: {e}") from None


_SCALAR: dict[int, dict[str, Any]] = {
           FieldDescriptor.TYPE_STRING: {"type": "string"}, FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
           FieldDescriptor.TYPE_DOUBLE: {"type": "number"}, FieldDescriptor.TYPE_FLOAT: {"type": "number"},
           FieldDescriptor.TYPE_INT32: {"type": "integer", "format": "int32"},
           FieldDescriptor.TYPE_UINT32: {"type": "integer", "format": "int32", "minimum": 0},
           FieldDescriptor.TYPE_INT64: {"type": "integer", "format": "int64"},
           FieldDescriptor.TYPE_UINT64: {"type": "integer", "format": "int64", "minimum": 0},
           FieldDescriptor.TYPE_ENUM: {"type": "string"}, FieldDescriptor.TYPE_BYTES: {"type": "string"}}


def proto_schemas(*messages: Descriptor) -> dict[str, dict[str, Any]]:
    """JSON Schemas (OpenAPI 3.1 components) of proto messages and every message they hold, by message name:
    the REST bodies' contract, generated from ``proto/`` so it cannot drift."""
    out: dict[str, dict[str, Any]] = {}

    def field_schema(f: FieldDescriptor) -> dict[str, Any]:
        if f.message_type is not None:
            visit(f.message_type)
            return {"$ref": f"#/components/schemas/{f.message_type.name}"}
        return dict(_SCALAR[f.type])

    def visit(d: Descriptor) -> None:
        if d.name in out:
            return
        out[d.name] = {}  # placeholder: recursion stops here
        props: dict[str, Any] = {}
        for f in d.fields:
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                props[f.name] = {"type": "object",
                                 "additionalProperties": field_schema(f.message_type.fields_by_name["value"])}
            elif f.is_repeated:
                props[f.name] = {"type": "array", "items": field_schema(f)}
            else:
                props[f.name] = field_schema(f)
            if f.name in OPAQUE_INT64:
                props[f.name] = {"type": ["string", "integer"], "format": "int64",
                                 "description": "an opaque id (a string in answers: it may exceed 2**53)"}
        out[d.name] = {"type": "object", "properties": props, "additionalProperties": False}
        if d.oneofs:
            out[d.name]["description"] = "exactly one of: " + ", ".join(f.name for f in d.oneofs[0].fields)

    for m in messages:
        visit(m)
    return out


ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "status", "message", "type"], "properties": {
        "code": {"type": "integer"}, "status": {"type": "string"}, "message": {"type": "string"},
        "type": {"type": "string"}}},
        "request_id": {"type": "string"}}}
ERROR_STATUSES = {400: "the request is invalid (the message names the field)", 401: "no valid API key",
                  403: "the key may not do this, or a browser request from another origin",
                  408: "the request did not arrive in time", 413: "the body is over http.max_body_mb",
                  415: "the body is not application/json in UTF-8", 429: "overloaded: retry later",
                  503: "not ready, or a backend is unavailable", 504: "the deadline passed"}


def error_spec() -> dict[int | str, dict[str, Any]]:
    """The error answers every API route may give, in the service's error shape."""
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    return {status: {"description": what, "content": ref} for status, what in ERROR_STATUSES.items()}


def body_spec(name: str, required: bool = True) -> dict[str, Any]:
    return {"requestBody": {"required": required, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}}}


def model_spec(model: type[BaseModel]) -> dict[str, Any]:
    """The request body spec of a route that parses ``model`` itself (after authentication; the schema is added
    to the components by :func:`model_schemas`)."""
    return body_spec(model.__name__)


def model_schemas(*models: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """JSON Schemas of pydantic models (and the models they hold), by name, for the OpenAPI components."""
    out: dict[str, dict[str, Any]] = {}
    for m in models:
        schema = m.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[m.__name__] = schema
    return out


def ok_spec(name: str) -> dict[int | str, dict[str, Any]]:
    """A route's answers: ``name`` on 200, the service's errors otherwise."""
    return {200: {"description": "OK", "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}},
            **error_spec()}


# ---------------------------------------------------------------------- transport helpers


async def read_body(request: Request) -> bytes:
    try:
        return await request.body()
    except BodyTooLarge:
        raise
    except Exception as e:  # noqa: BLE001  (the client went away mid-body)
        raise InvalidRequest(f"could not read the request body: {e}") from None


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


