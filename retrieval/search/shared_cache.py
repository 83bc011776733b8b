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

Whatever is read from Redis is checked before it is served (whoever can write to Redis can write anything, and
another index sharing the Redis writes well-formed entries about other documents): a value must decode to
exactly what :func:`encode_value` writes, every type and shape checked (:func:`decode_value`), and pass the
caller's ``check`` (the pipeline's and Generate's: :func:`retrieval.search.cache_check.check_result`, the documents
it names are the serving generation's, of the request's tenant and filter); a stream entry must name a result
key of its own scope and hold a unit vector of the query's length. Anything else is a miss, counted in
``stats()["invalid"]`` with one warning line, and the entry is deleted; never an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from index_builder.types import Document, Hits
from retrieval.search.cache_check import InvalidEntry, expect
from retrieval.search.request import STAGES
from retrieval.search.results import SearchResult
from retrieval.search.semantic_cache import CacheHit, SemanticCacheConfig, same_meaning_markers

log = logging.getLogger(__name__)

MAX_STREAM = 10_000  # entries per scope stream (XADD MAXLEN ~)
Check = Callable[[Any], None]  # raises InvalidEntry for a decoded value the caller cannot serve


def _h(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def result_to_dict(result: Any) -> dict[str, Any]:
    """A detached :class:`~retrieval.search.results.SearchResult` as plain JSON types."""
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
    """The documents and passages of one cached result (what :class:`~retrieval.search.results.ResultView` holds)."""

    documents: dict[int, Document]
    passages: dict[int, str]
    generation: int

    def passage(self, chunk: int) -> str:
        return self.passages[chunk]


_STAGE_NAMES = frozenset((*STAGES, "fused"))  # the stages a result may name
_DOC_FIELDS = frozenset({"id", "title", "tenant", "metadata"})


def _dict(o: Any, what: str) -> dict:
    expect(type(o) is dict, f"{what} is not an object")
    return o


def _str(o: Any, what: str) -> str:
    expect(type(o) is str, f"{what} is not a string")
    return o


def _int(o: Any, what: str) -> int:
    expect(type(o) is int and 0 <= o < 2**63, f"{what} is not an integer >= 0")
    return o


def _number(o: Any, what: str) -> float:
    expect(type(o) in (int, float) and math.isfinite(o), f"{what} is not a finite number")
    return float(o)


def _number_key(k: str, what: str) -> int:
    """A JSON object key that is a document or chunk number, written as ``str(int)`` writes it."""
    if not (k.isascii() and k.isdigit() and (k == "0" or k[0] != "0") and len(k) < 20):
        raise InvalidEntry(f"{what} key {k[:40]!r} is not a number")
    return int(k)


def _ints(v: list, low: int) -> np.ndarray | None:
    """``v`` as int64 when it holds only integers in [low, 2**63) (JSON booleans pass as 0 and 1), else None."""
    if not v:
        return np.empty(0, np.int64)
    try:
        a = np.asarray(v)
    except (ValueError, OverflowError):  # ragged, or an integer past 2**64
        return None
    if a.ndim != 1 or a.dtype.kind not in "iub" or int(a.min()) < low or (a.dtype.kind == "u" and int(a.max()) >= 2**63):
        return None
    return a.astype(np.int64)


def _hits(o: Any, what: str, low: int) -> Hits:
    """[docs, scores, chunks]: integers >= 0 (chunks >= ``low``) below 2**63, finite scores, one length."""
    expect(type(o) is list and len(o) == 3 and all(type(x) is list for x in o), f"{what} is not [docs, scores, chunks]")
    doc, scores, chunk = o
    expect(len(doc) == len(scores) == len(chunk), f"{what}: lists of different lengths")
    d, c = _ints(doc, 0), _ints(chunk, low)
    expect(d is not None, f"{what}: a document number is not an integer >= 0")
    expect(c is not None, f"{what}: a chunk number is not an integer >= {low}")
    try:
        sc = np.asarray(scores) if scores else np.empty(0, np.float64)
    except (ValueError, OverflowError):
        sc = np.empty(0, np.str_)
    expect(sc.ndim == 1 and sc.dtype.kind in "iuf" and bool(np.isfinite(sc).all()),
           f"{what}: a score is not a finite number")
    assert d is not None and c is not None
    return Hits(d, sc.astype(np.float32), c)


def _document(o: Any, key: str) -> Document:
    if type(o) is not dict or not _DOC_FIELDS <= o.keys():
        raise InvalidEntry(f"document {key} is not an object with {sorted(_DOC_FIELDS)}")
    doc_id, title, tenant, meta = o["id"], o["title"], o["tenant"], o["metadata"]
    if type(doc_id) is not str or type(title) is not str or type(tenant) is not str:
        raise InvalidEntry(f"document {key}'s id, title or tenant is not a string")
    if type(meta) is not dict or not all(type(v) is str for v in meta.values()):
        raise InvalidEntry(f"document {key}'s metadata is not an object of strings")
    return Document(id=doc_id, text="", title=title, tenant=tenant, metadata=meta)


def result_from_dict(o: Any) -> Any:
    """The :class:`~retrieval.search.results.SearchResult` that :func:`result_to_dict` wrote, every type and shape
    checked (:class:`InvalidEntry` otherwise): its hits name only documents and chunks it holds."""
    o = _dict(o, "the result")
    for name in ("hits", "stages", "timings_ms", "skipped", "degraded", "generation", "docs", "passages"):
        expect(name in o, f"the result has no {name!r}")
    hits = _hits(o["hits"], "hits", 0)
    stages = {}
    for k, v in _dict(o["stages"], "stages").items():
        expect(k in _STAGE_NAMES, f"unknown stage {k[:40]!r}")
        stages[k] = _hits(v, f"stage {k}", -1)
    timings = {k: _number(v, f"timing {k[:40]!r}") for k, v in _dict(o["timings_ms"], "timings_ms").items()}
    skipped = {}
    for k, v in _dict(o["skipped"], "skipped").items():
        expect(k in _STAGE_NAMES, f"unknown skipped stage {k[:40]!r}")
        skipped[k] = _str(v, f"the reason stage {k} was skipped")
    expect(type(o["degraded"]) is bool, "degraded is not a boolean")
    generation = _int(o["generation"], "generation")
    docs = {_number_key(k, "docs"): _document(v, k) for k, v in _dict(o["docs"], "docs").items()}
    passages = {_number_key(k, "passages"): v for k, v in _dict(o["passages"], "passages").items()}
    expect(all(type(v) is str for v in passages.values()), "a passage is not a string")
    doc_list, chunk_list = hits.doc.tolist(), hits.chunk.tolist()
    expect(len(set(doc_list)) == len(doc_list), "a document is hit twice")
    expect(set(docs) == set(doc_list), "docs are not exactly the hits' documents")
    expect(set(passages) == set(chunk_list), "passages are not exactly the hits' chunks")
    view = CachedView(docs, passages, generation)
    return SearchResult(hits=hits, stages=stages, timings_ms=timings, skipped=skipped, degraded=o["degraded"],
                        generation=generation, index=view)


# Value kinds besides search results (Generate registers its cached answers): kind -> (type, to dict, from dict).
_CODECS: dict[str, tuple[type, Callable[[Any], dict], Callable[[Any], Any]]] = {}


def register_codec(kind: str, cls: type, to_dict: Callable[[Any], dict], from_dict: Callable[[Any], Any]) -> None:
    """Let values of ``cls`` be cached in Redis as JSON (``to_dict`` / ``from_dict``: plain JSON types).
    ``from_dict`` reads what anyone may have written: it checks every type and shape and raises
    :class:`InvalidEntry` (a ValueError, TypeError or KeyError counts the same) on anything else."""
    _CODECS[kind] = (cls, to_dict, from_dict)


def encode_value(value: Any) -> bytes:
    for kind, (cls, to_dict, _) in _CODECS.items():
        if isinstance(value, cls):
            return json.dumps({"kind": kind, "value": to_dict(value)}).encode()
    return json.dumps({"kind": "result", "value": result_to_dict(value)}).encode()


def decode_value(data: bytes) -> Any:
    """The value :func:`encode_value` wrote; :class:`InvalidEntry` for anything else (not JSON, a kind not
    registered here, wrong types or shapes)."""
    try:
        o = json.loads(data)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise InvalidEntry(f"not JSON ({str(e)[:80]})") from None
    o = _dict(o, "the entry")
    kind = o.get("kind")
    if not isinstance(kind, str):
        raise InvalidEntry("the entry has no kind")
    expect("value" in o, "the entry has no value")
    if kind == "result":
        from_dict: Callable[[Any], Any] = result_from_dict
    else:
        expect(kind in _CODECS, f"kind {kind[:40]!r} is not registered")
        from_dict = _CODECS[kind][2]
    try:
        return from_dict(o["value"])
    except InvalidEntry:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as e:
        raise InvalidEntry(f"a {kind[:40]} that does not decode ({type(e).__name__}: {str(e)[:80]})") from None


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
        # invalid: entries (results, answers, stream entries) that did not decode or that the caller's check
        # refused (retrieval.search.cache_check): each was a miss, logged once and deleted
        self.counts = {"hits": 0, "exact_hits": 0, "misses": 0, "refused_stale": 0, "guarded": 0, "errors": 0,
                       "invalid": 0, "puts": 0}

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

    def lookup_exact(self, scope: Hashable, generation: int, text: str, epoch: int,
                     check: Check | None = None) -> CacheHit | None:
        """The cached result of exactly this query (no embedding needed), or None. ``check``: raises
        :class:`InvalidEntry` for a decoded value the caller cannot serve (:meth:`_read`)."""
        if epoch < 0:
            return None
        _, key = self._keys(scope, generation, epoch, text)
        try:
            value = self._read(key, check)
        except Exception as e:  # noqa: BLE001 -- Redis down: a miss
            self._error("an exact lookup", e)
            return None
        if value is None:
            return None
        self._count("hits")
        self._count("exact_hits")
        return CacheHit(value, 1.0, text)

    def lookup(self, scope: Hashable, generation: int, vector: np.ndarray, text: str,
               epoch: int | None = None, check: Check | None = None) -> CacheHit | None:
        """The most similar cached query of ``scope`` at ``epoch`` at or above the threshold (and passing the
        guard and ``check``), or None."""
        version = self.epoch() if epoch is None else epoch
        if version < 0:
            self._count("misses")
            return None
        stream, _ = self._keys(scope, generation, version, None)
        try:
            vector = np.asarray(vector, dtype=np.float32).reshape(-1)
            local = self._sync(stream, generation, version, len(vector))
            if not local.keys:
                self._count("misses")
                return None
            assert local.matrix is not None
            sims = local.matrix @ vector
            for i in np.argsort(-sims):
                if float(sims[i]) < self.config.threshold:
                    break
                cached = local.texts[int(i)]
                if self.config.guard and cached != text and not same_meaning_markers(text, cached):
                    self._count("guarded")
                    continue
                value = self._read(local.keys[int(i)], check)
                if value is None:  # expired, or invalid (counted)
                    continue
                self._count("hits")
                return CacheHit(value, float(sims[i]), cached)
        except Exception as e:  # noqa: BLE001
            self._error("a semantic lookup", e)
        self._count("misses")
        return None

    def _read(self, key: str, check: Check | None) -> Any:
        """The value under ``key``, decoded and checked; None when there is none, or when it is invalid: not what
        :func:`encode_value` writes, or refused by ``check`` (which raises :class:`InvalidEntry`). An invalid
        entry is counted (``stats()["invalid"]``), logged in one warning line and deleted, so that neither this
        replica nor another reads it again (a replica that computes the result anew writes the key again).
        Redis errors, and any other exception of ``check``, propagate (the callers count them as errors)."""
        data = self.redis.get(key)
        if data is None:
            return None
        try:
            if len(data) > self.config.max_bytes:
                raise InvalidEntry(f"{len(data)} bytes, over cache.max_bytes")
            value = decode_value(data)
            if check is not None:
                check(value)
            return value
        except InvalidEntry as e:
            self._invalid(f"entry {key[:200]}", e)
            try:
                self.redis.delete(key)
            except Exception as d:  # noqa: BLE001 -- it stays a miss; it will expire
                log.debug("shared cache: deleting the invalid entry %s failed (%s)", key[:200], d)
            return None

    def _invalid(self, what: str, e: Exception) -> None:
        self._count("invalid")
        log.warning("shared cache: invalid %s (%s); treated as a miss", what, str(e)[:300])

    def _sync(self, stream: str, generation: int, version: int, dim: int) -> _Local:
        """Read the stream entries added since this replica's last read; drop other versions' local copies. An
        entry is used only if it names the result key of its own text in the stream's own scope and holds a finite
        unit vector of ``dim`` float32; any other is skipped and counted invalid (the stream is Redis data too)."""
        with self._lock:
            if self._current != (generation, version):  # another version's streams are unreachable now
                self._local.clear()
                self._current = (generation, version)
            local = self._local.setdefault(stream, _Local())
            start = local.last_id
        entries = self.redis.xrange(stream, min="-" if start == "-" else f"({start}", count=MAX_STREAM)
        prefix = f"{self.ns}:r:{generation}:{version}:{stream.rsplit(':', 1)[1]}:"
        bad: list[tuple[str, Exception]] = []
        if entries:
            with self._lock:
                for entry_id, fields in entries:
                    local.last_id = entry_id.decode()
                    try:
                        key, text, row = self._stream_entry(fields, prefix, dim)
                    except (InvalidEntry, KeyError, TypeError, UnicodeDecodeError) as e:
                        bad.append((local.last_id, e))
                        continue
                    local.keys.append(key)
                    local.texts.append(text)
                    local.rows.append(row)
                del local.keys[:-MAX_STREAM], local.texts[:-MAX_STREAM], local.rows[:-MAX_STREAM]
                local.matrix = np.stack(local.rows) if local.rows else None
        for entry_id, why in bad:
            self._invalid(f"stream entry {entry_id} of {stream[:200]}", why if isinstance(why, InvalidEntry) else
                          InvalidEntry(f"{type(why).__name__}: {str(why)[:80]}"))
        return local

    @staticmethod
    def _stream_entry(fields: dict, prefix: str, dim: int) -> tuple[str, str, np.ndarray]:
        key = fields[b"k"].decode()
        expect(key.startswith(prefix) and len(key) == len(prefix) + 24, "a result key of another scope")
        text = fields[b"t"].decode("utf-8", "surrogatepass")
        expect(key == prefix + _h(text), "a result key of another query text")  # the guard reads this text
        raw = fields[b"v"]
        expect(len(raw) == 4 * dim, f"a vector of {len(raw)} bytes, not {dim} float32")
        row = np.frombuffer(raw, dtype=np.float32)
        expect(bool(np.isfinite(row).all()) and abs(float(row @ row) - 1.0) <= 1e-3, "not a finite unit vector")
        return key, text, row

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
