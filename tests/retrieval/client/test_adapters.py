"""The LangChain, LlamaIndex and Haystack adapters against a real gRPC server on a free loopback port (the sample
index, the real model): each returns what the Python client returns, in its framework's types, sync and async."""

from __future__ import annotations

import asyncio
import os

import grpc
import pytest

from retrieval.api import retriever_pb2 as pb
from retrieval.client import ClientOptions, RetrieverClient
from retrieval.config import ServerConfig
from retrieval.serving.server import BackgroundServer

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # read when haystack is imported: no posthog calls from tests

KEYS = {"k1": frozenset({"acme"})}


@pytest.fixture(scope="module")
def server(pipeline):
    s = BackgroundServer(pipeline, ServerConfig(port=0))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def keyed_server(pipeline):
    """API keys bound to tenants: ``k1`` may read tenant ``acme`` only."""
    s = BackgroundServer(pipeline, ServerConfig(port=0), api_keys=KEYS)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def queries(sample_queries) -> list[str]:
    return list(sample_queries.values())[:3]


def reference(target: str, query: str, k: int = 5, api_key: str = "", **kw) -> pb.RetrieveResponse:
    """What the Python client gets, searched afresh (the adapters' answers may come from the semantic cache)."""
    with RetrieverClient(target, ClientOptions(api_key=api_key)) as c:
        return c.retrieve(query, k, bypass_cache=True, **kw)


def expected(r: pb.RetrieveResponse) -> list[tuple[str, str, float]]:
    return [(f"{p.doc_id}#{p.chunk_id}", p.text, p.score) for p in r.passages]


def check_metadata(meta: dict, p: pb.Passage) -> None:
    assert meta["doc_id"] == p.doc_id and meta["chunk_id"] == p.chunk_id and meta["score"] == p.score
    assert meta["title"] == p.title and meta["tenant"] == p.tenant and len(meta["request_id"]) == 16
    assert meta["stage_ranks"] == {s.stage: s.rank for s in p.stages} and meta["stage_ranks"]["fused"] >= 1
    assert {k: meta[k] for k in p.metadata} == dict(p.metadata) and "topic" in meta  # the document's own metadata


# --- LangChain ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lc():
    pytest.importorskip("langchain_core")
    from retrieval.client.integrations import langchain
    return langchain


def lc_rows(docs) -> list[tuple[str, str, float]]:
    return [(f"{d.metadata['doc_id']}#{d.metadata['chunk_id']}", d.page_content, d.metadata["score"]) for d in docs]


def test_langchain_documents_are_the_clients_passages(lc, server, queries):
    retriever = lc.HybridRagRetriever(target=server.target)
    for q in queries:
        docs, ref = retriever.invoke(q), reference(server.target, q)
        assert len(docs) == 5 and lc_rows(docs) == expected(ref)
        for d, p in zip(docs, ref.passages, strict=True):
            check_metadata(d.metadata, p)
    retriever.close()


def test_langchain_async_equals_sync(lc, server, queries):
    retriever = lc.HybridRagRetriever(target=server.target, top_k=4)
    sync = [lc_rows(d) for d in retriever.batch(queries)]
    for _ in range(2):  # a second event loop gets its own channel (a grpc.aio channel is bound to its loop)
        assert [lc_rows(d) for d in asyncio.run(retriever.abatch(queries))] == sync


def test_langchain_passes_top_k_filters_tenant_and_key(lc, server, keyed_server, queries):
    q = queries[0]
    assert len(lc.HybridRagRetriever(target=server.target, top_k=2).invoke(q)) == 2
    docs = lc.HybridRagRetriever(target=server.target, filters={"source": "manual"}, top_k=8).invoke("energy")
    assert docs and {d.metadata["source"] for d in docs} == {"manual"}
    assert lc_rows(docs) == expected(reference(server.target, "energy", 8, filters={"source": "manual"}))
    keyed = lc.HybridRagRetriever(target=keyed_server.target, api_key="k1", tenant="acme")
    docs = keyed.invoke(q)
    assert docs and {d.metadata["tenant"] for d in docs} == {"acme"} and "k1" not in repr(keyed)
    assert lc_rows(docs) == expected(reference(keyed_server.target, q, api_key="k1", tenant="acme"))
    with pytest.raises(grpc.RpcError) as e:
        lc.HybridRagRetriever(target=keyed_server.target, api_key="nope", tenant="acme").invoke(q)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(ValueError, match="topk"):  # a misspelt field is an error, not silently ignored
        lc.HybridRagRetriever(target=server.target, topk=2)


