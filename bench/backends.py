"""The first-stage backends side by side, in one run: the same judged queries through ``hybridrag serve`` on
the local snapshot, on Qdrant's engine inside the server process (``location = ":memory:"``, the snapshot
migrated at start), and on Qdrant's engine in another process reached over Qdrant's REST API (``hybridrag
engine``: the path a Qdrant server or cluster is reached by), plus the shared cache's lookups.

Per backend: ``bench.cascade_load``'s side-by-side run (``bench.load`` for each configuration: closed-loop QPS and
latency at each concurrency, ``bypass_cache``, the same queries cycled, the per-stage mean ``timings_ms``), and
nDCG@10 of what was served on the first ``--quality-queries`` asked one by one. The local backend is the
reference: every level is also given as a ratio to it (``vs_reference``).

The shared cache (``--redis``: a redis-server binary; started on a free loopback port): the time of a semantic
lookup in each design the issue names, measured on the same query vectors: (a) the replica-local matrix fed by
the Redis stream (what ships: one ``XRANGE`` + a local dot product + a ``GET`` on a hit), (b) a vector collection
in the engine (one Qdrant query with a scope filter + a ``GET``), and the exact-match ``GET``.

What it is not: a Qdrant server's latency. Qdrant's local engine is Qdrant's Python reference implementation
(exact search, payload filters by scanning, one lock), and ``hybridrag engine`` serialises its requests; a Qdrant
server (Rust, HNSW, payload indexes) is the production engine and could not be installed here.

Usage::

    python -m bench.backends --index /work/idx/scifact --dataset ../shared/data/beir/scifact \\
        [--concurrency 1,4,16] [--duration 15] [--json docs/results/scale-out/backends-scifact.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench.cascade_load import Run, run_configs
from bench.harness import percentiles, query_list, write_result
from bench.harness.server import engine, redis_server, run_cli

BACKENDS = ("local", "qdrant-in-process", "qdrant-rest")


def cache_lookups(redis_bin: str, index: Path, queries: list[tuple[str, str]], log_dir: Path,
                  n: int = 200) -> dict[str, Any]:
    """Per-lookup time of the shared semantic cache's two designs and of the exact GET, on real query vectors."""
    import time

    import redis
    from qdrant_client import QdrantClient, models

    from bench.harness.pipelines import opened
    from retrieval.config import load_config
    from retrieval.search.semantic_cache import SemanticCacheConfig
    from retrieval.search.shared_cache import SharedCache

    texts = [t for _, t in queries[:n]]
    with opened(index, load_config(environ={})) as pipeline:
        results = [pipeline.search(t, 10, use_cache=False) for t in texts]
    vecs = np.stack([res.query_vec for res in results])
    with redis_server(redis_bin, log_dir) as server:
        r = redis.Redis(port=server.port)
        cache = SharedCache(SemanticCacheConfig(redis_url=server.url))
        scope = ("retrieve", "bench")
        for t, res in zip(texts, results, strict=True):  # real results: the lookups below decode them
            assert cache.put(scope, 1, res.query_vec, t, res.detached(), [], since=0)
        eng = QdrantClient(":memory:")
        eng.create_collection("cache", vectors_config=models.VectorParams(size=vecs.shape[1],
                                                                           distance=models.Distance.DOT))
        eng.upsert("cache", [models.PointStruct(id=i, vector=v.tolist(), payload={"scope": "s", "version": 0,
                                                                                 "key": cache._keys(scope, 1, 0, texts[i])[1]})
                             for i, v in enumerate(vecs)])
        flt = models.Filter(must=[models.FieldCondition(key="scope", match=models.MatchValue(value="s")),
                                  models.FieldCondition(key="version", match=models.MatchValue(value=0))])
        cache.lookup(scope, 1, vecs[0], texts[0], 0)  # the first sync reads the whole stream

        def timed(fn) -> dict[str, Any]:
            ms = []
            for i in range(n):
                t0 = time.perf_counter()
                fn(i % len(texts))
                ms.append((time.perf_counter() - t0) * 1000)
            return percentiles(ms, digits=3)

        return {
            "entries": len(texts),
            "stream_local_matrix": timed(lambda i: cache.lookup(scope, 1, vecs[i], texts[i], 0)),
            "engine_collection_in_process": timed(lambda i: (eng.query_points(
                "cache", query=vecs[i].tolist(), query_filter=flt, limit=1, score_threshold=0.91),
                r.get(cache._keys(scope, 1, 0, texts[i])[1]))),
            "exact_get": timed(lambda i: cache.lookup_exact(scope, 1, texts[i], 0)),
            "note": "the engine collection was measured in-process (Qdrant's local engine, no network hop); over a "
                    "network each lookup adds a round trip to the engine besides the Redis GET",
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.backends", description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True, help="a built snapshot (index root)")
    ap.add_argument("--dataset", required=True, help="BEIR folder: its judged queries are sent")
    ap.add_argument("--split", default="test")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--server-timeout", type=float, default=900.0)
    ap.add_argument("--quality-queries", type=int, default=50, help="nDCG@10 of what each backend served, on the "
                    "first N queries asked one by one (the same N for every backend; full-set parity: hybridrag eval)")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--redis", default=shutil.which("redis-server") or "", help="redis-server binary ('' = skip)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    names = [b for b in args.backends.split(",") if b]
    unknown = set(names) - set(BACKENDS)
    if unknown or not names:
        ap.error(f"--backends: unknown {sorted(unknown)} (known: {', '.join(BACKENDS)})")
    index = Path(args.index)
    queries, _ = query_list(args.dataset, args.split, args.limit)
    work = Path(tempfile.mkdtemp(prefix="hybridrag-backends-"))
    configs = {"local": "", "qdrant-in-process": str(work / "inproc.toml"), "qdrant-rest": str(work / "rest.toml")}
    (work / "inproc.toml").write_text('[backend]\nkind = "qdrant"\nlocation = ":memory:"\n')
    migrate_s: dict[str, float] = {}

    @contextlib.contextmanager
    def around(run: Run) -> Iterator[None]:
        """qdrant-rest: the engine host for the run, the snapshot migrated into it first."""
        if run.name != "qdrant-rest":
            yield
            return
        with engine(work) as host:
            Path(run.toml).write_text(f'[backend]\nkind = "qdrant"\nlocation = "{host.url}"\n')
            migrate_s[run.name] = run_cli(["migrate", "--index", str(index), "--config", run.toml], work, "migrate")
            yield

    load_options = ["--split", args.split, "--limit", str(args.limit), "--concurrency", args.concurrency,
                    "--duration", str(args.duration), "--warmup", str(args.warmup), "--floor-queries", "0",
                    "--calibration-seconds", "0", "--server-timeout", str(args.server_timeout),
                    "--quality-queries", str(args.quality_queries)]
    result: dict[str, Any] = {"index": str(index), "dataset": Path(args.dataset).name, "split": args.split,
                              "queries": len(queries), "duration_s": args.duration}
    try:
        runs = run_configs(str(index), args.dataset, [Run(n, configs[n]) for n in names], load_options, around)
        result["reference"] = names[0]
        result["backends"] = {name: {"levels": r["closed_loop"], "vs_reference": r["vs_reference"],
                                     "ndcg@10": r["ndcg@10"].get("service_first_n", r["ndcg@10"]["service_all"])["ndcg@10"],
                                     "quality_queries": min(len(queries), args.quality_queries),
                                     "server": r["server"], **({"migrate_s": migrate_s[name]} if name in migrate_s else {})}
                              for name, r in runs.items()}
        for name, b in result["backends"].items():
            for c, lv in b["levels"].items():
                print(f"  {name:<18} C={c:<3} qps {lv['qps']:>7.1f}  p50 {lv['p50_ms']} ms  p99 {lv['p99_ms']} ms  "
                      f"x{b['vs_reference'][c]['p50_ratio']} p50 of {names[0]}", flush=True)
        if args.redis:
            result["shared_cache_lookup"] = cache_lookups(args.redis, index, queries, work)
            print("shared cache lookups:", json.dumps(result["shared_cache_lookup"]), flush=True)
    except RuntimeError as e:  # a server or engine that would not start (bench.load.LoadError included)
        print(f"bench.backends: {e}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        write_result(args.json, "backends", {k: v for k, v in vars(args).items() if k != "json"}, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
