"""The result cache shared by every replica, in Redis: exact-match and semantic, keyed by index generation and
write version, with TTLs.

Keys (``ns`` = ``cache.redis_namespace``; ``G`` = the index generation, ``V`` = the write version; ``S``, ``Q``
= BLAKE2b of the request's scope and of the query text):

- ``ns:v``: the write version. Every acknowledged write anywhere ``INCR``s it (:meth:`SharedCache.bump`), so
  every entry of every replica is unreachable at once: invalidation is by key, nothing is scanned or deleted
  (old entries die by TTL). Coarser than the in-process cache's per-document invalidation, and exact: a new
  document that should enter a cached result also invalidates it.
- ``ns:r:G:V:S:Q``: one result (JSON: hit arrays, stage lists, the documents and passages the hits need; never
  pickle, so whoever can write to Redis cannot run code in a replica), ``EX ttl_s``. An exact repeat is one
  ``GET`` of it, before the query is embedded.
- ``ns:s:G:V:S``: a stream of (result key, query text, float32 vector) per scope, ``EXPIRE ttl_s``. The vector
  lookup stays in each replica: it keeps the scope's vectors as one matrix and, per lookup, reads only the
  stream entries added since its last read (``XRANGE`` from the last id: one round trip, usually empty), then
  takes the cosine locally and ``GET``s the best entry's result. The alternative, a vector collection in the
  engine, costs a vector search round trip on every lookup; both were measured (docs/results/scale-out.md).

Ordering: :meth:`epoch` (the version) is read before the index is; :meth:`put` refuses a result whose version
moved meanwhile, and lookups read only the version they were given. Redis errors never fail a request: the
cache misses and says so in ``stats()["errors"]``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from index_builder.types import Document, Hits
from retrieval.search.semantic_cache import CacheHit, SemanticCacheConfig, same_meaning_markers

log = logging.getLogger(__name__)

MAX_STREAM = 10_000  # entries per scope stream (XADD MAXLEN ~)


def _h(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def result_to_dict(result: Any) -> dict[str, Any]:
    """A detached :class:`~retrieval.search.pipeline.SearchResult` as plain JSON types."""
    view = result.index

    def hits(h: Hits) -> list:
        return [h.doc.tolist(), h.scores.astype(float).tolist(), h.chunk.tolist()]

    docs = {str(d): {"id": doc.id, "title": doc.title, "tenant": doc.tenant, "metadata": doc.metadata}
            for d, doc in view.documents.items()}
    return {"hits": hits(result.hits), "stages": {k: hits(v) for k, v in result.stages.items()},
            "timings_ms": result.timings_ms, "skipped": result.skipped, "degraded": result.degraded,
            "generation": result.generation, "docs": docs, "passages": {str(c): t for c, t in view.passages.items()}}


@dataclass
class CachedView:
    """The documents and passages of one cached result (what :class:`~retrieval.search.pipeline.ResultView` holds)."""

    documents: dict[int, Document]
    passages: dict[int, str]
    generation: int

    def passage(self, chunk: int) -> str:
        return self.passages[chunk]


def result_from_dict(o: dict[str, Any]) -> Any:
    from retrieval.search.pipeline import SearchResult  # the pipeline imports this module

    def hits(v: list) -> Hits:
        return Hits(np.asarray(v[0], dtype=np.int64), np.asarray(v[1], dtype=np.float32),
                    np.asarray(v[2], dtype=np.int64))

    docs = {int(d): Document(id=x["id"], text="", title=x["title"], tenant=x["tenant"], metadata=x["metadata"])
            for d, x in o["docs"].items()}
    view = CachedView(docs, {int(c): t for c, t in o["passages"].items()}, int(o["generation"]))
    return SearchResult(hits=hits(o["hits"]), stages={k: hits(v) for k, v in o["stages"].items()},
                        timings_ms=o["timings_ms"], skipped=o["skipped"], degraded=o["degraded"],
                        generation=int(o["generation"]), index=view)


# Value kinds besides search results (Generate registers its cached answers): kind -> (type, to dict, from dict).
_CODECS: dict[str, tuple[type, Callable[[Any], dict], Callable[[dict], Any]]] = {}


def register_codec(kind: str, cls: type, to_dict: Callable[[Any], dict], from_dict: Callable[[dict], Any]) -> None:
    """Let values of ``cls`` be cached in Redis as JSON (``to_dict`` / ``from_dict``: plain JSON types)."""
    _CODECS[kind] = (cls, to_dict, from_dict)


def encode_value(value: Any) -> bytes:
    for kind, (cls, to_dict, _) in _CODECS.items():
        if isinstance(value, cls):
            return json.dumps({"kind": kind, "value": to_dict(value)}).encode()
    return json.dumps({"kind": "result", "value": result_to_dict(value)}).encode()


def decode_value(data: bytes) -> Any:
    o = json.loads(data)
    if o["kind"] == "result":
        return result_from_dict(o["value"])
    return _CODECS[o["kind"]][2](o["value"])


@dataclass
class _Local:
    """One scope's vectors as this replica has read them from its stream."""

    last_id: str = "-"
    keys: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)
    matrix: np.ndarray | None = None


