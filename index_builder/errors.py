"""The project's error hierarchy.

The offline layer's errors (corpus, snapshot, model, configuration) and the base class of every error this
project raises on purpose; the service's request and backend errors live in ``retrieval/errors.py``.
"""

from __future__ import annotations


class HybridRagError(Exception):
    """Base class of every error this project raises on purpose."""


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
