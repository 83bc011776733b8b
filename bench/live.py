"""The live index under writes and rebuilds: query latency while a rebuild runs against idle (same run), write
throughput (one document per call against batches), and the time from a write to its visibility.

Setup: the first ``--docs`` documents of the corpus go into a fresh document store and a snapshot built from it.
Then, in one process (the library the server runs, without the network):

1. idle: C callers send the dataset's queries in a closed loop for ``--duration`` s;
2. the same while ``LiveIndex.rebuild`` runs in a background thread (as the server's auto-rebuild does), until it
   has swapped the new generation in;
3. writes: for ``--duration`` s each, upserts of 1 new document per call, then of ``--batch`` per call; an upsert
   returns once the write is durable (SQLite, synchronous FULL) *and* searchable, so its latency is the time from
   write to visible; a query for the new document right after the acknowledgement confirms it.

Usage::

    python -m bench.live --corpus ../shared/data/beir/scifact --docs 1000 [--concurrency 4] [--duration 20] \\
        [--json results/bench.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import write_result


def _percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms) if ms else np.zeros(1)
    return {"p50_ms": round(float(np.percentile(a, 50)), 2), "p99_ms": round(float(np.percentile(a, 99)), 2),
            "n": len(ms)}


def _load(pipeline, queries: list[str], callers: int, until) -> list[float]:
    lat: list[float] = []
    lock = threading.Lock()

    def run(c: int) -> None:
        i = c
        while not until():
            t = time.perf_counter()
            pipeline.search(queries[i % len(queries)], 10)
            with lock:
                lat.append((time.perf_counter() - t) * 1000)
            i += callers

    threads = [threading.Thread(target=run, args=(c,)) for c in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="BEIR folder (corpus and test queries)")
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--config")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from index_builder.build import build_snapshot
    from index_builder.corpus import read_corpus
    from index_builder.models import Embedder
    from index_builder.types import Document
    from retrieval.config import load_config
    from retrieval.evaluate import load_queries
    from retrieval.live.live_index import LiveIndex
    from retrieval.live.store import DocumentStore
    from retrieval.search.index import SearchIndex
    from retrieval.search.pipeline import Pipeline

    config = load_config(args.config)
    docs, _ = read_corpus(args.corpus)
    docs = docs[: args.docs]
    queries = list(load_queries(args.corpus).values())[:200]
    embedder = Embedder(config.embedder)
    tmp = tempfile.TemporaryDirectory(prefix="hybridrag-bench-live-")
    root = Path(tmp.name)
    store = DocumentStore(root / "store.db")
    for s in range(0, len(docs), 1000):
        store.upsert(docs[s:s + 1000])
    seq, stored = store.snapshot()
    t = time.perf_counter()
    build_snapshot(stored, root / "index", config.build_config(), embedder, covered_seq=seq)
    print(f"built {len(stored)} documents in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    pipeline = Pipeline(SearchIndex.load(root / "index", config, embedder), embedder, config)
    live = LiveIndex(pipeline.index, store, embedder, pipeline.token_encoder, config)
    live.on_publish(pipeline.publish)
    result: dict[str, Any] = {"documents": len(stored), "concurrency": args.concurrency,
                              "rebuild_threads": config.live.rebuild_threads}
    try:
        for q in queries[:10]:
            pipeline.search(q, 10)
        end = time.monotonic() + args.duration
        idle = _load(pipeline, queries, args.concurrency, lambda: time.monotonic() > end)
        live.upsert([Document(id="bench-live-0", text="a write so the rebuild has something to cover", tenant="")])
        done = threading.Event()
        rebuild_s: list[float] = []

        def rebuild() -> None:
            t0 = time.perf_counter()
            live.rebuild()
            rebuild_s.append(time.perf_counter() - t0)
            done.set()

        threading.Thread(target=rebuild, daemon=True).start()
        during = _load(pipeline, queries, args.concurrency, done.is_set)
        result["idle"] = _percentiles(idle)
        result["during_rebuild"] = _percentiles(during)
        result["rebuild_s"] = round(rebuild_s[0], 1)
        result["p99_ratio"] = round(result["during_rebuild"]["p99_ms"] / max(result["idle"]["p99_ms"], 1e-9), 2)
        result["p50_ratio"] = round(result["during_rebuild"]["p50_ms"] / max(result["idle"]["p50_ms"], 1e-9), 2)
        print(f"queries idle: {result['idle']}; during a rebuild ({result['rebuild_s']} s): "
              f"{result['during_rebuild']}; p99 ratio {result['p99_ratio']}", file=sys.stderr)

        writes: dict[str, Any] = {}
        n = 0
        for size in (1, args.batch):
            lat, count = [], 0
            end = time.monotonic() + args.duration
            while time.monotonic() < end:
                batch = [Document(id=f"w{n + j}", tenant="", text=f"written note zq{n + j} about item {n + j}")
                         for j in range(size)]
                t = time.perf_counter()
                live.upsert(batch)
                lat.append((time.perf_counter() - t) * 1000)
                res = pipeline.search(f"zq{n}", 5, stages=["bm25"])
                assert res.index.documents[res.hits.doc[0]].id == f"w{n}", "a write was not visible after its ack"
                n += size
                count += size
            total_s = sum(lat) / 1000
            writes[f"batch_{size}"] = {"docs_per_s": round(count / total_s, 1), "ack_visible": _percentiles(lat)}
            print(f"writes, {size} per call: {writes[f'batch_{size}']}", file=sys.stderr)
        t = time.perf_counter()
        for i in range(50):
            store.upsert([Document(id=f"s{i}", tenant="", text="store only")])
        writes["store_only_commits_per_s"] = round(50 / (time.perf_counter() - t), 1)
        result["writes"] = writes
        print(f"store alone (SQLite WAL, synchronous FULL): {writes['store_only_commits_per_s']} commits/s",
              file=sys.stderr)
    finally:
        pipeline.close()
        live.close()
        store.close()
        tmp.cleanup()
    if args.json:
        write_result(args.json, "live", {"corpus": Path(args.corpus).name, "docs": args.docs,
                                         "concurrency": args.concurrency, "duration": args.duration,
                                         "batch": args.batch, "rebuild_threads": config.live.rebuild_threads,
                                         "rebuild_nice": config.live.rebuild_nice}, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
