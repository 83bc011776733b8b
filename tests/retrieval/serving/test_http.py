"""The HTTP door against a real server (uvicorn on a free loopback port, beside gRPC in the same process, over the
same core), serving the sample index with the real model: REST equals gRPC, the error table, keys and tenants,
admission shared by both doors, writes, readiness, OpenAPI, metrics, the OpenAI-compatible embeddings, rerank."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import numpy as np
import pytest

from retrieval.api import retriever_pb2 as pb
from retrieval.client import ClientOptions, RetrieverClient, RetryPolicy
from retrieval.config import ServerConfig
from retrieval.serving.server import BackgroundServer
from retrieval.serving.settings import HttpConfig

JSON = {"content-type": "application/json"}
NO_RETRY = ClientOptions(retry=RetryPolicy(attempts=1), timeout=60)
HTTP = HttpConfig(port=0)
KEYS = {"key-acme": frozenset({"acme"}), "key-admin": frozenset({"*"})}


@pytest.fixture(scope="module")
def server(any_pipeline):
    s = BackgroundServer(any_pipeline, ServerConfig(port=0), http=HTTP)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def local(pipeline):
    s = BackgroundServer(pipeline, ServerConfig(port=0), http=HTTP)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def keyed(pipeline):
    s = BackgroundServer(pipeline, ServerConfig(port=0), api_keys=KEYS, http=HTTP)
    yield s
    s.stop()


def _post(server, path: str, body, **kw) -> httpx.Response:
    return httpx.post(server.http_url + path, json=body, timeout=60, **kw)


def test_retrieve_over_http_equals_grpc(server, sample_queries):
    """Both backends: the same passages, scores, stage ranks and skips as the gRPC call; proto3 JSON on the wire."""
    with RetrieverClient(server.target, NO_RETRY) as c:
        for q in list(sample_queries.values())[:5]:
            g = c.retrieve(q, 5, bypass_cache=True)
            r = _post(server, "/v1/retrieve", {"query": q, "top_k": 5, "bypass_cache": True})
            assert r.status_code == 200 and len(r.headers["x-request-id"]) == 16
            body = r.json()
            assert [p["doc_id"] for p in body["passages"]] == [p.doc_id for p in g.passages]
            assert [p["score"] for p in body["passages"]] == pytest.approx([p.score for p in g.passages], rel=1e-6)
            assert [[(s["stage"], s["rank"]) for s in p["stages"]] for p in body["passages"]] == \
                [[(s.stage, s.rank) for s in p.stages] for p in g.passages]
            assert body["passages"][0]["chunk_id"] == str(g.passages[0].chunk_id)  # opaque ids stay strings
            assert body["index_generation"] == g.index_generation and isinstance(body["index_generation"], int)
            assert body["stages_run"] == list(g.stages_run) and body["request_id"] == r.headers["x-request-id"]


def test_the_written_out_json_of_retrieve_is_json_formats(any_pipeline, sample_queries):
    """The door's fast RetrieveResponse -> JSON is exactly proto3's mapping (json_format), int64 rule included."""
    from google.protobuf import json_format

    from retrieval.serving.answers import to_response
    from retrieval.serving.http.convert import _numbers, retrieve_json

    for q in list(sample_queries.values())[:8]:
        m = to_response(any_pipeline.search(q, 10), "r" * 16)
        canonical = json_format.MessageToDict(m, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        assert retrieve_json(m) == _numbers(canonical, m.DESCRIPTOR)


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"query": ""}, 400, "query is empty"),  # the gRPC door's message, word for word
    ({"query": "bees", "top_k": 1000}, 400, "top_k must be in [1, 100], got 1000"),
    ({"query": "bees", "options": {"stages": ["bm25", "splade"]}}, 400, "allowed: ['bm25'"),
    ({"query": "bees", "filters": {"": "x"}}, 400, "metadata filter keys must be non-empty"),
    ({"query": "bees", "topk": 3}, 400, "unknown field 'topk'; known: ['query', 'top_k'"),
    ({"query": "bees", "options": {"li_topk": 3}}, 400, "RetrieveRequest.options: unknown field 'li_topk'"),
    ({"query": "bees", "top_k": "many"}, 400, "RetrieveRequest.top_k must be an integer, got the string 'many'"),
    ({"query": "bees", "top_k": [1]}, 400, "RetrieveRequest.top_k must be an integer, got a list"),
    ({"query": 7}, 400, "RetrieveRequest.query must be a string, got an integer"),
    (["bees"], 400, "RetrieveRequest must be a JSON object, got list"),
    ({"query": "x" * 40_000}, 400, "at most 32768 are allowed"),
])
def test_bad_input_gets_its_status_and_the_grpc_message(local, body, status, message):
    r = _post(local, "/v1/retrieve", body)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["code"] == status and err["status"] == "INVALID_ARGUMENT" and message in err["message"]
    assert err["type"] == "invalid_request_error" and len(r.json()["request_id"]) == 16


def test_the_door_answers_without_nagle(local):
    """Every accepted connection has TCP_NODELAY: with Nagle on, a response written as headers then body waited for
    the client's delayed ACK, ~40 ms an answer (bench.load found it: /healthz at 44 ms p50)."""
    import socket

    with httpx.Client(base_url=local.http_url, timeout=30) as client:  # keep-alive: the connection stays open
        assert client.get("/healthz").status_code == 200
        connections = list(local.running.http.server.server_state.connections)
        assert connections
        for conn in connections:
            sock = conn.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_transport_errors_have_their_status(local):
    u = local.http_url
    r = httpx.post(u + "/v1/retrieve", content=b"{not json", headers=JSON, timeout=30)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(u + "/v1/retrieve", content=b"{not json", timeout=30)  # no content type: refused unread
    assert r.status_code == 415 and "content-type: application/json" in r.json()["error"]["message"]
    r = httpx.post(u + "/v1/retrieve", content=b"x" * (17 * 2**20), headers=JSON, timeout=30)  # over max_body_mb
    assert r.status_code == 413 and "at most 16777216 are allowed" in r.json()["error"]["message"]
    r = httpx.get(u + "/v1/nothing", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
    r = httpx.get(u + "/v1/retrieve", timeout=30)
    assert r.status_code == 405
    r = _post(local, "/v1/retrieve", {"query": "bees"}, headers={"x-timeout-ms": "soon"})
    assert r.status_code == 400 and "x-timeout-ms must be a number of milliseconds" in r.json()["error"]["message"]
    r = _post(local, "/v1/retrieve", {"query": "bees"}, headers={"x-timeout-ms": "0"})
    assert r.status_code == 504 and r.json()["error"]["status"] == "DEADLINE_EXCEEDED"
    r = _post(local, "/v1/documents", {"documents": [{"id": "a", "text": "b"}]})
    assert r.status_code == 501 and "--store" in r.json()["error"]["message"]
    r = _post(local, "/v1/generate", {"retrieve": {"query": "bees"}})
    assert r.status_code == 503 and "generation is not set up" in r.json()["error"]["message"]


def test_a_deadline_degrades_the_cascade_as_over_grpc(local, sample_queries):
    """x-timeout-ms is the call's deadline, passed to the pipeline like gRPC's: a long one changes nothing."""
    q = list(sample_queries.values())[0]
    r = _post(local, "/v1/retrieve", {"query": q, "bypass_cache": True}, headers={"x-timeout-ms": "30000"})
    assert r.status_code == 200 and not r.json()["degraded"]


def test_keys_are_bound_to_tenants_as_over_grpc(keyed):
    def retrieve(headers, tenant=""):
        return _post(keyed, "/v1/retrieve", {"query": "how do bees find flowers", "top_k": 3, "tenant": tenant},
                     headers=headers)

    r = retrieve({})
    assert r.status_code == 401 and "an API key is required" in r.json()["error"]["message"]
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert retrieve({"authorization": "Bearer nope"}).status_code == 401
    r = retrieve({"authorization": "Bearer key-acme"})
    assert r.status_code == 403 and "bound to tenants ['acme']" in r.json()["error"]["message"]
    r = retrieve({"authorization": "Bearer key-acme"}, tenant="globex")
    assert r.status_code == 403 and "may not access tenant 'globex'" in r.json()["error"]["message"]
    r = retrieve({"authorization": "Bearer key-acme"}, tenant="acme")
    assert r.status_code == 200 and all(p["tenant"] == "acme" for p in r.json()["passages"])
    assert retrieve({"x-api-key": "key-acme"}, tenant="acme").status_code == 200  # the gRPC header works too
    assert retrieve({"authorization": "Bearer key-admin"}).status_code == 200
    assert httpx.get(keyed.http_url + "/v1/status", timeout=30).status_code == 401
    st = httpx.get(keyed.http_url + "/v1/status", headers={"authorization": "Bearer key-acme"}, timeout=30)
    assert st.status_code == 200 and st.json()["documents"] > 0
    emb = _post(keyed, "/v1/embeddings", {"input": "bees"})
    assert emb.status_code == 401
    # health, readiness and the page need no key
    assert httpx.get(keyed.http_url + "/readyz", timeout=30).status_code == 200


def test_admission_slots_are_shared_by_both_doors(pipeline, sample_queries):
    """max_in_flight = 2 for the process: concurrent HTTP and gRPC calls draw on the same slots, and those over
    the limit get 429 (HTTP) / RESOURCE_EXHAUSTED (gRPC) at once, with the same message."""
    import grpc

    from retrieval.client import AsyncRetrieverClient

    s = BackgroundServer(pipeline, ServerConfig(port=0, max_in_flight=2), http=HTTP)
    queries = list(sample_queries.values())

    async def main():
        async with httpx.AsyncClient(timeout=60) as h, AsyncRetrieverClient(s.target, NO_RETRY) as g:
            http_calls = [h.post(s.http_url + "/v1/retrieve", json={"query": queries[i % len(queries)],
                                                                     "bypass_cache": True}) for i in range(12)]
            grpc_calls = [g.retrieve(queries[i % len(queries)], 5, bypass_cache=True) for i in range(12)]
            return await asyncio.gather(*http_calls, *grpc_calls, return_exceptions=True)

    try:
        out = asyncio.run(main())
        http_out, grpc_out = out[:12], out[12:]
        refused = [r for r in http_out if r.status_code == 429]
        assert refused and all(r.status_code in (200, 429) for r in http_out)
        assert "overloaded" in refused[0].json()["error"]["message"] and refused[0].headers["retry-after"] == "1"
        grpc_refused = [e for e in grpc_out if isinstance(e, grpc.aio.AioRpcError)]
        assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in grpc_refused)
        assert sum(r.status_code == 200 for r in http_out) + sum(isinstance(r, pb.RetrieveResponse) for r in grpc_out) >= 2
        assert s.running.state.in_flight == 0
    finally:
        s.stop()


