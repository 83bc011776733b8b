"""The one mapping from our errors (:mod:`retrieval.errors`) to status codes, gRPC's (the HTTP door maps those on:
:mod:`retrieval.serving.http.errors`), and an error's message as both doors send it."""

from __future__ import annotations

import grpc

from retrieval.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    DeadlineExceeded,
    IndexNotReady,
    InvalidRequest,
    Overloaded,
    PermissionDenied,
    Unauthenticated,
)

_STATUS: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (IndexNotReady, grpc.StatusCode.UNAVAILABLE),
    (DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (BackendTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (BackendUnavailable, grpc.StatusCode.UNAVAILABLE),
    (BackendError, grpc.StatusCode.FAILED_PRECONDITION),  # the backend refused the request (4xx): config or model
    (NotImplementedError, grpc.StatusCode.UNIMPLEMENTED),
)


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The one mapping from our errors to status codes (gRPC's; the HTTP door maps these on); anything else is a
    bug: INTERNAL."""
    for cls, code in _STATUS:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


MAX_MESSAGE_BYTES = 1000


def caller_message(message: str) -> str:
    """An error's message as both doors send it: cut to 1,000 bytes of UTF-8. gRPC percent-encodes non-ASCII
    details (up to 3x) and a client refuses trailing metadata over 8-16 KiB, so a message quoting a huge bad value
    would otherwise arrive as RESOURCE_EXHAUSTED ("metadata size exceeds hard limit") instead of its own code; over
    HTTP a 16 MiB wrong-typed value was sent back whole in the 400.

    >>> len(caller_message("x" * 5000).encode()), caller_message("ok")
    (1003, 'ok')
    """
    raw = message.encode("utf-8", "replace")
    if len(raw) <= MAX_MESSAGE_BYTES:
        return message
    return raw[:MAX_MESSAGE_BYTES].decode("utf-8", errors="ignore") + "..."
