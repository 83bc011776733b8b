"""Issue 21, hardening: each attack the issue reproduced on main, replayed against a real server (or the real
index) with the real model. Each test failed before its fix."""

from __future__ import annotations

import asyncio
import gc
import json
import random
import sqlite3
import weakref

import grpc
import numpy as np
import pytest

from index_builder.models.token_encoders import EmbedderTokens
from index_builder.types import Document
from retrieval.api import retriever_pb2 as pb
from retrieval.client import AsyncRetrieverClient, ClientOptions, RetrieverClient, RetryPolicy
from retrieval.config import ServerConfig
from retrieval.generation.backend import BackendConfig, GenerationConfig
from retrieval.generation.embedded import free_port
from retrieval.generation.generator import open_generator
from retrieval.live.live_index import LiveIndex
from retrieval.live.store import DocumentStore
from retrieval.search.filters import Filter, FilterIndex
from retrieval.search.index import SearchIndex
from retrieval.search.pipeline import Pipeline
from retrieval.search.semantic_cache import SemanticCache, SemanticCacheConfig
from retrieval.serving.server import BackgroundServer

NO_RETRY = RetryPolicy(attempts=1)
KEYS = {"key-acme": frozenset({"acme"}), "key-initech": frozenset({"initech"}), "key-admin": frozenset({"*"})}
QUERY = "who settles disputes in court"
ALL = ["bm25", "dense", "late_interaction"]
PLANT_TEXT = "Judges and arbitrators settle disputes in court; who settles disputes in court is the planted answer."

# Metadata keys an attacker would try: the old internal tenant posting's spelling, NUL and control bytes,
# Unicode look-alikes of "tenant", a key that is another tenant's name.
ADVERSARIAL_KEYS = ["\x00tenant", "\0tenant", "tenant", "\x00", "\x00tenant\x00", "tenаnt", "ｔｅｎａｎｔ", "initech",
                    "\u200btenant", "tenant\x00", "_tenant", "\x00TENANT"]


def _client(s: BackgroundServer, key: str) -> RetrieverClient:
    return RetrieverClient(s.target, ClientOptions(retry=NO_RETRY, api_key=key, timeout=60))


def _live_server(writable, config, embedder, server_config: ServerConfig | None = None, generation=None, cache=None):
    store = DocumentStore(writable / "store.db")
    base = SearchIndex.load(writable / "index", config, embedder)
    p = Pipeline(base, embedder, config, cache=cache)
    live = LiveIndex(base, store, embedder, EmbedderTokens(embedder), config)
    live.on_publish(p.publish)
    if cache is not None:
        live.on_write(cache.invalidate_docs)
    setup = generation(p) if generation is not None else None
    s = BackgroundServer(p, server_config or ServerConfig(port=0), api_keys=KEYS, generation=setup, writer=live)
    return s, p, live, store


def _tenants_in(response: pb.RetrieveResponse, tenant_of) -> set[str]:
    return {tenant_of(p.doc_id) for p in response.passages}


# ---------------------------------------------------------------------------------------------------- item 1


