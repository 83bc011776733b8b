"""What tracing and metrics cost per request: the same searches with both off, and with both on.

"On" is what a server with ``[tracing] exporter = "otlp"`` and ``/metrics`` does per request, minus the network: the
OpenTelemetry SDK records the request's spans (``hybridrag.search`` and one per stage) into a batch span processor
whose exporter counts and drops them, and :class:`retrieval.serving.metrics.ServiceMetrics` observes the result (stage
histograms, cache counters) and every model batch. "Off" is the no-op tracer and no metrics (``exporter = "none"``;
metrics are always kept by a server, so "off" is a lower bound). The modes alternate per round (off, on, off, on:
:func:`bench.harness.alternate`) on one pipeline (opened as the server opens it), one query after another (the
cache bypassed); each mode keeps its best round (mean). Usage::

    python -m bench.observability --index /tmp/idx/scifact-minilm8 --dataset ../shared/data/beir/scifact \\
        [--config F] [--limit 100] [--rounds 3] [--json results/bench.json]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.harness import alternate, measure, query_list, write_result
from bench.harness.pipelines import opened


class CountingExporter:
    """A span exporter that counts what it is handed and sends it nowhere (the network part of OTLP is not
    measured here)."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[object]):  # noqa: ANN201  (SpanExportResult)
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.observability", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--split", default="test")
    ap.add_argument("--config")
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="results/bench.json", help="merge the result into this JSON file")
    args = ap.parse_args(argv)

    from retrieval.config import load_config

    config = load_config(args.config)
    queries = [t for _, t in query_list(args.dataset, args.split, args.limit)[0]]
    with opened(args.index, config) as pipeline:
        result = measure_overhead(pipeline, queries, args.rounds)
    print(f"{len(queries)} queries: off p50 {result['off']['p50_ms']:.2f} ms, on p50 {result['on']['p50_ms']:.2f} ms; "
          f"mean on/off {result['mean_ratio']:.3f} ({result['mean_overhead_ms']:+.2f} ms); "
          f"{result['spans_exported']} spans exported; the instrumentation alone: "
          f"{result['instrumentation_us_per_request']} us per request ({result['spans_per_request']} spans + the "
          "metrics)")
    if args.json:
        write_result(args.json, "observability", {"index": Path(args.index).name, "dataset": Path(args.dataset).name,
                                                  "config": args.config or "", "limit": args.limit}, result)
    return 0


def measure_overhead(pipeline: Any, queries: list[str], rounds: int) -> dict[str, Any]:
    """The searches with tracing and metrics off and on (alternating rounds), and the instrumentation alone."""
    from opentelemetry import context as otel_context
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from retrieval.observability.tracing import NO_TRACER, child_span
    from retrieval.serving.metrics import ServiceMetrics

    exporter = CountingExporter()

    provider = TracerProvider(resource=Resource.create({"service.name": "hybridrag-bench"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("hybridrag")
    metrics = ServiceMetrics(lambda: {"in_flight": 0, "pipeline": pipeline})

    def off(q: str) -> None:
        pipeline.search(q, 10, use_cache=False)

    def on(q: str) -> None:
        with tracer.start_as_current_span("hybridrag.Retrieve"):  # the server span the handler would open
            metrics.observe_search(pipeline.search(q, 10, use_cache=False))

    first = [True]

    def mode(name: str, fn: Callable[[str], None]) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            pipeline.tracer = tracer if name == "on" else NO_TRACER
            if name == "on":
                metrics.watch_batchers(pipeline)
            else:
                metrics.unwatch_batchers()
            res = measure(fn, queries, warmup=5 if first[0] else 0, repeats=1)
            first[0] = False
            print(f"{name}: p50 {res['p50_ms']:.2f} ms, mean {res['mean_ms']:.2f} ms", file=sys.stderr)
            return res
        return run

    try:
        best, _ = alternate({"off": mode("off", off), "on": mode("on", on)}, rounds,
                            lambda new, old: new["mean_ms"] < old["mean_ms"])
        # The instrumentation alone, without the search around it (steadier than a difference of two noisy
        # latencies): the spans of one request (the server's, the search's and one per stage of a stored result)
        # and the metrics of its result.
        stored = pipeline.search(queries[0], 10, use_cache=False)
        stage_names = [f"hybridrag.{s}" for s in stored.timings_ms if s not in ("total", "embed_queue")]

        def instrumentation_only(_: int) -> None:
            with tracer.start_as_current_span("hybridrag.Retrieve"), tracer.start_as_current_span("hybridrag.search"):
                parent = otel_context.get_current()
                for name in stage_names:
                    with child_span(tracer, name, parent):
                        pass
            metrics.observe_search(stored)

        alone = measure(instrumentation_only, list(range(2000)), warmup=100, repeats=1)
    finally:
        pipeline.tracer = NO_TRACER
        metrics.unwatch_batchers()
        provider.shutdown()
    return {"queries": len(queries), "off": best["off"], "on": best["on"], "spans_exported": exporter.spans,
            "instrumentation_us_per_request": round(alone["mean_ms"] * 1000, 1),
            "instrumentation_p99_us": round(alone["p99_ms"] * 1000, 1),
            "spans_per_request": len(stage_names) + 2,
            "mean_overhead_ms": round(best["on"]["mean_ms"] - best["off"]["mean_ms"], 3),
            "mean_ratio": round(best["on"]["mean_ms"] / best["off"]["mean_ms"], 4),
            "p50_ratio": round(best["on"]["p50_ms"] / best["off"]["p50_ms"], 4)}


if __name__ == "__main__":
    sys.exit(main())
