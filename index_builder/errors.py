"""The project's error hierarchy.

Every error a user can cause is one of these; the gRPC layer maps each class to one status code in one
function, so messages must name the bad value and say what is allowed.
"""

from __future__ import annotations


class HybridRagError(Exception):
    """Base class of every error this project raises on purpose."""


class InvalidRequest(HybridRagError, ValueError):
    """The caller sent something we cannot serve (bad query, out-of-range option, malformed filter)."""


class CorpusError(HybridRagError, ValueError):
    """A corpus file is missing or malformed; the message names the file and the line."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)
        self.path = path
        self.line = line


class SnapshotError(HybridRagError):
    """A snapshot folder is missing, incomplete, corrupt, or was built with other settings or models."""


class ModelError(HybridRagError):
    """A model folder or id cannot be resolved or loaded."""


class ConfigError(HybridRagError, ValueError):
    """A configuration file or override is invalid."""


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