def test_metadata_cannot_plant_a_document_in_another_tenant(writable, config, embedder):
    """The issue's attack: as acme, upsert a document whose metadata claims ``"\\x00tenant": "initech"``, then
    rebuild. The upsert is refused at the edge (metadata keys are identifiers), and a document that carries such
    a key anyway (planted below through the library, as an older corpus could) is never in initech's results
    after a rebuild, in any stage, in Generate's passages (= its prompt) or from the semantic cache."""
    dead = f"http://127.0.0.1:{free_port()}/v1"  # passages are streamed (and the prompt built from them) first
    cache = SemanticCache(config.cache)
    s, p, live, store = _live_server(writable, config, embedder, cache=cache, generation=lambda p: open_generator(
        p, GenerationConfig(backend=BackendConfig(base_url=dead)), cache))
    try:
        with _client(s, "key-acme") as acme:
            for key in ADVERSARIAL_KEYS:
                doc = pb.Document(id="inj-1", tenant="acme", text=PLANT_TEXT, metadata={key: "initech"})
                if key in ("tenant", "initech", "_tenant"):
                    continue  # legal identifiers: planted below
                with pytest.raises(grpc.RpcError) as e:
                    acme.upsert([doc])
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "metadata key" in e.value.details()
            assert store.get("inj-1") is None
            for i, key in enumerate(("tenant", "initech", "_tenant")):  # legal keys, planted over gRPC
                acme.upsert([pb.Document(id=f"inj-{i}", tenant="acme", text=PLANT_TEXT, metadata={key: "initech"})])
            acme.retrieve(QUERY, 10, tenant="acme")  # acme's own answer is cached (scope: acme)
        # The rest written straight into the store's tables, as a store filled before validation existed could
        # hold them; the rebuild (the trigger) reads them back into the new snapshot.
        db = sqlite3.connect(writable / "store.db", isolation_level=None)
        last = db.execute("SELECT MAX(seq) FROM changes").fetchone()[0]
        for i, key in enumerate(ADVERSARIAL_KEYS, start=last + 1):
            db.execute("INSERT INTO changes (seq, op, id, tenant) VALUES (?, 'upsert', ?, 'acme')", (i, f"lib-{i}"))
            db.execute("INSERT INTO documents (id, tenant, title, text, metadata, seq) VALUES (?, 'acme', '', ?, ?, ?)",
                       (f"lib-{i}", PLANT_TEXT, json.dumps({key: "initech"}), i))
        db.close()
        live.rebuild()  # after a rebuild the planted documents reached initech (the old shared postings table)
        _, docs = store.snapshot()
        assert sum(d.id.startswith("lib-") for d in docs) == len(ADVERSARIAL_KEYS)
        assert sum(d.id.startswith(("lib-", "inj-")) for d in live.view.documents) == len(ADVERSARIAL_KEYS) + 3
        tenant_of = {d.id: d.tenant for d in docs}.__getitem__
        with _client(s, "key-initech") as initech:
            for stages in (["bm25"], ["dense"], ["bm25", "dense"], ALL):
                for bypass in (True, False):
                    r = initech.retrieve(QUERY, 20, tenant="initech", stages=stages, bypass_cache=bypass)
                    assert r.passages and _tenants_in(r, tenant_of) == {"initech"}, (stages, bypass)
            for key in ("tenant", "initech", "_tenant"):  # filtering on the planted key finds only initech's own
                r = initech.retrieve(QUERY, 20, tenant="initech", filters={key: "initech"})
                assert _tenants_in(r, tenant_of) <= {"initech"}
            msgs = []
            with pytest.raises(grpc.RpcError) as e:
                for m in initech.generate(QUERY, 5, tenant="initech", bypass_cache=True):
                    msgs.append(m)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE  # the dead backend, after the passages
            assert msgs and _tenants_in(msgs[0].passages, tenant_of) == {"initech"}
    finally:
        s.stop()
        p.close()


def test_tenant_masks_never_admit_another_tenant_whatever_the_metadata():
    """Property, over seeded random documents with adversarial metadata (keys with NUL, the old internal
    spelling, look-alikes, other tenants' names; values that are tenant names): a tenant's mask admits only its
    own documents, alone or with any metadata filter."""
    rng = random.Random(21)
    tenants = ["acme", "initech", "globex", ""]
    values = tenants + ["\x00", "acme\x00", "initech "]
    docs = []
    for i in range(400):
        meta = {rng.choice(ADVERSARIAL_KEYS + ["topic", "lang"]): rng.choice(values) for _ in range(rng.randrange(4))}
        docs.append(Document(id=f"d{i}", text="x", tenant=rng.choice(tenants), metadata=meta))
    chunk_doc = np.repeat(np.arange(len(docs)), 2)
    fi = FilterIndex(docs, chunk_doc)
    for _ in range(300):
        t = rng.choice(tenants[:3])
        meta = {rng.choice(ADVERSARIAL_KEYS): rng.choice(values) for _ in range(rng.randrange(3))}
        masks = fi.masks(Filter(t, tuple(sorted(meta.items()))))
        assert masks is not None
        allowed = np.flatnonzero(masks[0])
        assert all(docs[d].tenant == t for d in allowed)
        assert all(all(docs[d].metadata.get(k) == v for k, v in meta.items()) for d in allowed)
        assert (masks[1] == masks[0][chunk_doc]).all()


# ---------------------------------------------------------------------------------------------------- item 2


@pytest.fixture(scope="module")
def keyed_server(pipeline):
    s = BackgroundServer(pipeline, ServerConfig(port=0), api_keys=KEYS)
    yield s
    s.stop()


