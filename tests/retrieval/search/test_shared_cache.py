"""The Redis-shared result cache against a real redis-server on loopback, with the real pipeline: two caches
(two replicas' views of it) see each other's entries, a write version moves both, TTLs expire, values are JSON,
and a dead Redis makes misses, not errors."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time

import pytest
import redis

from retrieval.search.pipeline import Pipeline
from retrieval.search.semantic_cache import SemanticCacheConfig
from retrieval.search.shared_cache import SharedCache
from tests.helpers import RedisServer, free_port

REDIS = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed (apt-get install redis-server)")
Q = "how do bees tell each other where the flowers are"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = RedisServer(REDIS, tmp_path_factory.mktemp("redis"))
    yield server.url
    server.stop()


def _replicas(sample_index, embedder, config, url, namespace, **cache):
    cfg = dataclasses.replace(config, cache=SemanticCacheConfig(redis_url=url, redis_namespace=namespace, **cache))
    return [Pipeline(sample_index, embedder, cfg, cache=SharedCache(cfg.cache)) for _ in range(2)]


def test_entries_are_shared_and_a_write_version_invalidates_both(sample_index, embedder, config, redis_url):
    a, b = _replicas(sample_index, embedder, config, redis_url, "t1")
    try:
        first = a.search(Q, 5)
        assert not first.cache_hit
        exact = b.search(Q, 5)
        assert exact.cache_hit and exact.cache_similarity == 1.0 and "embed" not in exact.timings_ms
        assert exact.doc_ids() == first.doc_ids()
        assert [exact.index.passage(int(c)) for c in exact.hits.chunk] == [
            first.index.passage(int(c)) for c in first.hits.chunk]
        near = b.search(Q + "?", 5)  # semantic: B reads A's vector from the stream
        assert near.cache_hit and 0.91 <= near.cache_similarity < 1.0 and near.doc_ids() == first.doc_ids()
        other = b.search("why is venus hotter than mercury", 5)  # another question: no false hit
        assert not other.cache_hit

        epoch = a.cache.epoch()
        b.cache.invalidate_docs(["anything"])  # what a write through B does
        assert not b.search(Q + "?", 5).cache_hit  # the old entries are unreachable from both
        assert a.search(Q, 5).cache_hit  # ... and B's refill under the new version serves A
        assert a.cache.put(("x",), 1, first.query_vec, "q", first.detached(), [], since=epoch) is False
        assert a.cache.stats()["refused_stale"] == 1

        r = redis.Redis.from_url(redis_url)
        key = next(k for k in r.scan_iter("t1:r:*"))
        stored = json.loads(r.get(key))  # JSON, never pickle
        assert stored["kind"] == "result" and set(stored["value"]) >= {"hits", "docs", "passages"}
    finally:
        a.close()
        b.close()


def test_entries_expire_with_their_ttl(sample_index, embedder, config, redis_url):
    a, b = _replicas(sample_index, embedder, config, redis_url, "t2", ttl_s=1.0)
    try:
        a.search(Q, 5)
        assert b.search(Q, 5).cache_hit
        time.sleep(1.3)
        assert not b.search(Q + "?", 5).cache_hit  # expired: the stream's vector and the result are gone
    finally:
        a.close()
        b.close()


def test_a_dead_redis_makes_misses_not_errors(sample_index, embedder, config):
    port = free_port()  # nothing listens there
    (a, _) = _replicas(sample_index, embedder, config, f"redis://127.0.0.1:{port}/0", "t3", redis_timeout_s=0.2)
    try:
        r1, r2 = a.search(Q, 5), a.search(Q, 5)
        assert not r1.cache_hit and not r2.cache_hit and r1.doc_ids() == r2.doc_ids()
        assert a.cache.stats()["errors"] >= 2
    finally:
        a.close()


def test_generated_answers_round_trip_as_json(pipeline):
    from retrieval.generation.generator import Stats, _answer_from_dict, _answer_to_dict, _CachedAnswer
    from retrieval.search.shared_cache import decode_value, encode_value, register_codec

    register_codec("answer", _CachedAnswer, _answer_to_dict, _answer_from_dict)
    res = pipeline.search(Q, 3).detached()
    answer = _CachedAnswer(res, "By dancing.", Stats(1.0, 2.0, 3.0, 10, 3, "smollm2", "small"))
    back = decode_value(encode_value(answer))
    assert isinstance(back, _CachedAnswer) and back.text == "By dancing." and back.stats == answer.stats
    assert back.result.doc_ids() == res.doc_ids()
    assert [back.result.index.passage(int(c)) for c in back.result.hits.chunk] == [
        res.index.passage(int(c)) for c in res.hits.chunk]