def test_writes_over_http(writable, config, embedder):
    """Upsert, then retrieve finds it at once; another tenant's write is refused with nothing written; delete by
    query parameters; rebuild needs a key for all tenants."""
    from tests.retrieval.serving.test_server import _writable

    store, seq, p, live = _writable(writable, config, embedder)
    s = BackgroundServer(p, ServerConfig(port=0), api_keys=KEYS, http=HTTP, writer=live)
    acme = {"authorization": "Bearer key-acme"}
    try:
        doc = {"id": "new-1", "tenant": "acme", "title": "Axolotl regeneration",
               "text": "Axolotls regrow whole limbs from a blastema of dedifferentiated cells.", "metadata": {"kind": "x"}}
        r = _post(s, "/v1/documents", {"documents": [doc]}, headers=acme)
        assert r.status_code == 200 and r.json() == {"sequence": seq + 1, "upserted": 1}
        hit = _post(s, "/v1/retrieve", {"query": "how do axolotls regrow limbs", "top_k": 3, "tenant": "acme"},
                    headers=acme).json()
        assert hit["passages"][0]["doc_id"] == "new-1" and hit["passages"][0]["metadata"] == {"kind": "x"}
        r = _post(s, "/v1/documents", {"documents": [{"id": "x", "tenant": "globex", "text": "t"}]}, headers=acme)
        assert r.status_code == 403 and store.last_seq() == seq + 1
        r = _post(s, "/v1/documents", {"documents": [{"id": "ok", "tenant": "acme", "text": "fine"},
                                                     {"id": "bad", "tenant": "acme", "text": " "}]}, headers=acme)
        assert r.status_code == 400 and "document 1 ('bad')" in r.json()["error"]["message"]
        assert _post(s, "/v1/documents", {"documents": [doc]}).status_code == 401  # no key: before the body
        r = httpx.delete(s.http_url + "/v1/documents", params={"ids": ["new-1"], "tenant": "acme"}, headers=acme,
                         timeout=30)
        assert r.status_code == 200 and r.json()["deleted"] == 1
        hit = _post(s, "/v1/retrieve", {"query": "how do axolotls regrow limbs", "top_k": 10, "tenant": "acme"},
                    headers=acme).json()
        assert "new-1" not in [p["doc_id"] for p in hit["passages"]]
        r = httpx.delete(s.http_url + "/v1/documents", params={"id": "x"}, headers=acme, timeout=30)
        assert r.status_code == 400 and "unknown query parameter(s) ['id']" in r.json()["error"]["message"]
        assert httpx.post(s.http_url + "/v1/rebuild", headers=acme, timeout=30).status_code == 403
        r = httpx.post(s.http_url + "/v1/rebuild", headers={"authorization": "Bearer key-admin"}, timeout=300)
        assert r.status_code == 200 and r.json()["generation"] == 2
    finally:
        s.stop()
        p.close()
        live.close()


