"""Metrics and tracing against a real server on loopback: /metrics scraped over HTTP, spans read from an in-memory
exporter. The pipeline is the real one over the sample index (with a semantic cache, so its counters move too)."""

from __future__ import annotations

import grpc
import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client.parser import text_string_to_metric_families

from retrieval.client import ClientOptions, RetrieverClient, RetryPolicy
from retrieval.config import ServerConfig
from retrieval.observability.tracing import TracingConfig, make_tracing
from retrieval.search.pipeline import Pipeline
from retrieval.search.semantic_cache import SemanticCache
from retrieval.serving.metrics import MetricsConfig
from retrieval.serving.server import BackgroundServer

NO_RETRY = ClientOptions(retry=RetryPolicy(attempts=1))


@pytest.fixture(scope="module")
def traced(sample_index, embedder, config):
    """A server with /metrics on a free port and an in-memory span exporter, over its own pipeline."""
    exporter = InMemorySpanExporter()
    tracing = make_tracing(TracingConfig(), exporter=exporter)
    p = Pipeline(sample_index, embedder, config, cache=SemanticCache(config.cache), tracer=tracing.tracer)
    s = BackgroundServer(p, ServerConfig(port=0), metrics=MetricsConfig(port=0), tracer=tracing.tracer)
    yield s, p, exporter
    s.stop()
    p.close()
    tracing.shutdown()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics as {(name, sorted labels): value}."""
    r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def test_metrics_endpoint_moves_with_requests(traced, sample_queries):
    s, p, _ = traced
    port = s.running.metrics_port
    assert port and port != s.running.port
    before = scrape(port)
    queries = list(sample_queries.values())[:4]
    with RetrieverClient(s.target, NO_RETRY) as c:
        for q in queries:
            c.retrieve(q, 5, bypass_cache=True)
        c.retrieve(queries[0], 5)  # fills the cache (miss)
        assert c.retrieve(queries[0], 5).cache_hit  # then answers from it
        with pytest.raises(grpc.RpcError) as e:
            c.retrieve(" ", 5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = scrape(port)

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved("hybridrag_requests_total", method="Retrieve", code="OK", transport="grpc") == 6
    assert moved("hybridrag_requests_total", method="Retrieve", code="INVALID_ARGUMENT", transport="grpc") == 1
    assert moved("hybridrag_request_duration_seconds_count", method="Retrieve", transport="grpc") == 7
    # The stage histograms: every full search ran these stages (the exact cache hit only looks up).
    for stage in ("bm25", "dense", "fusion", "late_interaction"):
        assert moved("hybridrag_stage_duration_seconds_count", stage=stage) == 5, stage
        assert moved("hybridrag_stage_duration_seconds_sum", stage=stage) > 0, stage
    assert moved("hybridrag_stage_duration_seconds_count", stage="embed") == 5  # an exact repeat is answered before embedding
    assert moved("hybridrag_stage_duration_seconds_count", stage="total") == 6
    # A slow bucket never holds fewer observations than a faster one (the histogram is cumulative).
    le = sorted(((float(dict(k[1])["le"]), v) for k, v in after.items()
                 if k[0] == "hybridrag_stage_duration_seconds_bucket" and dict(k[1])["stage"] == "bm25"))
    assert [v for _, v in le] == sorted(v for _, v in le) and le[-1][1] == after[
        ("hybridrag_stage_duration_seconds_count", (("stage", "bm25"),))]
    assert moved("hybridrag_cache_lookups_total", result="hit") == 1
    assert moved("hybridrag_cache_lookups_total", result="miss") == 1
    assert after[("hybridrag_semantic_cache_hit_ratio", ())] > 0
    # Model batches: every embedding went through the embed batcher, sizes >= 1.
    assert moved("hybridrag_batch_size_count", model="embed") >= 1
    assert moved("hybridrag_batch_size_sum", model="embed") == 5
    assert moved("hybridrag_batch_queue_wait_seconds_count", model="embed") == 5
    assert after[("hybridrag_in_flight_requests", ())] == 0
    assert after[("hybridrag_index_generation", ())] == p.index.generation
    assert after[("hybridrag_index_documents", ())] == len(p.index.documents)
    assert after[("hybridrag_dense_available", ())] == 1


def test_spans_per_request_and_stage(traced, sample_queries):
    s, _, exporter = traced
    exporter.clear()
    q = next(iter(sample_queries.values()))
    with RetrieverClient(s.target, NO_RETRY) as c:
        call = c.stub.Retrieve.with_call(
            pb_request(q), timeout=30)
    response, rpc = call
    request_id = dict(rpc.trailing_metadata())["x-request-id"]
    spans = exporter.get_finished_spans()
    by_name = {sp.name: sp for sp in spans}
    root = by_name["hybridrag.Retrieve"]
    assert root.attributes["hybridrag.request_id"] == request_id == response.request_id
    assert root.attributes["rpc.grpc.status_code"] == 0 and root.parent is None
    search = by_name["hybridrag.search"]
    assert search.parent.span_id == root.context.span_id
    assert search.attributes["cache_hit"] is False and search.attributes["index.generation"] == response.index_generation
    stages = {"hybridrag.embed", "hybridrag.bm25", "hybridrag.dense", "hybridrag.fusion", "hybridrag.late_interaction"}
    assert stages <= set(by_name)
    for name in stages:
        sp = by_name[name]
        assert sp.context.trace_id == root.context.trace_id and sp.parent.span_id == search.context.span_id, name
        assert search.start_time <= sp.start_time <= sp.end_time <= search.end_time, name
    assert by_name["hybridrag.dense"].start_time >= by_name["hybridrag.embed"].end_time  # dense needs the vector
    assert set(response.timings_ms) >= {"embed", "bm25", "dense", "fusion", "late_interaction"}


def test_failed_request_span_has_the_status(traced):
    s, _, exporter = traced
    exporter.clear()
    with RetrieverClient(s.target, NO_RETRY) as c, pytest.raises(grpc.RpcError) as e:
        c.retrieve("q", 5, stages=["nope"])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    (root,) = [sp for sp in exporter.get_finished_spans() if sp.name == "hybridrag.Retrieve"]
    assert root.status.status_code == StatusCode.ERROR and "unknown stages" in root.status.description
    assert root.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert any(ev.name == "exception" for ev in root.events)


def test_config_rejects_unknown_exporter_and_port():
    with pytest.raises(ValueError, match="exporter"):
        TracingConfig(exporter="jaeger")
    with pytest.raises(ValueError, match="metrics.port"):
        MetricsConfig(port=-2)
    assert make_tracing(TracingConfig()).provider is None  # exporter "none": the no-op tracer


def pb_request(query: str):
    from retrieval.api import retriever_pb2 as pb

    return pb.RetrieveRequest(query=query, top_k=5, bypass_cache=True)


def test_otlp_exporter_delivers_the_spans_over_http(sample_index, embedder, config, sample_queries):
    """``exporter = "otlp"``: the spans reach an OTLP/HTTP receiver on loopback (decoded with the OTLP protobufs)."""
    import http.server
    import threading

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received: list[str] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802  (http.server's naming)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest.FromString(body)
            received.extend(sp.name for rs in request.resource_spans for ss in rs.scope_spans for sp in ss.spans)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    tracing = make_tracing(TracingConfig(exporter="otlp", otlp_endpoint=f"http://127.0.0.1:{httpd.server_port}/v1/traces"))
    p = Pipeline(sample_index, embedder, config, tracer=tracing.tracer)
    try:
        with BackgroundServer(p, ServerConfig(port=0), tracer=tracing.tracer) as s, RetrieverClient(s.target, NO_RETRY) as c:
            c.retrieve(next(iter(sample_queries.values())), 3)
        tracing.shutdown()  # flushes the batch processor
    finally:
        p.close()
        httpd.shutdown()
    assert {"hybridrag.Retrieve", "hybridrag.search", "hybridrag.bm25", "hybridrag.dense"} <= set(received)
