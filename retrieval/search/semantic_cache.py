"""Semantic cache: a new query whose embedding is close enough to a cached query's reuses that query's result.

Entries live in scopes: a scope is everything besides the query text that changes the answer (tenant, filters,
request options; for Generate also the generation settings), so a hit can only come from a query asked under the
same conditions. Within a scope the query embeddings (unit vectors, so cosine = dot product) form one matrix; a
lookup is one matrix-vector product. An entry is valid only for the index generation that produced it: when the
served generation changes, older entries are dropped at their next lookup. Writes invalidate every entry whose
result contains a written document (``invalidate_docs``). A write that adds a new document a cached query would
now find does not invalidate: such an entry serves the older list until its TTL or the next generation.
A result computed from a view older than a write that touched one of its documents is never cached: callers take
:meth:`epoch` before they read the index and pass it to :meth:`put`, which refuses the entry if one of its
documents was invalidated after that epoch.

Embeddings are blind to the words that flip a claim: "X increases Y" and "X decreases Y" have a cosine of 0.99
with all-MiniLM-L6-v2, while honest paraphrases often sit at 0.90-0.95 (bench/querylog). So a candidate above the
threshold must also pass :func:`same_meaning_markers`: the same numbers, the same negation polarity and as many
"up" and "down" direction words (increase/decrease, higher/lower, ...). This refuses most near-misses at the cost of a few
paraphrases (those that swap the sides of a comparison).

Thread-safe (the pipeline's loop, the gRPC loop and the live index's writer threads all call it).
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import Stemmer

from retrieval.search.settings import SemanticCacheConfig  # noqa: F401  (its section lives with the search settings)

_NEGATIONS = frozenset({"not", "no", "never", "none", "neither", "nor", "cannot", "without", "lack", "absent",
                        "absence", "fail", "unabl"})
_UP = frozenset({"increas", "rais", "rise", "elev", "higher", "high", "larger", "larg", "greater", "more", "enhanc",
                 "promot", "support", "stimul", "improv", "better", "gain", "overexpress", "upregul", "up",
                 "boost", "strengthen", "accel", "posit", "hot", "hotter", "warm", "warmer", "fast", "faster",
                 "longer", "bigger", "heavier", "stronger", "older", "earlier", "farther", "further", "most"})
_DOWN = frozenset({"decreas", "reduc", "lower", "low", "smaller", "small", "less", "fewer", "declin", "suppress",
                   "inhibit", "impair", "wors", "worsen", "poor", "poorer", "loss", "lose", "deplet", "downregul",
                   "down", "dampen", "diminish", "delay", "weaken", "slow", "block", "prevent", "attenu", "negat",
                   "drop", "fall", "cold", "colder", "cool", "cooler", "slower", "shorter", "lighter", "weaker",
                   "younger", "later", "closer", "nearer", "least"})
_STEM = Stemmer.Stemmer("english")
_WORDS = re.compile(r"[a-z]+|\d+(?:[.,]\d+)*")


def _markers(text: str) -> tuple[tuple[str, ...], int, int, int]:
    words = _WORDS.findall(text.lower())
    numbers = tuple(sorted(w.replace(",", "") for w in words if w[0].isdigit()))
    stems = _STEM.stemWords([w for w in words if not w[0].isdigit()])
    negations = sum(1 for w, st in zip([w for w in words if not w[0].isdigit()], stems, strict=True)
                    if st in _NEGATIONS or w.endswith("n't") or (w.startswith("non") and len(w) > 5))
    return numbers, negations % 2, sum(1 for st in stems if st in _UP), sum(1 for st in stems if st in _DOWN)


def same_meaning_markers(a: str, b: str) -> bool:
    """Whether two queries agree on numbers, negation polarity and direction (a cheap check that an embedding
    match is not a near-miss).

    >>> same_meaning_markers("A deficiency of vitamin B12 increases homocysteine.",
    ...                      "Vitamin B12 deficiency raises homocysteine levels.")
    True
    >>> same_meaning_markers("Autophagy declines in aged organisms.", "Autophagy increases in aged organisms.")
    False
    >>> same_meaning_markers("Spores can be disposed of easily.", "Spores cannot be disposed of easily.")
    False
    >>> same_meaning_markers("1,000 people are carriers.", "100,000 people are carriers.")
    False
    """
    return _markers(a) == _markers(b)


@dataclass
class _Entry:
    key: int
    scope: Hashable
    generation: int
    vector: np.ndarray
    text: str
    value: Any
    doc_ids: frozenset[str]
    expires: float
    nbytes: int = 0


@dataclass
class _Scope:
    keys: list[int] = field(default_factory=list)
    matrix: np.ndarray | None = None  # rows = entries' vectors, in ``keys`` order; None = rebuild at next lookup


@dataclass(frozen=True)
class CacheHit:
    value: Any
    similarity: float
    text: str  # the cached query that answered


class SemanticCache:
    shared = False  # this process's own objects (retrieval.search.pipeline.ResultCache)

    def __init__(self, config: SemanticCacheConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # LRU order: oldest first
        self._scopes: dict[Hashable, _Scope] = {}
        self._by_doc: dict[str, set[int]] = {}
        self._ids = itertools.count()
        self._epoch = 0  # bumped by every invalidation
        self._doc_epoch: dict[str, int] = {}  # document id -> epoch of its last invalidation
        self._floor = 0  # puts from before this epoch are refused (``_doc_epoch`` was cleared then)
        self._generation: int | None = None  # the newest generation seen
        self._bytes = 0  # the entries' nbytes, summed
        self._exact: dict[tuple[Hashable, str], int] = {}  # (scope, query text) -> key
        self.counts = {"hits": 0, "misses": 0, "evictions": 0, "expired": 0, "invalidated": 0, "stale_generation": 0,
                       "refused_stale": 0, "guarded": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict[str, float]:
        with self._lock:
            looked = self.counts["hits"] + self.counts["misses"]
            return {**self.counts, "entries": len(self._entries), "bytes": self._bytes,
                    "hit_ratio": self.counts["hits"] / looked if looked else 0.0}

    # ------------------------------------------------------------------ lookups and inserts

    def lookup_exact(self, scope: Hashable, generation: int, text: str, epoch: int | None = None,
                     check: Callable[[Any], None] | None = None) -> CacheHit | None:
        """The live entry of ``scope`` for exactly ``text`` (before the query is embedded), or None; a miss here
        is not counted (the semantic lookup that follows counts it). ``check``: unused here (the values are this
        process's own objects; the shared cache checks what it reads from Redis with it)."""
        with self._lock:
            self._see(generation)
            key = self._exact.get((scope, text))
            entry = self._entries.get(key) if key is not None else None
            if entry is None or entry.generation != generation or entry.expires <= self._clock():
                return None
            self._entries.move_to_end(entry.key)
            self.counts["hits"] += 1
            return CacheHit(entry.value, 1.0, entry.text)

    def lookup(self, scope: Hashable, generation: int, vector: np.ndarray, text: str,
               epoch: int | None = None, check: Callable[[Any], None] | None = None) -> CacheHit | None:
        """The most similar live entry of ``scope`` at or above the threshold (and passing the guard on ``text``),
        or None (a miss). ``epoch``: unused here (invalidation is eager, by document); ``check``: as in
        :meth:`lookup_exact`."""
        with self._lock:
            self._see(generation)
            s = self._scopes.get(scope)
            if s is not None:
                self._expire(s, generation)
            if s is None or not s.keys:
                self.counts["misses"] += 1
                return None
            if s.matrix is None:
                s.matrix = np.stack([self._entries[k].vector for k in s.keys])
            sims = s.matrix @ np.asarray(vector, dtype=np.float32)
            for i in np.argsort(-sims):
                if float(sims[i]) < self.config.threshold:
                    break
                entry = self._entries[s.keys[int(i)]]
                if self.config.guard and entry.text != text and not same_meaning_markers(text, entry.text):
                    self.counts["guarded"] += 1
                    continue
                self._entries.move_to_end(entry.key)
                self.counts["hits"] += 1
                return CacheHit(entry.value, float(sims[i]), entry.text)
            self.counts["misses"] += 1
            return None

    def epoch(self) -> int:
        """Take before reading the index; pass to :meth:`put`."""
        return self._epoch

    def put(self, scope: Hashable, generation: int, vector: np.ndarray, text: str, value: Any, doc_ids: Iterable[str],
            since: int | None = None, nbytes: int = 0) -> bool:
        """Cache ``value`` (the result of the query with embedding ``vector``) for ``generation``; False when a
        write touched one of ``doc_ids`` after epoch ``since`` (the value may be stale) and nothing was cached.
        ``nbytes``: the caller's estimate of what ``value`` and ``scope`` hold (counted against ``max_bytes``)."""
        v = np.asarray(vector, dtype=np.float32).reshape(-1)
        doc_ids = frozenset(doc_ids)
        with self._lock:
            if since is not None and (since < self._floor or any(self._doc_epoch.get(d, -1) > since for d in doc_ids)):
                self.counts["refused_stale"] += 1
                return False
            self._see(generation)
            s = self._scopes.setdefault(scope, _Scope())
            self._expire(s, generation)
            key = next(self._ids)
            size = int(nbytes) + v.nbytes + len(text) + 64 * (1 + len(doc_ids)) + 256
            if size > self.config.max_bytes:
                return False
            entry = _Entry(key, scope, generation, v.copy(), text, value, doc_ids,
                           self._clock() + self.config.ttl_s, size)
            self._entries[key] = entry
            self._exact[(scope, text)] = key
            self._bytes += size
            s.keys.append(key)
            s.matrix = None
            for d in entry.doc_ids:
                self._by_doc.setdefault(d, set()).add(key)
            while len(self._entries) > self.config.max_entries or self._bytes > self.config.max_bytes:
                self._remove(next(iter(self._entries)))
                self.counts["evictions"] += 1
            return True

    def invalidate_docs(self, doc_ids: Iterable[str]) -> int:
        """Drop every entry whose result holds one of ``doc_ids``; returns how many were dropped."""
        doc_ids = list(doc_ids)
        with self._lock:
            self._epoch += 1
            for d in doc_ids:
                self._doc_epoch[d] = self._epoch
            if len(self._doc_epoch) > 100_000:  # bound the memory: older in-flight puts are refused instead
                self._doc_epoch.clear()
                self._floor = self._epoch
            keys = set().union(*(self._by_doc.get(d, set()) for d in doc_ids))
            for k in keys:
                self._remove(k)
            self.counts["invalidated"] += len(keys)
            return len(keys)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._scopes.clear()
            self._by_doc.clear()
            self._exact.clear()
            self._bytes = 0

    # ------------------------------------------------------------------ internals (lock held)

    def _see(self, generation: int) -> None:
        """A newer generation is served: drop every older entry now, in every scope (cached results hold their
        index view, which would otherwise keep a replaced snapshot in memory)."""
        if self._generation is None or generation > self._generation:
            self._generation = generation
            for key in [k for k, e in self._entries.items() if e.generation < generation]:
                self._remove(key)
                self.counts["stale_generation"] += 1

    def _expire(self, s: _Scope, generation: int) -> None:
        now = self._clock()
        for k in list(s.keys):
            e = self._entries[k]
            if e.generation != generation:
                self._remove(k)
                self.counts["stale_generation"] += 1
            elif e.expires <= now:
                self._remove(k)
                self.counts["expired"] += 1

    def _remove(self, key: int) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._bytes -= entry.nbytes
        if self._exact.get((entry.scope, entry.text)) == key:
            del self._exact[(entry.scope, entry.text)]
        s = self._scopes[entry.scope]
        s.keys.remove(key)
        s.matrix = None
        if not s.keys:
            del self._scopes[entry.scope]
        for d in entry.doc_ids:
            keys = self._by_doc.get(d)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_doc[d]
