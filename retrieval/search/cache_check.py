"""What a result cache checks of a value it read from outside the process (the Redis-shared cache,
:mod:`retrieval.search.shared_cache`), before serving it: whoever can write to the cache's storage can write
anything there, and an entry of another index sharing it is well-formed but names other documents. A value that
fails a check is a miss (counted in the cache's ``stats()["invalid"]``), never an error.

Apart from :mod:`retrieval.search.shared_cache` so that the pipeline can import it (that module imports the
pipeline)."""

from __future__ import annotations

from typing import Any


class InvalidEntry(ValueError):
    """A cached value that is not what this replica would have written: malformed JSON, wrong types or shapes, a
    kind not registered, or (:func:`check_result`) documents the serving index does not hold as the entry says."""


def expect(ok: bool, what: str) -> None:
    """Raise :class:`InvalidEntry` saying ``what`` unless ``ok``."""
    if not ok:
        raise InvalidEntry(what)


def check_result(result: Any, index: Any, filter: Any, k: int) -> None:
    """Raise :class:`InvalidEntry` unless the decoded ``result`` (a
    :class:`~retrieval.search.results.SearchResult` over the documents and passages it carries) is one that
    ``index``, the generation serving the request, could have given a request of ``k`` results under ``filter``
    (a :class:`~retrieval.search.filters.Filter`): that generation, not degraded (degraded results are never
    cached), at most ``k`` hits, and each hit's document there under the same number with the same id, title,
    tenant and metadata, within the filter's tenant and metadata pairs, its chunk that document's (the view's
    ``chunk_doc``) and that chunk's text the cached passage.

    Costs a few microseconds per hit on the in-process views (list and array reads, a string compare); on an
    engine view (Qdrant) ``documents[d]`` and ``passage(c)`` read its payload cache, and the engine for what the
    replica has not seen."""
    if result.generation != index.generation:
        raise InvalidEntry(f"generation {result.generation}, the index serves {index.generation}")
    if result.degraded:
        raise InvalidEntry("a degraded result (such results are never cached)")
    if len(result.hits) > k:
        raise InvalidEntry(f"{len(result.hits)} hits for a request of {k}")
    view = result.index
    owners = index.chunk_doc  # in-process views: an array; an engine's reads the chunk's payload
    for d, c in zip(result.hits.doc.tolist(), result.hits.chunk.tolist(), strict=True):
        cached = view.documents[d]
        try:
            doc = index.documents[d] if d >= 0 else None
        except (IndexError, KeyError):
            doc = None
        if doc is None:
            raise InvalidEntry(f"document {d} is not in the index")
        if doc.id != cached.id:
            raise InvalidEntry(f"document {d} is {doc.id[:80]!r} in the index, {cached.id[:80]!r} in the entry")
        if doc.title != cached.title or doc.tenant != cached.tenant or doc.metadata != cached.metadata:
            raise InvalidEntry(f"document {doc.id[:80]!r} differs from the index's (title, tenant or metadata)")
        if filter.tenant and doc.tenant != filter.tenant:
            raise InvalidEntry(f"document {doc.id[:80]!r} is of tenant {doc.tenant!r}, the request's is "
                               f"{filter.tenant!r}")
        if not all(doc.metadata.get(key) == value for key, value in filter.metadata):
            raise InvalidEntry(f"document {doc.id[:80]!r} does not match the request's metadata filter")
        try:
            owner = int(owners[c]) if c >= 0 else None
        except (IndexError, KeyError):
            owner = None
        if owner != d:
            raise InvalidEntry(f"chunk {c} is not a chunk of document {doc.id[:80]!r}")
        try:
            text = index.passage(c) if c >= 0 else None
        except (IndexError, KeyError):
            text = None
        if text is None:
            raise InvalidEntry(f"chunk {c} is not in the index")
        if text != view.passage(c):
            raise InvalidEntry(f"chunk {c}'s text differs from the index's")
