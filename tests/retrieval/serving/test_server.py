"""The gRPC service against a real server on a free loopback port, serving the sample index with the real model."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from retrieval.api import retriever_pb2 as pb
from retrieval.app import open_index
from retrieval.client import AsyncRetrieverClient, ClientOptions, RetrieverClient, RetryPolicy
from retrieval.config import ServerConfig
from retrieval.search.pipeline import Pipeline
from retrieval.serving.core import SERVICE
from retrieval.serving.server import BackgroundServer
from tests.helpers import CE_MODEL

NO_RETRY = RetryPolicy(attempts=1)


@pytest.fixture(scope="module")
def server(any_pipeline):
    """One server per backend (the local snapshot, the Qdrant engine): every test below runs on both."""
    s = BackgroundServer(any_pipeline, ServerConfig(port=0))
    yield s
    s.stop()


def _client(server, **kw) -> RetrieverClient:
    return RetrieverClient(server.target, ClientOptions(retry=NO_RETRY, **kw))


def _ids(response: pb.RetrieveResponse) -> list[str]:
    return [p.doc_id for p in response.passages]


def test_retrieve_equals_the_library(server, any_pipeline, sample_queries):
    with _client(server) as c:
        for q in list(sample_queries.values())[:6]:
            r = c.retrieve(q, 10)
            lib = any_pipeline.search(q, 10)
            assert _ids(r) == [any_pipeline.index.documents[d].id for d in lib.hits.doc]
            assert r.index_generation == lib.generation and len(r.request_id) == 16 and not r.degraded
            assert set(r.stages_run) == {"bm25", "dense", "late_interaction"} and r.timings_ms["total"] > 0
            top = r.passages[0]
            assert top.text and {s.stage for s in top.stages} >= {"fused", "late_interaction"}
        status = c.status()
        assert status.documents == len(any_pipeline.index.documents) and status.dense_available
        assert status.late_interaction_available and status.generation == any_pipeline.index.generation


def test_health_and_reflection(server):
    with grpc.insecure_channel(server.target) as ch:
        h = health_pb2_grpc.HealthStub(ch)
        for name in ("", SERVICE):
            assert h.Check(health_pb2.HealthCheckRequest(service=name)).status == health_pb2.HealthCheckResponse.SERVING
        r = reflection_pb2_grpc.ServerReflectionStub(ch)
        (resp,) = list(r.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
        names = {s.name for s in resp.list_services_response.service}
        assert {"hybridrag.v1.Retriever", "grpc.health.v1.Health"} <= names


@pytest.mark.parametrize(("kwargs", "code", "message"), [
    ({"query": ""}, grpc.StatusCode.INVALID_ARGUMENT, "query is empty"),
    ({"query": "bees", "top_k": 1000}, grpc.StatusCode.INVALID_ARGUMENT, r"top_k must be in [1, 100], got 1000"),
    ({"query": "bees", "stages": ["bm25", "splade"]}, grpc.StatusCode.INVALID_ARGUMENT, "allowed: ['bm25'"),
    ({"query": "bees", "li_top_k": 500}, grpc.StatusCode.INVALID_ARGUMENT, "li_top_k must be in [1, 100], got 500"),
    ({"query": "bees", "candidates": 5000}, grpc.StatusCode.INVALID_ARGUMENT, "candidates must be in [1, 1000]"),
    ({"query": "bees", "filters": {"": "x"}}, grpc.StatusCode.INVALID_ARGUMENT, "metadata filter keys must be non-empty"),
    ({"query": "x" * 40_000}, grpc.StatusCode.INVALID_ARGUMENT, "at most 32768 are allowed"),
])
def test_bad_input_gets_its_status_and_a_message(server, kwargs, code, message):
    with _client(server) as c, pytest.raises(grpc.RpcError) as e:
        c.retrieve(**kwargs)
    assert e.value.code() == code and message in e.value.details()


def test_unimplemented_and_deadline(server):
    with _client(server) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.upsert([pb.Document(id="a", text="b")])
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED and "--store" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:  # past the cache: the query must be embedded (ms), not a cached
            c.retrieve("bees", 10, timeout=0.0005, bypass_cache=True)  # repeat a solo search answers in ~0.1 ms
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_64_concurrent_clients_all_get_correct_answers(server, any_pipeline, sample_queries):
    queries = [list(sample_queries.values())[i % len(sample_queries)] for i in range(64)]
    expected = {q: [any_pipeline.index.documents[d].id for d in any_pipeline.search(q, 5).hits.doc] for q in set(queries)}

    async def main() -> list[pb.RetrieveResponse]:
        clients = [AsyncRetrieverClient(server.target, ClientOptions(retry=NO_RETRY, timeout=60)) for _ in range(64)]
        try:
            return await asyncio.gather(*(c.retrieve(q, 5) for c, q in zip(clients, queries, strict=True)))
        finally:
            await asyncio.gather(*(c.close() for c in clients))

    responses = asyncio.run(main())
    for q, r in zip(queries, responses, strict=True):
        assert _ids(r) == expected[q]


def test_overload_fails_fast_with_resource_exhausted(pipeline, sample_queries):
    s = BackgroundServer(pipeline, ServerConfig(port=0, max_in_flight=2))
    queries = list(sample_queries.values())

    async def main():
        async with AsyncRetrieverClient(s.target, ClientOptions(retry=NO_RETRY, timeout=60)) as c:
            return await asyncio.gather(*(c.retrieve(queries[i % len(queries)], 5) for i in range(24)),
                                        return_exceptions=True)

    try:
        results = asyncio.run(main())
    finally:
        s.stop()
    refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert refused and all(r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for r in refused)
    assert "max 2" in refused[0].details()
    assert any(isinstance(r, pb.RetrieveResponse) for r in results)


def test_graceful_shutdown_completes_in_flight_calls(pipeline, sample_queries):
    s = BackgroundServer(pipeline, ServerConfig(port=0))
    queries = list(sample_queries.values())[:8]

    async def main():
        async with AsyncRetrieverClient(s.target, ClientOptions(retry=NO_RETRY, timeout=60)) as c:
            calls = [asyncio.ensure_future(c.retrieve(q, 5)) for q in queries]
            await asyncio.sleep(0.05)  # the calls are on the wire
            stopping = asyncio.get_running_loop().run_in_executor(None, s.stop, 10.0)
            results = await asyncio.gather(*calls, return_exceptions=True)
            await stopping
            return results

    results = asyncio.run(main())
    assert all(isinstance(r, pb.RetrieveResponse) and len(r.passages) == 5 for r in results), results
    with _client(s) as c, pytest.raises(grpc.RpcError) as e:
        c.retrieve("bees", 5, timeout=2)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def _self_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hybridrag-test")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls(pipeline, tmp_path):
    cert, key = _self_signed(tmp_path)
    s = BackgroundServer(pipeline, ServerConfig(port=0, tls_cert=str(cert), tls_key=str(key)))
    try:
        target = f"localhost:{s.running.port}"
        with RetrieverClient(target, ClientOptions(tls_ca=str(cert), retry=NO_RETRY)) as c:
            assert len(c.retrieve("how do bees find flowers", 3).passages) == 3
        with RetrieverClient(target, ClientOptions(retry=NO_RETRY, timeout=3)) as plain, pytest.raises(grpc.RpcError) as e:
            plain.retrieve("bees", 3)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        s.stop()


def test_api_keys_bind_callers_to_their_tenants(pipeline, sample_queries, tmp_path):
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({"key-acme": ["acme"], "key-two": ["globex", "initech"], "key-admin": ["*"]}))
    s = BackgroundServer(pipeline, ServerConfig(port=0, api_keys_file=str(keys_file)))
    try:
        def call(key: str, tenant: str, query: str = "energy", k: int = 10):
            with _client(s, api_key=key) as c:
                return c.retrieve(query, k, tenant=tenant)

        for key, tenant, code in (("", "acme", grpc.StatusCode.UNAUTHENTICATED),
                                  ("nope", "acme", grpc.StatusCode.UNAUTHENTICATED),
                                  ("key-acme", "globex", grpc.StatusCode.PERMISSION_DENIED),
                                  ("key-acme", "", grpc.StatusCode.PERMISSION_DENIED)):
            with pytest.raises(grpc.RpcError) as e:
                call(key, tenant)
            assert e.value.code() == code, (key, tenant)
        assert len(call("key-admin", "").passages) == 10
        # Property: over random keys, tenants and queries, a caller never sees another tenant's document.
        rng = random.Random(7)
        tenant_of = {d.id: d.tenant for d in pipeline.index.documents}
        allowed = {"key-acme": {"acme"}, "key-two": {"globex", "initech"}}
        queries = list(sample_queries.values())
        for _ in range(40):
            key = rng.choice(sorted(allowed))
            tenant = rng.choice(["acme", "globex", "initech"])
            query = rng.choice(queries)
            if tenant not in allowed[key]:
                with pytest.raises(grpc.RpcError) as e:
                    call(key, tenant, query)
                assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
                continue
            r = call(key, tenant, query, k=rng.choice([1, 5, 20]))
            assert r.passages and {tenant_of[p.doc_id] for p in r.passages} == {tenant}
    finally:
        s.stop()


def test_unavailable_until_the_index_is_loaded():
    s = BackgroundServer(None, ServerConfig(port=0))
    try:
        s.run(s.running.set_serving(False))
        with grpc.insecure_channel(s.target) as ch:
            h = health_pb2_grpc.HealthStub(ch)
            assert h.Check(health_pb2.HealthCheckRequest(service=SERVICE)).status == \
                health_pb2.HealthCheckResponse.NOT_SERVING
        with _client(s) as c, pytest.raises(grpc.RpcError) as e:
            c.retrieve("bees", 5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "not loaded" in e.value.details()
    finally:
        s.stop()




@pytest.mark.skipif(not CE_MODEL.is_dir(), reason="../shared/models/ce-minilm-l6-beir-train is absent")
@pytest.mark.parametrize("solo", [True, False], ids=["solo", "batched"])
def test_a_cancelled_call_stops_its_work(sample_index, embedder, config, solo):
    """A lone call runs solo (its models on one thread) by default; either way a cancelled call's cross-encoder
    pairs not yet started are never scored."""
    import dataclasses

    from index_builder.models.encoders import CrossEncoder
    from index_builder.settings import CrossEncoderConfig
    from retrieval.search.batching import BatcherConfig
    from retrieval.search.pipeline import Pipeline

    small = BatcherConfig(max_batch_size=4, max_wait_ms=0, max_concurrent_batches=1)
    # the stage's old, slow form (fp32 whole passages, never gated): the call is still scoring when it is cancelled
    cfg = dataclasses.replace(config, batching=dataclasses.replace(config.batching, cross_encoder=small),
                              first_stage=dataclasses.replace(config.first_stage, solo_when_idle=solo),
                              rerank=dataclasses.replace(config.rerank, ce_window_tokens=0, ce_gate_gap=0.0))
    p = Pipeline(sample_index, embedder, cfg,
                 cross_encoder=CrossEncoder(CrossEncoderConfig(model=str(CE_MODEL), precision="fp32")))
    s = BackgroundServer(p, ServerConfig(port=0))
    stages = ["bm25", "dense", "cross_encoder"]
    try:
        async def main():
            async with AsyncRetrieverClient(s.target, ClientOptions(retry=NO_RETRY, timeout=60)) as c:
                call = asyncio.ensure_future(c.retrieve("how do bees find flowers", 10, stages=stages, ce_top_k=60))
                for _ in range(200):  # wait until the cross-encoder has started on this request's pairs
                    await asyncio.sleep(0.02)
                    if p.batcher_stats()["cross_encoder"]["batches"] >= 1:
                        break
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call
        asyncio.run(main())
        time.sleep(1.0)  # let the batch that was running finish
        stats = p.batcher_stats()["cross_encoder"]
        assert stats["items"] < 60 and stats["dropped"] > 0, stats  # the rest of its pairs were never scored
        assert p.solo_runs == int(solo) and (stats["direct"] == stats["batches"]) == solo
    finally:
        s.stop()
        p.close()


def test_serve_command_loads_serves_and_drains_on_sigterm(sample_index_dir):
    """``hybridrag serve`` as users run it: a subprocess on a free port; health turns SERVING after the load;
    SIGTERM drains and exits 0."""
    import re
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "hybridrag", "serve", "--index", str(sample_index_dir),
                             "--port", "0", "--metrics-port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        port = None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            m = re.search(r"serving .* on port (\d+)", line)
            if m:
                port = int(m.group(1))
                break
        assert port, "".join(lines)
        assert any("listening" in ln for ln in lines)  # it listened (NOT_SERVING) before the index was loaded
        metrics_url = "http://" + re.search(r"metrics on (\S+/metrics)", "".join(lines)).group(1)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=SERVICE)).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        with RetrieverClient(f"127.0.0.1:{port}", ClientOptions(retry=NO_RETRY)) as c:
            assert len(c.retrieve("how do bees find flowers", 3).passages) == 3
        text = httpx.get(metrics_url, timeout=10).text  # the served process's own /metrics
        assert 'hybridrag_requests_total{code="OK",method="Retrieve",transport="grpc"} 1.0' in text
        assert 'hybridrag_stage_duration_seconds_count{stage="dense"} 1.0' in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "draining" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_api_keys_from_file_and_environment(tmp_path):
    from index_builder.errors import ConfigError
    from retrieval.serving.auth import load_api_keys

    f = tmp_path / "keys.json"
    f.write_text('{"k1": ["acme"]}')
    assert load_api_keys(str(f), '{"k2": ["*"]}') == {"k1": frozenset({"acme"}), "k2": frozenset({"*"})}
    with pytest.raises(ConfigError, match="HYBRIDRAG_API_KEYS are not valid JSON"):
        load_api_keys("", "{nope")
    with pytest.raises(ConfigError, match="must map each key to a list of tenants"):
        load_api_keys("", '{"k": "acme"}')
    with pytest.raises(ConfigError, match="not found"):
        load_api_keys(str(tmp_path / "missing.json"))


def _writable(tmp_path, config, embedder):
    """The writable sample copy (store seeded with the sample corpus, snapshot built from it) and a live index."""
    from index_builder.models.token_encoders import EmbedderTokens
    from retrieval.live.live_index import LiveIndex
    from retrieval.live.store import DocumentStore
    from retrieval.search.index import SearchIndex
    from retrieval.search.pipeline import Pipeline

    store = DocumentStore(tmp_path / "store.db")
    seq = store.last_seq()
    p = Pipeline(SearchIndex.load(tmp_path / "index", config, embedder), embedder, config)
    live = LiveIndex(p.index, store, embedder, EmbedderTokens(embedder), config)
    live.on_publish(p.publish)
    return store, seq, p, live


@pytest.mark.parametrize("backend", ["local", "qdrant"])
def test_writes_over_grpc_are_durable_visible_and_checked(backend, writable, config, embedder):
    """Upsert and Delete with the same answers on both backends: the live index over the document store, and
    the engine (where an acknowledged write is in Qdrant's WAL and nothing is buffered)."""
    if backend == "local":
        store, seq, p, live = _writable(writable, config, embedder)
        buffered = 1

        def written(doc_id: str) -> bool:
            return store.get(doc_id) is not None
    else:
        from retrieval.app import open_writes
        from tests.conftest import engine_config

        cfg = engine_config(config)
        p = Pipeline(open_index(writable / "index", cfg, embedder), embedder, cfg)
        live, seq, buffered = open_writes(p, cfg, None), 0, 0

        def written(doc_id: str) -> bool:
            return bool(p.index.engine.owners([doc_id]))
    keys = {"key-acme": frozenset({"acme"}), "key-admin": frozenset({"*"})}
    s = BackgroundServer(p, ServerConfig(port=0), api_keys=keys, writer=live)
    new = pb.Document(id="new-1", tenant="acme", title="Axolotl regeneration",
                      text="Axolotls regrow whole limbs from a blastema of dedifferentiated cells.")
    try:
        with _client(s, api_key="key-acme") as c:
            r = c.upsert([new])
            assert r.upserted == 1 and r.sequence == seq + 1
            hit = c.retrieve("how do axolotls regrow limbs", 3, tenant="acme")
            assert hit.passages[0].doc_id == "new-1" and c.status().buffered_writes == buffered
            with pytest.raises(grpc.RpcError) as e:  # another tenant's document: refused, nothing written
                c.upsert([pb.Document(id="x", tenant="globex", text="t")])
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.RpcError) as e:
                c.upsert([pb.Document(id="ok", tenant="acme", text="fine"), pb.Document(id="bad", tenant="acme", text=" ")])
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "document 1 ('bad')" in e.value.details()
            assert not written("ok") and written("new-1")
            d = c.delete(["new-1"], tenant="acme")
            assert d.deleted == 1
            assert "new-1" not in [x.doc_id for x in c.retrieve("how do axolotls regrow limbs", 10, tenant="acme").passages]
            assert not written("new-1") and c.status().backend == ("local snapshot" if backend == "local" else
                                                                   "qdrant :memory: collection=hybridrag")
    finally:
        s.stop()
        p.close()