def test_langchain_in_an_lcel_chain(lc, server, queries):
    from langchain_core.runnables import RunnableLambda

    retriever = lc.HybridRagRetriever(target=server.target, top_k=3)
    chain = retriever | RunnableLambda(lambda docs: [d.metadata["doc_id"] for d in docs])
    for q in queries:
        assert chain.invoke(q) == [p.doc_id for p in reference(server.target, q, 3).passages]


# --- LlamaIndex --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def li():
    pytest.importorskip("llama_index.core")
    from retrieval.client.integrations import llamaindex
    return llamaindex


def li_rows(nodes) -> list[tuple[str, str, float]]:
    return [(n.node.id_, n.node.text, n.score) for n in nodes]


def test_llamaindex_nodes_are_the_clients_passages(li, server, queries):
    from llama_index.core.schema import MetadataMode, NodeWithScore

    retriever = li.HybridRagRetriever(server.target)
    for q in queries:
        nodes, ref = retriever.retrieve(q), reference(server.target, q)
        assert all(isinstance(n, NodeWithScore) for n in nodes) and li_rows(nodes) == expected(ref)
        for n, p in zip(nodes, ref.passages, strict=True):
            check_metadata(n.node.metadata, p)
        shown = nodes[0].node.get_content(metadata_mode=MetadataMode.LLM)  # what an LLM is shown: title, not bookkeeping
        assert ref.passages[0].title in shown and "stage_ranks" not in shown and "request_id" not in shown
    retriever.close()


def test_llamaindex_async_equals_sync(li, server, queries):
    retriever = li.HybridRagRetriever(server.target, top_k=4)
    sync = [li_rows(retriever.retrieve(q)) for q in queries]

    async def all_of_them():
        return [li_rows(n) for n in await asyncio.gather(*(retriever.aretrieve(q) for q in queries))]

    for _ in range(2):
        assert asyncio.run(all_of_them()) == sync


def test_llamaindex_passes_top_k_filters_tenant_and_key(li, server, keyed_server, queries):
    q = queries[1]
    assert len(li.HybridRagRetriever(server.target, top_k=2).retrieve(q)) == 2
    nodes = li.HybridRagRetriever(server.target, top_k=8, filters={"source": "blog"}).retrieve("energy")
    assert nodes and {n.node.metadata["source"] for n in nodes} == {"blog"}
    assert li_rows(nodes) == expected(reference(server.target, "energy", 8, filters={"source": "blog"}))
    nodes = li.HybridRagRetriever(keyed_server.target, api_key="k1", tenant="acme", stages=["bm25"]).retrieve(q)
    ref = reference(keyed_server.target, q, api_key="k1", tenant="acme", stages=["bm25"])
    assert nodes and {n.node.metadata["tenant"] for n in nodes} == {"acme"} and li_rows(nodes) == expected(ref)
    assert set(nodes[0].node.metadata["stage_ranks"]) == {s.stage for s in ref.passages[0].stages}
    with pytest.raises(grpc.RpcError) as e:
        li.HybridRagRetriever(keyed_server.target, api_key="nope", tenant="acme").retrieve(q)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


# --- Haystack ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hs():
    pytest.importorskip("haystack")
    from retrieval.client.integrations import haystack
    return haystack


def hs_rows(docs) -> list[tuple[str, str, float]]:
    return [(d.id, d.content, d.score) for d in docs]


