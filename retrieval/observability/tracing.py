"""OpenTelemetry tracing: a span per request and a child span per pipeline stage.

The trace of one Retrieve::

    hybridrag.Retrieve            (server; attributes: request id, tenant, top_k, gRPC status code)
      hybridrag.search            (pipeline; generation, stages, cache hit, degraded, skipped stages)
        hybridrag.embed           (queue wait, in the attributes)
        hybridrag.cache_lookup
        hybridrag.bm25            (runs in the worker pool, overlapping the embedding)
        hybridrag.dense
        hybridrag.fusion
        hybridrag.late_interaction
        hybridrag.cross_encoder

Generate adds ``hybridrag.llm`` (model, route, tokens, time to first token) beside ``hybridrag.search``.

Stage spans are started with their parent given explicitly (not "the current span"): stages run concurrently
and on pool threads, where the current context is not the request's. The request span travels from the gRPC
handler into the pipeline's event loop in the context that ``asyncio.run_coroutine_threadsafe`` copies.

The exporter comes from ``[tracing] exporter``: ``none`` (a no-op tracer: nothing recorded, nothing allocated per
span beyond a shared no-op object), ``console`` (JSON lines on stdout) or ``otlp`` (OTLP over HTTP to
``otlp_endpoint``; needs the ``otlp`` extra). Tests pass their own exporter (an in-memory one) to
:func:`make_tracing`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from index_builder.errors import ConfigError
from retrieval.observability.settings import TracingConfig  # noqa: F401  (re-exported: its section)

NO_TRACER: Tracer = trace.NoOpTracer()


class Tracing:
    """A tracer and the provider behind it (``shutdown`` flushes the exporter); the no-op one has no provider."""

    def __init__(self, tracer: Tracer, provider: Any = None) -> None:
        self.tracer = tracer
        self.provider = provider

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def make_tracing(config: TracingConfig, exporter: Any = None) -> Tracing:
    """The tracer ``config`` asks for; ``exporter`` (any SpanExporter) overrides the configured one and is
    flushed on every span end (a SimpleSpanProcessor: for tests). The configured exporters batch."""
    if exporter is None and config.exporter == "none":
        return Tracing(NO_TRACER)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(resource=Resource.create({"service.name": config.service_name}),
                              sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif config.exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as e:
            raise ConfigError("tracing.exporter = 'otlp' needs the OTLP exporter: pip install 'hybridrag[otlp]' "
                              f"({e})") from e
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.otlp_endpoint)))
    return Tracing(provider.get_tracer("hybridrag"), provider)


def set_error(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


@contextlib.contextmanager
def child_span(tracer: Tracer, name: str, parent: otel_context.Context | None,
               attributes: dict[str, Any] | None = None) -> Iterator[Span]:
    """A span under ``parent`` (not made current: safe on any thread and between concurrent stages); an
    exception marks it failed and propagates."""
    span = tracer.start_span(name, context=parent, attributes=attributes)
    try:
        yield span
    except BaseException as e:
        set_error(span, e)
        raise
    finally:
        span.end()