MIB = "x" * 2**20


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tenant": "acme", "filters": {"topic": MIB}}, "at most 1000 are allowed"),
    ({"tenant": "acme", "filters": {"k" * 2**20: "v"}}, "must be 1-64 ASCII letters"),
    ({"tenant": "acme", "filters": {"\x00tenant": "initech"}}, "must be 1-64 ASCII letters"),
    ({"tenant": "acme", "filters": {f"k{i}": "v" for i in range(17)}}, "at most 16 metadata filters"),
    ({"tenant": MIB}, "'tenant' must be up to 64"),
    ({"tenant": "acme\x00"}, "'tenant' must be up to 64"),
    ({"tenant": "acme", "stages": ["bm25"] * 100_000}, "each stage at most once"),
])
def test_every_request_controlled_size_is_bounded(keyed_server, kwargs, message):
    with _client(keyed_server, "key-admin") as c, pytest.raises(grpc.RpcError) as e:
        c.retrieve("energy", 5, **kwargs)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in e.value.details()
    assert len(e.value.details()) < 500  # the message names the problem without echoing the megabyte


def test_caches_are_bounded_in_bytes(sample_index, sample_docs):
    fi = FilterIndex(sample_docs, sample_index.chunk_doc, cache_size=256,
                     cache_bytes=10 * (len(sample_docs) + len(sample_index.chunk_doc) + 1))
    for i in range(50):
        fi.masks(Filter.of("acme", {"year": str(1900 + i)}))
    assert len(fi._cache) == 10
    cache = SemanticCache(SemanticCacheConfig(max_bytes=100_000))
    v = np.ones(4, np.float32) / 2
    for i in range(100):
        assert cache.put(("s", i), 1, v, f"q{i}", object(), [f"d{i}"], nbytes=9_000)
    st = cache.stats()
    assert st["bytes"] <= 100_000 and 5 <= st["entries"] <= 11 and st["evictions"] >= 89
    assert not cache.put(("s", "huge"), 1, v, "huge", object(), [], nbytes=200_000)  # larger than the whole cache


# ---------------------------------------------------------------------------------------------------- item 3


def test_cached_results_do_not_pin_superseded_views(writable, config, embedder):
    """A cached Retrieve result keeps its documents and passages, not the live view it was read from: after
    later writes replace the view, the old view (and its write buffer) is freed."""
    store = DocumentStore(writable / "store.db")
    base = SearchIndex.load(writable / "index", config, embedder)
    cache = SemanticCache(config.cache)
    live = LiveIndex(base, store, embedder, EmbedderTokens(embedder), config)
    p = Pipeline(live.view, embedder, config, cache=cache)
    live.on_publish(p.publish)
    live.on_write(cache.invalidate_docs)
    try:
        live.upsert([Document(id="w-0", tenant="acme", text="A first buffered note about tidal locking of moons.")])
        first = weakref.ref(p.index)
        res = p.search("how do bees find flowers", 5)
        assert len(cache) == 1
        hit = p.search("how do bees find flowers", 5)
        assert hit.cache_hit and type(hit.index).__name__ == "ResultView"
        assert hit.doc_ids() == res.doc_ids() and hit.index.passage(int(hit.hits.chunk[0])) == \
            res.index.passage(int(res.hits.chunk[0]))
        del res, hit
        for i in range(1, 4):
            live.upsert([Document(id=f"w-{i}", tenant="acme", text=f"Buffered note {i} about comet tails.")])
        gc.collect()
        assert first() is None, gc.get_referrers(first())
        assert p.search("how do bees find flowers", 5).cache_hit  # the entry is still there, and still answers
    finally:
        p.close()


# ---------------------------------------------------------------------------------------------------- items 4, 5, 7


def test_a_batch_over_the_limit_is_refused_before_any_work(writable, config, embedder):
    s, p, live, store = _live_server(writable, config, embedder)
    before = store.last_seq()
    # Document 1000 is invalid too (empty text): the refusal names the batch size, so the count was checked
    # before a single document was validated, chunked or encoded.
    docs = [pb.Document(id=f"b{i}", tenant="acme", text="short note") for i in range(1000)]
    docs.append(pb.Document(id="b-empty", tenant="acme", text=" "))
    try:
        with _client(s, "key-acme") as c:
            with pytest.raises(grpc.RpcError) as e:
                c.upsert(docs)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "1001 documents in one upsert; at most 1000" in e.value.details()
            with pytest.raises(grpc.RpcError) as e:
                c.delete([f"id{i}" for i in range(1001)], tenant="acme")
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 1000" in e.value.details()
            with pytest.raises(grpc.RpcError) as e:
                c.delete(["x" * 300], tenant="acme")
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 256" in e.value.details()
        assert store.last_seq() == before and live.view.buffered == 0
    finally:
        s.stop()
        p.close()