def test_readiness_before_the_index_loads():
    s = BackgroundServer(None, ServerConfig(port=0), http=HTTP)
    try:
        s.run(s.running.set_serving(False))
        assert httpx.get(s.http_url + "/healthz", timeout=30).status_code == 200
        r = httpx.get(s.http_url + "/readyz", timeout=30)
        assert r.status_code == 503 and r.json()["status"] == "loading"
        r = httpx.post(s.http_url + "/v1/retrieve", json={"query": "bees"}, timeout=30)
        assert r.status_code == 503 and "not loaded yet" in r.json()["error"]["message"]
    finally:
        s.stop()


def test_openapi_describes_the_proto_and_answers_match_it(local):
    spec = httpx.get(local.http_url + "/openapi.json", timeout=30).json()
    for path in ("/v1/retrieve", "/v1/generate", "/v1/documents", "/v1/status", "/v1/chat/completions",
                 "/v1/embeddings", "/v1/rerank", "/healthz", "/readyz"):
        assert path in spec["paths"], path
    schemas = spec["components"]["schemas"]
    assert set(schemas["RetrieveRequest"]["properties"]) == {f.name for f in pb.RetrieveRequest.DESCRIPTOR.fields}
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    answer = _post(local, "/v1/retrieve", {"query": "how do bees find flowers", "top_k": 3}).json()
    resolver = {"components": spec["components"], **schemas["RetrieveResponse"]}
    jsonschema.validate(answer, resolver)  # every field, with its type, as the document says
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**answer, "extra": 1}, resolver)


