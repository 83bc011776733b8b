"""Cross-request batching: QPS and latency with the model batchers on against off, same run, same queries.

Closed loop: C concurrent callers (asyncio tasks calling ``Pipeline.search_async``, like the gRPC server does)
each send the dataset's queries one after another for ``--duration`` seconds. The two modes alternate per
concurrency level and round (off, on, off, on, ...) so a shift in machine load hits both alike; QPS is the best
round of each mode. "Off" is the same code with every batcher disabled: each request makes its own model calls.
"Window" is batching with the policy before issue 26 (``idle_dispatch = false``: every batch waits out its
``max_wait_ms`` window, even when the model is idle); "on" is the default (an idle model takes a call at once).
Usage::

    python -m bench.batching --index /tmp/idx/scifact --dataset ../shared/data/beir/scifact \\
        [--config cfg.toml] [--stages bm25,dense,late_interaction] [--concurrency 1,16] [--duration 20] \\
        [--rounds 2] [--json results/bench.json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from typing import Any

import numpy as np

from bench.harness import write_result

MODES = ("off", "window", "on")


def _with_batching(config, mode: str):
    b = config.batching
    over = {"enabled": mode != "off", "idle_dispatch": mode == "on"}
    return dataclasses.replace(config, batching=dataclasses.replace(
        b, embed=dataclasses.replace(b.embed, **over), query_tokens=dataclasses.replace(b.query_tokens, **over),
        cross_encoder=dataclasses.replace(b.cross_encoder, **over)))


async def _closed_loop(pipeline, queries: list[str], concurrency: int, duration: float, stages) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + duration
    counter = iter(range(10**12))

    async def caller() -> None:
        nonlocal errors
        while time.perf_counter() < stop:
            q = queries[next(counter) % len(queries)]
            t = time.perf_counter()
            try:
                await pipeline.search_async(q, 10, stages=stages)
            except Exception:
                errors += 1
                continue
            latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1000 if latencies else np.zeros(1)
    return {"qps": round(len(latencies) / elapsed, 2), "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p95_ms": round(float(np.percentile(lat, 95)), 2), "p99_ms": round(float(np.percentile(lat, 99)), 2),
            "requests": len(latencies), "errors": errors}


def model_batch_scaling(pipeline, queries: list[str], sizes=(1, 4, 16), repeats: int = 3) -> dict[str, Any]:
    """Items per second of each model role called directly at several batch sizes: how much a bigger batch can
    save at all on this machine (the ceiling for what cross-request batching can give)."""
    models = pipeline.models
    roles: dict[str, Any] = {"embed": models._embed_batch}
    if models.query_tokens is not None:
        roles["query_tokens"] = models.query_tokens.fn
    if models.pairs is not None:
        passages = [pipeline.index.passage_with_title(c) for c in range(min(len(pipeline.index.chunks), 64))]
        roles["cross_encoder"] = lambda qs: models.pairs.fn([(q, passages[i % len(passages)]) for i, q in enumerate(qs)])
    out: dict[str, Any] = {}
    for name, fn in roles.items():
        per_size = {}
        for size in sizes:
            batches = [queries[i:i + size] for i in range(0, min(len(queries), 64), size)]
            batches = [b for b in batches if len(b) == size] or [queries[:size]]
            fn(batches[0])  # warm-up
            best = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                for b in batches:
                    fn(b)
                best = min(best, time.perf_counter() - t)
            per_size[str(size)] = round(sum(len(b) for b in batches) / best, 1)
        out[name] = {"items_per_s": per_size, "gain_16_vs_1": round(per_size[str(sizes[-1])] / per_size[str(sizes[0])], 2)}
        print(f"model {name:<14} items/s by batch size {per_size}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--dataset", required=True, help="BEIR folder whose queries are sent")
    ap.add_argument("--split", default="test")
    ap.add_argument("--config")
    ap.add_argument("--stages", default="", help="comma-separated stages (default: as configured)")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per level, mode and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="only the first N queries")
    ap.add_argument("--json", help="merge the result into this JSON file")
    args = ap.parse_args(argv)

    from pathlib import Path

    from index_builder.models import CrossEncoder, Embedder
    from retrieval.config import load_config
    from retrieval.evaluate import load_qrels, load_queries
    from retrieval.search.index import SearchIndex
    from retrieval.search.pipeline import Pipeline

    config = load_config(args.config)
    embedder = Embedder(config.embedder)
    index = SearchIndex.load(Path(args.index), config, embedder)
    ce = CrossEncoder(config.cross_encoder) if config.cross_encoder.model else None
    qrels = load_qrels(args.dataset, args.split)
    all_q = load_queries(args.dataset)
    queries = [all_q[q] for q in qrels if q in all_q]
    if args.limit:
        queries = queries[: args.limit]
    levels = [int(c) for c in args.concurrency.split(",")]
    pipelines = {mode: Pipeline(index, embedder, _with_batching(config, mode), cross_encoder=ce) for mode in MODES}
    stages = tuple(args.stages.split(",")) if args.stages else pipelines["on"].default_stages()
    try:
        for p in pipelines.values():  # warm-up: sessions, caches, the stages' latency windows
            for q in queries[:5]:
                p.search(q, 10, stages=stages)
        scaling = model_batch_scaling(pipelines["on"], queries)
        results: dict[str, Any] = {}
        for c in levels:
            rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
            for _ in range(args.rounds):
                for mode in MODES:
                    p = pipelines[mode]
                    before = p.batcher_stats()
                    r = asyncio.run(_closed_loop(p, queries, c, args.duration, stages))
                    after = p.batcher_stats()
                    r["mean_batch_size"] = {
                        name: round((after[name]["items"] - before[name]["items"])
                                    / max(after[name]["batches"] - before[name]["batches"], 1), 2)
                        for name in after}
                    rounds[mode].append(r)
                    print(f"concurrency {c:3d} batching {mode:6s}: {r['qps']:7.2f} QPS  p50 {r['p50_ms']:8.1f} ms  "
                          f"p99 {r['p99_ms']:8.1f} ms  batch sizes {r['mean_batch_size']}", file=sys.stderr)
            best = {mode: max(rs, key=lambda r: r["qps"]) for mode, rs in rounds.items()}
            results[str(c)] = {**best, "qps_ratio": round(best["on"]["qps"] / max(best["off"]["qps"], 1e-9), 2),
                               "p50_on_over_window": round(best["on"]["p50_ms"] / max(best["window"]["p50_ms"], 1e-9), 3),
                               "qps_on_over_window": round(best["on"]["qps"] / max(best["window"]["qps"], 1e-9), 3),
                               "rounds": rounds}
    finally:
        for p in pipelines.values():
            p.close()

    print(f"\n{'callers':>8} {'off QPS':>9} {'window QPS':>10} {'on QPS':>9} {'on/off':>6} {'off p50':>9} "
          f"{'window p50':>10} {'on p50':>9} {'on/window p50':>13} {'on p99':>9}")
    for c, r in results.items():
        print(f"{c:>8} {r['off']['qps']:9.2f} {r['window']['qps']:10.2f} {r['on']['qps']:9.2f} {r['qps_ratio']:6.2f} "
              f"{r['off']['p50_ms']:9.1f} {r['window']['p50_ms']:10.1f} {r['on']['p50_ms']:9.1f} "
              f"{r['p50_on_over_window']:13.3f} {r['on']['p99_ms']:9.1f}")
    if args.json:
        cfg = {"dataset": Path(args.dataset).name, "stages": list(stages), "duration": args.duration,
               "rounds": args.rounds, "late_interaction_model": config.late_interaction.model or "embedder",
               "cross_encoder": config.cross_encoder.model, "batching": dataclasses.asdict(config.batching)}
        write_result(args.json, "batching", cfg, {"levels": results, "queries": len(queries),
                                                  "model_batch_scaling": scaling})
    return 0


if __name__ == "__main__":
    sys.exit(main())
