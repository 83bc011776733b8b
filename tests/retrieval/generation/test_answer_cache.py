"""Generate's answer cache (issue 39): the same question asked twice streams the cached answer the second time,
with the in-process cache and with the Redis-shared one (whose exact retrieval hits carry no query vector); and
a bad answer entry in Redis is a counted miss, never an error. A real llama.cpp server (the bundled
SmolLM2-135M GGUF), a real redis-server on loopback, the sample index."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil

import grpc
import pytest

from retrieval.client import ClientOptions, RetrieverClient, RetryPolicy
from retrieval.config import ServerConfig
from retrieval.generation.backend import BackendConfig, GenerationConfig
from retrieval.generation.embedded import EmbeddedLLMConfig, EmbeddedLLMServer, bundled_gguf
from retrieval.generation.generator import GeneratorSetup, Passages, Stats, Token, open_generator
from retrieval.search.filters import Filter
from retrieval.search.pipeline import Pipeline
from retrieval.search.semantic_cache import SemanticCache, SemanticCacheConfig
from retrieval.search.shared_cache import SharedCache
from retrieval.serving.server import BackgroundServer
from tests.helpers import RedisServer

REDIS = shutil.which("redis-server")
pytestmark = pytest.mark.slow  # a real llama.cpp server generates here
QUESTION = "How far does light travel in one year?"
TENANT = "acme"
NO_RETRY = ClientOptions(retry=RetryPolicy(attempts=1), timeout=120)


@pytest.fixture(scope="module")
def llm():
    with EmbeddedLLMServer(EmbeddedLLMConfig(threads=2, nice=0, n_ctx=2048)) as server:
        yield server


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    if REDIS is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = RedisServer(REDIS, tmp_path_factory.mktemp("redis"))
    yield server.url
    server.stop()


_namespaces = iter(range(10**6))


def _pipeline(kind: str, request, sample_index, embedder, config) -> Pipeline:
    if kind == "memory":
        return Pipeline(sample_index, embedder, config, cache=SemanticCache(config.cache))
    cfg = dataclasses.replace(config, cache=SemanticCacheConfig(redis_url=request.getfixturevalue("redis_url"),
                                                                redis_namespace=f"gen{next(_namespaces)}"))
    return Pipeline(sample_index, embedder, cfg, cache=SharedCache(cfg.cache))


def _setup(pipeline: Pipeline, llm) -> GeneratorSetup:
    config = GenerationConfig(backend=BackendConfig(base_url=llm.base_url, model="smollm2"), max_tokens=12,
                              tokenizer=str(bundled_gguf()))
    return open_generator(pipeline, config, pipeline.cache)


async def _ask(setup: GeneratorSetup, question: str = QUESTION, tenant: str = TENANT) -> tuple[Passages, str, Stats]:
    events = [e async for e in setup.generator.generate(question, k=3, filter=Filter.of(tenant))]
    assert isinstance(events[0], Passages) and isinstance(events[-1], Stats)
    assert all(isinstance(e, Token) for e in events[1:-1])
    return events[0], "".join(e.text for e in events[1:-1]), events[-1]


@pytest.fixture(params=["memory", "redis"])
def gen(request, sample_index, embedder, config, llm):
    p = _pipeline(request.param, request, sample_index, embedder, config)
    setup = _setup(p, llm)
    yield p, setup
    asyncio.run(setup.aclose())
    p.close()


def test_a_repeated_generate_streams_the_cached_answer(gen):
    p, setup = gen

    async def twice():
        return await _ask(setup), await _ask(setup)

    (p1, text1, s1), (p2, text2, s2) = asyncio.run(twice())
    assert not s1.cache_hit and text1.strip()
    assert s2.cache_hit, f"the second Generate was not an answer-cache hit ({type(p.cache).__name__})"
    assert text2 == text1 and s2.tokens_out == s1.tokens_out and s2.model == s1.model and s2.generation_ms == 0.0
    assert p2.result.cache_hit and p2.result.doc_ids() == p1.result.doc_ids()


def test_an_answer_after_a_cached_retrieve_is_cached_too(gen):
    """A Retrieve first (its result cached), then the same question's Generate twice: the first Generate's
    retrieval is an exact cache hit; its answer must still be cached for the second."""
    p, setup = gen
    p.search(QUESTION, 3, filter=Filter.of(TENANT))

    async def twice():
        return await _ask(setup), await _ask(setup)

    (_, text1, s1), (_, text2, s2) = asyncio.run(twice())
    assert not s1.cache_hit and s2.cache_hit and text2 == text1


def test_a_served_repeated_generate_hits_the_shared_cache(sample_index, embedder, config, llm, redis_url):
    cfg = dataclasses.replace(config, cache=SemanticCacheConfig(redis_url=redis_url, redis_namespace="served"))
    p = Pipeline(sample_index, embedder, cfg, cache=SharedCache(cfg.cache))
    s = BackgroundServer(p, ServerConfig(port=0), generation=_setup(p, llm))
    try:
        with RetrieverClient(s.target, NO_RETRY) as c:
            runs = [list(c.generate(QUESTION, 3, max_tokens=12, tenant=TENANT)) for _ in range(3)]
    finally:
        s.stop()
        p.close()
    hits = [r[-1].stats.cache_hit for r in runs]
    assert hits == [False, True, True], hits
    answers = {"".join(m.token for m in r[1:-1]) for r in runs}
    assert len(answers) == 1


def _answer_key(r, ns: str, retrieve_keys: set[bytes]) -> bytes:
    keys = {k for k in r.scan_iter(f"{ns}:r:*")} - retrieve_keys
    assert len(keys) == 1, keys
    return keys.pop()


BAD_ANSWERS = {
    "a_result_under_an_answer_key": lambda e, ix: {"kind": "result", "value": e["value"]["result"]},
    "text_not_a_string": lambda e, ix: {**e, "value": {**e["value"], "text": ["Bees", "dance"]}},
    "stats_missing_a_field": lambda e, ix: {**e, "value": {**e["value"], "stats": {"model": "m"}}},
    "stats_of_wrong_types": lambda e, ix: {**e, "value": {**e["value"], "stats": {
        **e["value"]["stats"], "tokens_out": "many"}}},
    "stats_with_an_unknown_field": lambda e, ix: {**e, "value": {**e["value"], "stats": {
        **e["value"]["stats"], "evil": 1}}},
    "another_tenants_passages": "tenant",
    "doc_missing_from_its_own_docs": "missing",
}


def _poison_answer(v: dict, index, how: str) -> dict:
    res = v["value"]["result"]
    d = res["hits"][0][0]
    if how == "missing":
        res["docs"].pop(str(d))
    else:  # the first hit becomes a globex document, consistent with the serving index
        g = next(i for i, doc in enumerate(index.documents) if doc.tenant == "globex")
        c = int(index.starts[g])
        res["docs"].pop(str(d))
        res["passages"].pop(str(res["hits"][2][0]))
        res["hits"][0][0], res["hits"][2][0] = g, c
        doc = index.documents[g]
        res["docs"][str(g)] = {"id": doc.id, "title": doc.title, "tenant": doc.tenant, "metadata": dict(doc.metadata)}
        res["passages"][str(c)] = index.passage(c)
    return v


@pytest.mark.parametrize("name", list(BAD_ANSWERS))
def test_a_bad_answer_entry_is_a_counted_miss(sample_index, embedder, config, llm, redis_url, name):
    import redis

    r = redis.Redis.from_url(redis_url)
    cfg = dataclasses.replace(config, cache=SemanticCacheConfig(redis_url=redis_url, redis_namespace=f"bad-{name}"))
    p = Pipeline(sample_index, embedder, cfg, cache=SharedCache(cfg.cache))
    setup = _setup(p, llm)
    try:
        p.search(QUESTION, 3, filter=Filter.of(TENANT))
        retrieve_keys = set(r.scan_iter(f"bad-{name}:r:*"))

        async def run():
            first = await _ask(setup)
            key = _answer_key(r, f"bad-{name}", retrieve_keys)
            entry = json.loads(r.get(key))
            how = BAD_ANSWERS[name]
            bad = _poison_answer(entry, p.index, how) if isinstance(how, str) else how(entry, p.index)
            r.set(key, json.dumps(bad).encode())
            return first, await _ask(setup)

        (_, text1, s1), (passages, text2, s2) = asyncio.run(run())
    finally:
        asyncio.run(setup.aclose())
        p.close()
    assert not s2.cache_hit and text2.strip()
    assert all(passages.result.index.documents[d].tenant == TENANT for d in passages.result.hits.doc.tolist())
    assert p.cache.stats()["invalid"] == 1


@pytest.mark.parametrize("how", ["missing", "tenant"])
@pytest.mark.parametrize("path", ["exact", "semantic"])
def test_a_served_generate_over_a_bad_answer_entry_is_ok(sample_index, embedder, config, llm, redis_url, how, path):
    """Through the gRPC door (which maps unexpected exceptions to INTERNAL): the same question (the exact key) or
    a paraphrase (the semantic stream) over an answer entry naming a document it does not hold, or another
    tenant's passages."""
    import redis

    r = redis.Redis.from_url(redis_url)
    ns = f"served-bad-{how}-{path}"
    cfg = dataclasses.replace(config, cache=SemanticCacheConfig(redis_url=redis_url, redis_namespace=ns))
    p = Pipeline(sample_index, embedder, cfg, cache=SharedCache(cfg.cache))
    s = BackgroundServer(p, ServerConfig(port=0), generation=_setup(p, llm))
    try:
        with RetrieverClient(s.target, NO_RETRY) as c:
            c.retrieve(QUESTION, 3, tenant=TENANT)
            retrieve_keys = set(r.scan_iter(f"{ns}:r:*"))
            list(c.generate(QUESTION, 3, max_tokens=12, tenant=TENANT))
            key = _answer_key(r, ns, retrieve_keys)
            entry = json.loads(r.get(key))
            r.set(key, json.dumps(_poison_answer(entry, p.index, how)).encode())
            try:
                again = list(c.generate(QUESTION if path == "exact" else QUESTION + "?", 3, max_tokens=12,
                                        tenant=TENANT))
            except grpc.RpcError as e:
                pytest.fail(f"{e.code()} {e.details()}")
    finally:
        s.stop()
        p.close()
    assert not again[-1].stats.cache_hit and all(x.tenant == TENANT for x in again[0].passages.passages)
    assert p.cache.stats()["invalid"] == 1