def test_rebuild_call_and_bm25_fallback_after_a_restart_without_hnsw(tmp_path, writable, config, embedder):
    """Rebuild over gRPC swaps in a new generation; then the HNSW file of the current snapshot is deleted and the
    index reloaded (a restart): BM25 answers alone, and the response and the status say so."""
    from index_builder.snapshot.format import current_snapshot_dir
    from retrieval.search.index import SearchIndex
    from retrieval.search.pipeline import Pipeline

    store, seq, p, live = _writable(writable, config, embedder)
    s = BackgroundServer(p, ServerConfig(port=0), writer=live)
    live.on_rebuild(s.running.state.metrics.observe_rebuild)  # as retrieval.app.serve wires the live index
    metric = s.running.state.metrics.registry.get_sample_value
    try:
        with _client(s) as c:
            c.upsert([pb.Document(id="new-1", tenant="acme", text="Axolotls regrow whole limbs from a blastema.")])
            assert metric("hybridrag_buffered_writes") == 1 and metric("hybridrag_index_generation") == 1
            r = c.rebuild()
            assert r.generation == 2 and r.covered_sequence == seq + 1 and r.still_buffered == 0
            assert metric("hybridrag_rebuilds_total", {"outcome": "ok"}) == 1
            assert metric("hybridrag_rebuild_duration_seconds_count") == 1
            assert metric("hybridrag_buffered_writes") == 0 and metric("hybridrag_index_generation") == 2
            assert metric("hybridrag_requests_total", {"method": "Rebuild", "code": "OK", "transport": "grpc"}) == 1
            assert c.retrieve("axolotl limbs blastema", 1).passages[0].doc_id == "new-1"
    finally:
        s.stop()
        p.close()
    (current_snapshot_dir(tmp_path / "index") / "hnsw.faiss").chmod(0o644)
    (current_snapshot_dir(tmp_path / "index") / "hnsw.faiss").unlink()
    p = Pipeline(SearchIndex.load(tmp_path / "index", config, embedder), embedder, config)
    s = BackgroundServer(p, ServerConfig(port=0))
    try:
        with _client(s) as c:
            r = c.retrieve("axolotl limbs blastema", 3)
            assert r.degraded and r.passages[0].doc_id == "new-1"
            assert any(x.stage == "dense" and "unavailable" in x.reason for x in r.skipped)
            st = c.status()
            assert not st.dense_available and "hnsw.faiss" in st.dense_error
    finally:
        s.stop()
        p.close()
