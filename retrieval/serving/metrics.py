"""Prometheus metrics of one server: its own registry, filled by the service as requests finish, served over HTTP.

What is measured, and where it comes from:

- ``hybridrag_requests_total{method,code,transport}`` and ``hybridrag_request_duration_seconds{method,transport}``:
  every call of either door (``grpc``, ``http``), by gRPC status code name, timed in the handler.
- ``hybridrag_stage_duration_seconds{stage}``: the pipeline's own per-stage timings (the ``timings_ms`` a
  response carries: embed, bm25, dense, fusion, late_interaction, cross_encoder, cache, total...).
- ``hybridrag_stage_skipped_total{stage}``, ``hybridrag_degraded_responses_total``, ``hybridrag_cache_lookups_total
  {result}``: what the pipeline skipped, answers marked degraded, semantic-cache hits and misses of Retrieve.
- ``hybridrag_batch_size{model}`` and ``hybridrag_batch_queue_wait_seconds{model}``: every cross-request model
  batch (embed, query_tokens, cross_encoder) and each item's wait for it (observer on the batcher's statistics).
- ``hybridrag_rebuild_duration_seconds`` and ``hybridrag_rebuilds_total{outcome}``: live-index rebuilds.
- ``hybridrag_generate_*``: time to first token and tokens in and out of Generate.
- Read at scrape time from the live objects (:class:`_StateCollector`): requests in flight, model queue depths,
  index generation, documents, buffered writes, whether the dense side is up, and the semantic cache's counters
  and hit ratio.

``hybridrag serve`` exposes ``/metrics`` on ``[metrics] host:port`` (``port = -1`` turns it off, 0 takes any free
port). Library code never touches the global default registry: two servers in one process do not collide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from retrieval.serving.settings import MetricsConfig  # noqa: F401  (re-exported: its section)

if TYPE_CHECKING:
    from retrieval.search.pipeline import Pipeline
    from retrieval.search.results import SearchResult

# Seconds. Stages run from ~0.1 ms (fusion, a cache lookup) to seconds (a cross-encoder on CPU under load).
STAGE_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
REQUEST_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
REBUILD_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class _StateCollector(Collector):
    """Gauges read from the serving objects when Prometheus scrapes (no bookkeeping on the request path)."""

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Any]:
        s = self.read()
        yield GaugeMetricFamily("hybridrag_in_flight_requests", "Requests being served now", value=s["in_flight"])
        pipeline: Pipeline | None = s["pipeline"]
        if pipeline is None:
            return
        index = pipeline.index
        yield GaugeMetricFamily("hybridrag_index_generation", "Generation of the snapshot being served",
                                value=index.generation)
        yield GaugeMetricFamily("hybridrag_index_documents", "Documents served (snapshot plus buffered writes)",
                                value=len(index.documents))
        yield GaugeMetricFamily("hybridrag_buffered_writes", "Writes buffered since the last rebuild (served by BM25 "
                                "and exact vector search until the next swap)", value=index.buffered)
        yield GaugeMetricFamily("hybridrag_dense_available", "1 when the dense index serves, 0 when BM25 serves alone",
                                value=float(index.dense is not None))
        depth = GaugeMetricFamily("hybridrag_model_queue_depth", "Items waiting for a model batch", labels=["model"])
        for b in pipeline.models.batchers:
            depth.add_metric([b.name], b.queue_depth)
        yield depth
        if pipeline.cache is not None:
            stats = pipeline.cache.stats()
            events = CounterMetricFamily("hybridrag_semantic_cache_events", "Semantic cache events (Retrieve and "
                                         "Generate answers)", labels=["event"])
            for name, value in stats.items():
                if name not in ("entries", "hit_ratio"):
                    events.add_metric([name], value)
            yield events
            yield GaugeMetricFamily("hybridrag_semantic_cache_entries", "Entries in the semantic cache",
                                    value=stats["entries"])
            yield GaugeMetricFamily("hybridrag_semantic_cache_hit_ratio", "Hits / lookups since the start",
                                    value=stats["hit_ratio"])


class ServiceMetrics:
    """The metrics of one server. ``read_state`` returns ``{"in_flight": int, "pipeline": Pipeline | None}``."""

    def __init__(self, read_state: Callable[[], dict[str, Any]]) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = Counter("hybridrag_requests", "Calls by method, gRPC status code and door (grpc, http)",
                                ["method", "code", "transport"], registry=r)
        self.request_seconds = Histogram("hybridrag_request_duration_seconds", "Call duration in the handler",
                                         ["method", "transport"], buckets=REQUEST_BUCKETS, registry=r)
        self.stage_seconds = Histogram("hybridrag_stage_duration_seconds", "Pipeline stage duration", ["stage"],
                                       buckets=STAGE_BUCKETS, registry=r)
        self.skipped = Counter("hybridrag_stage_skipped", "Stages skipped (deadline, unavailable, not configured)",
                               ["stage"], registry=r)
        self.degraded = Counter("hybridrag_degraded_responses", "Answers marked degraded", registry=r)
        self.cache_lookups = Counter("hybridrag_cache_lookups", "Semantic cache lookups of Retrieve", ["result"],
                                     registry=r)
        self.batch_size = Histogram("hybridrag_batch_size", "Items per model batch", ["model"], buckets=BATCH_BUCKETS,
                                    registry=r)
        self.queue_wait = Histogram("hybridrag_batch_queue_wait_seconds", "An item's wait for its model batch",
                                    ["model"], buckets=STAGE_BUCKETS, registry=r)
        self.batch_failures = Counter("hybridrag_batch_failures", "Model batches that failed", ["model"], registry=r)
        self.rebuild_seconds = Histogram("hybridrag_rebuild_duration_seconds", "Live-index rebuilds (build, load, "
                                         "swap)", buckets=REBUILD_BUCKETS, registry=r)
        self.rebuilds = Counter("hybridrag_rebuilds", "Live-index rebuilds by outcome", ["outcome"], registry=r)
        self.first_token_seconds = Histogram("hybridrag_generate_first_token_seconds", "Generate: retrieval start to "
                                             "first answer token", buckets=REQUEST_BUCKETS, registry=r)
        self.generate_tokens = Counter("hybridrag_generate_tokens", "Generate: prompt and answer tokens", ["kind"],
                                       registry=r)
        r.register(_StateCollector(read_state))
        self._http: Any = None
        self._observed: list[tuple[list[Any], Any]] = []
        self.port: int | None = None

    # ------------------------------------------------------------------ recording

    def observe_rpc(self, method: str, code: str, seconds: float, transport: str = "grpc") -> None:
        self.requests.labels(method, code, transport).inc()
        self.request_seconds.labels(method, transport).observe(seconds)

    def observe_search(self, result: SearchResult) -> None:
        for stage, ms in result.timings_ms.items():
            self.stage_seconds.labels(stage).observe(ms / 1000.0)
        for stage in result.skipped:
            self.skipped.labels(stage).inc()
        if result.degraded:
            self.degraded.inc()
        if result.cache_hit:
            self.cache_lookups.labels("hit").inc()
        elif "cache" in result.timings_ms:
            self.cache_lookups.labels("miss").inc()

    def observe_generation(self, first_token_s: float, tokens_in: int, tokens_out: int) -> None:
        self.first_token_seconds.observe(first_token_s)
        self.generate_tokens.labels("prompt").inc(tokens_in)
        self.generate_tokens.labels("completion").inc(tokens_out)

    def observe_rebuild(self, seconds: float, ok: bool) -> None:
        self.rebuild_seconds.observe(seconds)
        self.rebuilds.labels("ok" if ok else "error").inc()

    def watch_batchers(self, pipeline: Pipeline) -> None:
        """Observe every model batch of ``pipeline`` (replaces what an earlier call attached)."""
        self.unwatch_batchers()
        for b in pipeline.models.batchers:
            observer = self._batch_observer(b.name)
            b.stats.observers.append(observer)
            self._observed.append((b.stats.observers, observer))

    def unwatch_batchers(self) -> None:
        for observers, observer in self._observed:
            if observer in observers:
                observers.remove(observer)
        self._observed.clear()

    def _batch_observer(self, model: str) -> Callable[[int, Sequence[float], bool], None]:
        size, wait, failures = self.batch_size.labels(model), self.queue_wait.labels(model), self.batch_failures.labels(model)

        def observe(n: int, waits_ms: Sequence[float], failed: bool) -> None:
            size.observe(n)
            for w in waits_ms:
                wait.observe(w / 1000.0)
            if failed:
                failures.inc()

        return observe

    # ------------------------------------------------------------------ HTTP

    def start_http(self, config: MetricsConfig) -> int | None:
        """Serve ``/metrics`` on ``config.host:config.port`` (a daemon thread); returns the port (None when off)."""
        if config.port < 0:
            return None
        self._http, _thread = start_http_server(config.port, addr=config.host, registry=self.registry)
        self.port = int(self._http.server_port)
        return self.port

    def close(self) -> None:
        self.unwatch_batchers()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