def test_http_calls_are_in_the_same_metrics(local):
    metric = local.running.state.metrics.registry.get_sample_value
    labels = {"method": "Retrieve", "code": "OK", "transport": "http"}
    before = metric("hybridrag_requests_total", labels) or 0.0
    bad = metric("hybridrag_requests_total", {**labels, "code": "INVALID_ARGUMENT"}) or 0.0
    assert _post(local, "/v1/retrieve", {"query": "bees"}).status_code == 200
    assert _post(local, "/v1/retrieve", {"query": ""}).status_code == 400
    assert metric("hybridrag_requests_total", labels) == before + 1
    assert metric("hybridrag_requests_total", {**labels, "code": "INVALID_ARGUMENT"}) == bad + 1
    text = httpx.get(local.http_url + "/metrics", timeout=30).text
    assert 'hybridrag_requests_total{code="OK",method="Retrieve",transport="http"}' in text


def test_openai_client_embeddings_equal_the_embedder(local, pipeline):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=local.http_url + "/v1", api_key="unused", max_retries=0)
    texts = ["how do bees find flowers", "the boiling point of water falls with altitude"]
    want = pipeline.embedder.embed(texts)
    got = client.embeddings.create(input=texts, model="hybridrag")  # the client asks for base64 by default
    assert [d.index for d in got.data] == [0, 1] and got.usage.prompt_tokens > 0
    np.testing.assert_allclose(np.array([d.embedding for d in got.data]), want, atol=1e-6)
    one = client.embeddings.create(input=texts[0], model="hybridrag", encoding_format="float")
    np.testing.assert_allclose(one.data[0].embedding, want[0], atol=1e-6)
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(input=[1, 2, 3], model="hybridrag")
    assert "token ids are not accepted" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(input=texts, model="hybridrag", dimensions=64)
    assert "dimensions must be 384" in str(e.value)
    assert [m.id for m in client.models.list()] == ["hybridrag"]