def test_writes_have_their_own_budget_and_do_not_starve_reads(writable, config, embedder, sample_queries):
    """With one write slot, concurrent upserts beyond it are refused at once (RESOURCE_EXHAUSTED naming the
    write budget) while reads, in their own budget, are all served."""
    s, p, live, store = _live_server(writable, config, embedder, ServerConfig(port=0, max_in_flight=8,
                                                                             max_writes_in_flight=1))
    text = " ".join(["Tidal forces slowly lock a moon's rotation to its orbit."] * 20)
    queries = list(sample_queries.values())

    async def main():
        opts = ClientOptions(retry=NO_RETRY, timeout=120, api_key="key-acme")
        async with AsyncRetrieverClient(s.target, opts) as c:
            writes = [c.upsert([pb.Document(id=f"u{i}-{j}", tenant="acme", text=text) for j in range(20)])
                      for i in range(12)]
            reads = [c.retrieve(queries[i % len(queries)], 5, tenant="acme") for i in range(6)]
            return await asyncio.gather(*writes, return_exceptions=True), await asyncio.gather(*reads,
                                                                                              return_exceptions=True)
    try:
        writes, reads = asyncio.run(main())
    finally:
        s.stop()
        p.close()
    refused = [w for w in writes if isinstance(w, grpc.aio.AioRpcError)]
    assert refused and all(w.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "writes in flight (max 1)" in w.details()
                           for w in refused)
    assert any(isinstance(w, pb.UpsertResponse) for w in writes)
    assert all(isinstance(r, pb.RetrieveResponse) and r.passages for r in reads), reads


def test_a_write_whose_deadline_passes_before_the_commit_is_not_applied(writable, config, embedder):
    """300 passages take seconds to encode on this CPU; the caller allows 0.2 s. The call ends with
    DEADLINE_EXCEEDED, and once the server has finished with it the store holds none of the documents: the
    deadline is checked again just before the durable commit."""
    s, p, live, store = _live_server(writable, config, embedder)
    text = " ".join(["A long passage about the slow tidal locking of moons and planets over aeons."] * 12)
    docs = [pb.Document(id=f"late-{i}", tenant="acme", text=text) for i in range(300)]
    try:
        with _client(s, "key-acme") as c, pytest.raises(grpc.RpcError) as e:
            c.upsert(docs, timeout=0.2)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        for _ in range(600):  # until the server has let go of the write (its encoding finishes, then it refuses)
            if s.running.state.writes_in_flight == 0:
                break
            asyncio.run(asyncio.sleep(0.1))
        assert s.running.state.writes_in_flight == 0
        assert store.get("late-0") is None and store.get("late-299") is None and live.view.buffered == 0
        with _client(s, "key-acme") as c, pytest.raises(grpc.RpcError) as e:
            c.upsert([pb.Document(id="x", tenant="acme", text="t")], timeout=0.0005)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and store.get("x") is None
    finally:
        s.stop()
        p.close()


def test_authentication_comes_first_and_refusals_do_not_reveal_other_tenants(writable, config, embedder):
    s, p, live, store = _live_server(writable, config, embedder)
    try:
        with RetrieverClient(s.target, ClientOptions(retry=NO_RETRY)) as anonymous:
            with pytest.raises(grpc.RpcError) as e:
                anonymous.upsert([])  # an empty upsert without a key: UNAUTHENTICATED, not INVALID_ARGUMENT
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as e:
                anonymous.delete([])
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        initech_doc = next(d for d in store.snapshot()[1] if d.tenant == "initech")
        with _client(s, "key-acme") as acme, pytest.raises(grpc.RpcError) as e:
            acme.upsert([pb.Document(id=initech_doc.id, tenant="acme", text="taken over")])
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "initech" not in e.value.details() and initech_doc.title not in e.value.details()
        assert store.get(initech_doc.id).tenant == "initech"
    finally:
        s.stop()
        p.close()