class SharedCache:
    """The pipeline's cache interface (as :class:`~retrieval.search.semantic_cache.SemanticCache`) over Redis."""

    shared = True

    def __init__(self, config: SemanticCacheConfig, client: Any = None) -> None:
        import redis

        self.config = config
        self.ns = config.redis_namespace
        self.redis: Any = client or redis.Redis.from_url(config.redis_url, socket_timeout=config.redis_timeout_s,
                                                    socket_connect_timeout=config.redis_timeout_s)
        self._local: dict[str, _Local] = {}  # stream key -> this replica's copy, for ``_current`` only
        self._current: tuple[int, int] | None = None  # the (generation, version) ``_local`` holds
        self._lock = threading.Lock()
        self.counts = {"hits": 0, "exact_hits": 0, "misses": 0, "refused_stale": 0, "guarded": 0, "errors": 0,
                       "puts": 0}

    def __len__(self) -> int:
        return sum(len(s.keys) for s in self._local.values())

    def stats(self) -> dict[str, float]:
        with self._lock:
            looked = self.counts["hits"] + self.counts["misses"]
            return {**self.counts, "entries": len(self), "hit_ratio": self.counts["hits"] / looked if looked else 0.0}

    def _count(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1

    def _error(self, what: str, e: Exception) -> None:
        self._count("errors")
        log.warning("shared cache: %s failed (%s); treated as a miss", what, e)

    # ------------------------------------------------------------------ versions

    def epoch(self) -> int:
        """The write version (take before reading the index; pass to :meth:`lookup` and :meth:`put`)."""
        try:
            v = self.redis.get(f"{self.ns}:v")
            return int(v) if v is not None else 0
        except Exception as e:  # noqa: BLE001 -- the cache must not fail a request
            self._error("reading the version", e)
            return -1  # no entry is read or written under -1

    def bump(self) -> int:
        """A write was acknowledged: move every replica to a new version. Returns it (the write's sequence)."""
        return int(self.redis.incr(f"{self.ns}:v"))

    def invalidate_docs(self, doc_ids: Iterable[str]) -> int:
        """What the live index calls after a write: the version moves (every entry, every replica)."""
        try:
            self.bump()
        except Exception as e:  # noqa: BLE001
            self._error("bumping the version", e)
        return 0

    # ------------------------------------------------------------------ lookups and inserts

    def _keys(self, scope: Hashable, generation: int, version: int, text: str | None) -> tuple[str, str]:
        s = _h(repr(scope))
        stream = f"{self.ns}:s:{generation}:{version}:{s}"
        return stream, (f"{self.ns}:r:{generation}:{version}:{s}:{_h(text)}" if text is not None else "")

    def lookup_exact(self, scope: Hashable, generation: int, text: str, epoch: int) -> CacheHit | None:
        """The cached result of exactly this query (no embedding needed), or None."""
        if epoch < 0:
            return None
        _, key = self._keys(scope, generation, epoch, text)
        try:
            data = self.redis.get(key)
            value = None if data is None else decode_value(data)
        except Exception as e:  # noqa: BLE001 -- Redis down, or an entry this version cannot read: a miss
            self._error("an exact lookup", e)
            return None
        if value is None:
            return None
        self._count("hits")
        self._count("exact_hits")
        return CacheHit(value, 1.0, text)

    def lookup(self, scope: Hashable, generation: int, vector: np.ndarray, text: str,
               epoch: int | None = None) -> CacheHit | None:
        """The most similar cached query of ``scope`` at ``epoch`` at or above the threshold (and passing the
        guard), or None."""
        version = self.epoch() if epoch is None else epoch
        if version < 0:
            self._count("misses")
            return None
        stream, _ = self._keys(scope, generation, version, None)
        try:
            local = self._sync(stream, generation, version)
            if not local.keys:
                self._count("misses")
                return None
            assert local.matrix is not None
            sims = local.matrix @ np.asarray(vector, dtype=np.float32)
            for i in np.argsort(-sims):
                if float(sims[i]) < self.config.threshold:
                    break
                cached = local.texts[int(i)]
                if self.config.guard and cached != text and not same_meaning_markers(text, cached):
                    self._count("guarded")
                    continue
                data = self.redis.get(local.keys[int(i)])
                if data is None:  # expired
                    continue
                self._count("hits")
                return CacheHit(decode_value(data), float(sims[i]), cached)
        except Exception as e:  # noqa: BLE001
            self._error("a semantic lookup", e)
        self._count("misses")
        return None

    def _sync(self, stream: str, generation: int, version: int) -> _Local:
        """Read the stream entries added since this replica's last read; drop other versions' local copies."""
        with self._lock:
            if self._current != (generation, version):  # another version's streams are unreachable now
                self._local.clear()
                self._current = (generation, version)
            local = self._local.setdefault(stream, _Local())
            start = local.last_id
        entries = self.redis.xrange(stream, min="-" if start == "-" else f"({start}", count=MAX_STREAM)
        if entries:
            with self._lock:
                for entry_id, fields in entries:
                    local.keys.append(fields[b"k"].decode())
                    local.texts.append(fields[b"t"].decode("utf-8", "surrogatepass"))
                    local.rows.append(np.frombuffer(fields[b"v"], dtype=np.float32))
                    local.last_id = entry_id.decode()
                del local.keys[:-MAX_STREAM], local.texts[:-MAX_STREAM], local.rows[:-MAX_STREAM]
                local.matrix = np.stack(local.rows)
        return local

    def put(self, scope: Hashable, generation: int, vector: np.ndarray, text: str, value: Any, doc_ids: Iterable[str],
            since: int | None = None, nbytes: int = 0) -> bool:
        """Cache ``value`` under version ``since`` (refused when a write moved the version meanwhile)."""
        if since is None or since < 0:
            return False
        try:
            if self.epoch() != since:
                self._count("refused_stale")
                return False
            stream, key = self._keys(scope, generation, since, text)
            ttl = max(1, int(self.config.ttl_s))
            data = encode_value(value)
            if len(data) > self.config.max_bytes:
                return False
            pipe = self.redis.pipeline(transaction=False)
            pipe.set(key, data, ex=ttl)
            pipe.xadd(stream, {"k": key, "t": text.encode("utf-8", "surrogatepass"),
                               "v": np.asarray(vector, dtype=np.float32).reshape(-1).tobytes()},
                      maxlen=MAX_STREAM, approximate=True)
            pipe.expire(stream, ttl)
            pipe.execute()
            self._count("puts")
            return True
        except Exception as e:  # noqa: BLE001
            self._error("a put", e)
            return False

    def clear(self) -> None:
        with self._lock:
            self._local.clear()