def test_rerank_scores_with_the_cascade_stage(local, pipeline, sample_docs):
    """Cohere-style /v1/rerank with late interaction (the configured stage): MaxSim of the token encoder's
    vectors, equal to scoring the same texts by hand, ordered best first."""
    from rerank.maxsim import maxsim

    query = "how do bees find flowers"
    texts = [d.text for d in sample_docs[:12]]
    r = _post(local, "/v1/rerank", {"query": query, "documents": texts, "top_n": 5, "return_documents": True})
    assert r.status_code == 200 and r.json()["meta"]["stage"] == "late_interaction"
    results = r.json()["results"]
    q = pipeline.token_encoder.encode_queries([query])[0]
    want = [maxsim(q, d) for d in pipeline.token_encoder.encode_documents(texts)]
    order = list(np.argsort(-np.array(want), kind="stable")[:5])
    assert [x["index"] for x in results] == order
    assert [x["relevance_score"] for x in results] == pytest.approx([want[i] for i in order], rel=1e-4)
    assert results[0]["document"]["text"] == texts[order[0]]
    r = _post(local, "/v1/rerank", {"query": query, "documents": texts, "stage": "cross_encoder"})
    assert r.status_code == 400 and "no cross-encoder is configured" in r.json()["error"]["message"]
    r = _post(local, "/v1/rerank", {"query": query, "documents": [], "stage": "x"})
    assert r.status_code == 400 and "documents" in r.json()["error"]["message"]


def test_a_client_that_disconnects_cancels_its_call(local, sample_docs):
    """A slow call (rerank encodes 256 long documents now) whose client gives up: the server cancels it, counts
    it CANCELLED, frees its slot, and answers the next call normally."""
    metric = local.running.state.metrics.registry.get_sample_value
    labels = {"method": "Rerank", "code": "CANCELLED", "transport": "http"}
    before = metric("hybridrag_requests_total", labels) or 0.0
    texts = [" ".join(d.text for d in sample_docs[i:i + 4]) for i in range(256)]
    with pytest.raises(httpx.TimeoutException):
        httpx.post(local.http_url + "/v1/rerank", json={"query": "bees", "documents": texts}, timeout=0.3)
    for _ in range(300):
        if (metric("hybridrag_requests_total", labels) or 0.0) == before + 1:
            break
        asyncio.run(asyncio.sleep(0.02))
    assert metric("hybridrag_requests_total", labels) == before + 1
    assert local.running.state.in_flight == 0
    assert _post(local, "/v1/retrieve", {"query": "bees"}).status_code == 200


def test_serve_with_http_port_serves_both_doors(sample_index_dir):
    """``hybridrag serve --http-port 0``: the process logs its HTTP URL and answers REST and gRPC from one core."""
    import re

    from tests.helpers import ServeProcess

    proc = ServeProcess(["--index", str(sample_index_dir), "--http-port", "0"], clean_env=True,
                        env={"HYBRIDRAG_GENERATION__EMBEDDED__ENABLED": "false"})
    try:
        (url,) = re.findall(r"HTTP on (http://\S+)", proc.text())
        r = httpx.post(url + "/v1/retrieve", json={"query": "how do bees find flowers", "top_k": 3}, timeout=60)
        with RetrieverClient(proc.target, NO_RETRY) as c:
            g = c.retrieve("how do bees find flowers", 3)
        assert r.status_code == 200 and [p["doc_id"] for p in r.json()["passages"]] == [p.doc_id for p in g.passages]
        assert httpx.get(url + "/readyz", timeout=30).status_code == 200
        page = httpx.get(url + "/playground", timeout=30)
        assert page.status_code == 200 and 'id="query"' in page.text
        assert json.loads(httpx.get(url + "/v1/status", timeout=30).text)["documents"] > 0
    finally:
        assert proc.stop() == 0
