"""The HTTP door's one error mapping: our error -> its gRPC code (:func:`~retrieval.serving.status.status_for`, the
gRPC door's) -> one HTTP status (:data:`HTTP_STATUS`), with the gRPC door's message, as
``{"error": {"code", "status", "message", "type"}, "request_id"}``; and the refusals only HTTP has (a body too
large, not JSON), which carry a status of their own."""

from __future__ import annotations

import uuid
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from retrieval.errors import InvalidRequest
from retrieval.serving.status import caller_message, status_for

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


def add_error_handlers(app: FastAPI) -> None:
    """FastAPI's own refusals (an unknown path, a wrong method, a request it could not validate) in the service's
    error shape."""

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