def test_haystack_documents_are_the_clients_passages(hs, server, queries):
    retriever = hs.HybridRagRetriever(server.target)
    for q in queries:
        docs, ref = retriever.run(q)["documents"], reference(server.target, q)
        assert hs_rows(docs) == expected(ref)
        for d, p in zip(docs, ref.passages, strict=True):
            check_metadata(d.meta, p)
    assert hs_rows(retriever.run(queries[0], top_k=2)["documents"]) == expected(reference(server.target, queries[0], 2))

    async def all_of_them():
        return [hs_rows(r["documents"]) for r in await asyncio.gather(*(retriever.run_async(q) for q in queries))]

    assert asyncio.run(all_of_them()) == [expected(reference(server.target, q)) for q in queries]
    retriever.close()


def test_haystack_in_a_pipeline_and_round_trips(hs, server, queries):
    from haystack import DeserializationError, Pipeline

    p = Pipeline()
    p.add_component("retriever", hs.HybridRagRetriever(server.target, top_k=3, filters={"lang": "en"}))
    q = queries[2]
    want = expected(reference(server.target, q, 3, filters={"lang": "en"}))
    assert hs_rows(p.run({"retriever": {"query": q}})["retriever"]["documents"]) == want
    data = p.get_component("retriever").to_dict()
    assert data["type"] == "retrieval.client.integrations.haystack.HybridRagRetriever"
    assert data["init_parameters"]["api_key"] == {"type": "env_var", "env_vars": ["HYBRIDRAG_API_KEY"], "strict": False}
    again = hs.HybridRagRetriever.from_dict(data)
    assert again.to_dict() == data and hs_rows(again.run(q)["documents"]) == want
    with pytest.raises(DeserializationError, match="allowlist"):  # Haystack 3 loads only modules the caller trusts
        Pipeline.loads(p.dumps())
    loaded = Pipeline.loads(p.dumps(), allowed_modules=["retrieval.client.integrations.haystack"])  # the YAML it's saved as
    assert hs_rows(loaded.run({"retriever": {"query": q}})["retriever"]["documents"]) == want


def test_haystack_filters_tenant_and_key(hs, server, keyed_server, queries, monkeypatch):
    from haystack.utils import Secret

    flat = {"source": "wiki", "lang": "en"}
    want = expected(reference(server.target, "energy", 6, filters=flat))
    retriever = hs.HybridRagRetriever(server.target, top_k=6, filters={"source": "blog"})
    haystack_syntax = {"operator": "AND", "conditions": [{"field": "meta.source", "operator": "==", "value": "wiki"},
                                                         {"field": "meta.lang", "operator": "==", "value": "en"}]}
    for filters in (flat, haystack_syntax):  # runtime filters replace the init ones
        docs = retriever.run("energy", filters=filters)["documents"]
        assert docs and {d.meta["source"] for d in docs} == {"wiki"} and hs_rows(docs) == want
    with pytest.raises(ValueError, match="metadata equality only"):
        retriever.run("energy", filters={"field": "meta.year", "operator": ">", "value": "2010"})

    q = queries[0]
    want = expected(reference(keyed_server.target, q, api_key="k1", tenant="acme"))
    docs = hs.HybridRagRetriever(keyed_server.target, api_key=Secret.from_token("k1"), tenant="acme").run(q)["documents"]
    assert {d.meta["tenant"] for d in docs} == {"acme"} and hs_rows(docs) == want
    with pytest.raises(ValueError, match="Cannot serialize token-based secret"):  # a key in plain text is never written
        hs.HybridRagRetriever(keyed_server.target, api_key=Secret.from_token("k1")).to_dict()
    monkeypatch.setenv("HYBRIDRAG_API_KEY", "k1")  # the default: the key from the environment, read on first use
    assert hs_rows(hs.HybridRagRetriever(keyed_server.target, tenant="acme").run(q)["documents"]) == want
    monkeypatch.setenv("HYBRIDRAG_API_KEY", "nope")
    with pytest.raises(grpc.RpcError) as e:
        hs.HybridRagRetriever(keyed_server.target, tenant="acme").run(q)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
