"""The semantic cache with the real embedder: paraphrases hit, near-misses and other questions miss, and entries
die with their generation, their TTL, LRU eviction, or a write to one of their documents (through the live index)."""

from __future__ import annotations

import numpy as np
import pytest

from index_builder.models.token_encoders import EmbedderTokens
from index_builder.types import Document
from retrieval.live.live_index import LiveIndex
from retrieval.live.store import DocumentStore
from retrieval.search.filters import Filter
from retrieval.search.index import SearchIndex
from retrieval.search.pipeline import Pipeline
from retrieval.search.semantic_cache import SemanticCache, SemanticCacheConfig

ASKED = "How far does light travel in one year?"
PARAPHRASE = "How far does light go in a year?"
NEAR_MISS = "How far does light travel in one second?"  # same words, another question
FLIPPED = "Why is Venus colder than Mercury even though it is farther from the Sun?"
VENUS = "Why is Venus hotter than Mercury even though it is farther from the Sun?"


@pytest.fixture()
def cached_pipeline(sample_index, embedder, config):
    p = Pipeline(sample_index, embedder, config, cache=SemanticCache(config.cache))
    yield p
    p.close()


def _ids(result) -> list[str]:
    return result.doc_ids()


def test_a_paraphrase_hits_and_a_near_miss_misses(cached_pipeline):
    p = cached_pipeline
    first = p.search(ASKED, 5)
    assert not first.cache_hit and "cache" in first.timings_ms
    again = p.search(ASKED, 5)
    assert again.cache_hit and again.cache_similarity == pytest.approx(1.0, abs=1e-5)
    para = p.search(PARAPHRASE, 5)
    assert para.cache_hit and p.config.cache.threshold <= para.cache_similarity < 0.999
    assert _ids(para) == _ids(first) and set(para.timings_ms) == {"embed", "embed_queue", "cache", "total"}
    near = p.search(NEAR_MISS, 5)
    assert not near.cache_hit and "dense" in near.timings_ms
    # above the cosine threshold, but the guard sees the flipped comparison
    p.search(VENUS, 5)
    v1, v2 = p.embedder.embed([VENUS, FLIPPED])
    assert float(v1 @ v2) >= p.config.cache.threshold
    flipped = p.search(FLIPPED, 5)
    assert not flipped.cache_hit
    # another tenant or other options are another scope; bypassing neither reads nor fills the cache
    assert not p.search(PARAPHRASE, 5, filter=Filter.of("acme")).cache_hit
    assert not p.search(PARAPHRASE, 3).cache_hit
    assert not p.search(ASKED, 5, use_cache=False).cache_hit
    stats = p.cache.stats()
    assert stats["hits"] == 2 and stats["guarded"] >= 1 and 0 < stats["hit_ratio"] < 1


def test_generation_ttl_lru_and_stale_puts(embedder):
    now = [0.0]
    cache = SemanticCache(SemanticCacheConfig(ttl_s=10, max_entries=2), clock=lambda: now[0])
    a, b, c = embedder.embed([ASKED, VENUS, "What makes a steak brown when seared?"])
    cache.put("s", 1, a, ASKED, "A", ["d1"])
    cache.put("other scope", 1, b, VENUS, "B", ["d2"])
    assert cache.lookup("s", 1, a, ASKED).value == "A"
    assert cache.lookup("s", 2, a, ASKED) is None  # a new generation drops the old entries of every scope
    assert len(cache) == 0 and cache.stats()["stale_generation"] == 2
    cache.put("s", 2, a, ASKED, "A2", ["d1"])
    now[0] = 11.0
    assert cache.lookup("s", 2, a, ASKED) is None and cache.stats()["expired"] == 1
    for vec, text, value in ((a, ASKED, "A"), (b, VENUS, "B"), (c, "steak", "C")):  # LRU: A goes
        cache.put("s", 2, vec, text, value, [value])
    assert len(cache) == 2 and cache.lookup("s", 2, a, ASKED) is None and cache.stats()["evictions"] == 1
    since = cache.epoch()  # a query reads the index, then a write touches its document, then it tries to cache
    cache.invalidate_docs(["B"])
    assert cache.lookup("s", 2, b, VENUS) is None
    assert not cache.put("s", 2, b, VENUS, "B-old", ["B"], since=since)
    assert cache.put("s", 2, b, VENUS, "B-new", ["B"], since=cache.epoch())
    assert cache.lookup("s", 2, b, VENUS).value == "B-new"


def test_writes_and_rebuilds_invalidate_through_the_live_index(writable, sample_docs, config, embedder):
    tmp_path = writable
    store = DocumentStore(tmp_path / "store.db")
    docs = sample_docs
    live = LiveIndex(SearchIndex.load(tmp_path / "index", config, embedder), store, embedder, EmbedderTokens(embedder),
                     config)
    p = Pipeline(live.view, embedder, config, cache=SemanticCache(config.cache))
    live.on_publish(p.publish)
    live.on_write(p.cache.invalidate_docs)
    try:
        first = p.search(ASKED, 5)
        top = _ids(first)[0]
        assert p.search(ASKED, 5).cache_hit
        live.upsert([Document(id="unrelated-1", title="Sourdough", text="Sourdough starters are fed flour and water.")])
        assert p.search(ASKED, 5).cache_hit  # the write touched no cached document
        old = next(d for d in docs if d.id == top)
        live.upsert([Document(id=top, title=old.title, text=old.text + " Revised.", tenant=old.tenant,
                              metadata=old.metadata)])
        after_write = p.search(ASKED, 5)
        assert not after_write.cache_hit  # the cached list held the rewritten document
        assert p.search(ASKED, 5).cache_hit
        generation = p.index.generation
        live.rebuild()
        assert p.index.generation == generation + 1
        rebuilt = p.search(ASKED, 5)
        assert not rebuilt.cache_hit and rebuilt.generation == generation + 1
        assert np.array_equal(rebuilt.hits.doc, p.search(ASKED, 5).hits.doc)
    finally:
        live.close()
        p.close()
