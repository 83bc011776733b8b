"""The service's errors: what a request or a backend can cause. Each front door maps each class to one status
code in one function (``retrieval.serving.core.status_for``, for both doors), so messages must name the bad value
and say what is allowed."""

from __future__ import annotations

from index_builder.errors import HybridRagError


class InvalidRequest(HybridRagError, ValueError):
    """The caller sent something we cannot serve (bad query, out-of-range option, malformed filter)."""


class Unauthenticated(HybridRagError):
    """No API key, or an unknown one (UNAUTHENTICATED)."""


class PermissionDenied(HybridRagError):
    """The key may not read or write that tenant's data, or that id (PERMISSION_DENIED)."""


class IndexNotReady(HybridRagError):
    """No index is loaded yet (the service answers UNAVAILABLE)."""


class Overloaded(HybridRagError):
    """Admission control refused the request (RESOURCE_EXHAUSTED)."""


class DeadlineExceeded(HybridRagError):
    """The request's deadline passed before it could start (DEADLINE_EXCEEDED)."""


class BackendError(HybridRagError):
    """A downstream backend (generation server, model runtime) failed."""


class BackendUnavailable(BackendError):
    """A backend cannot be reached, refused the connection, or answered 5xx/429 (UNAVAILABLE)."""


class BackendTimeout(BackendError):
    """A backend accepted the request but sent nothing within the read timeout (DEADLINE_EXCEEDED)."""
