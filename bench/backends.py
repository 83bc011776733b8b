"""The first-stage backends side by side, in one run: the same judged queries through ``hybridrag serve`` on
the local snapshot, on Qdrant's engine inside the server process (``location = ":memory:"``, the snapshot
migrated at start), and on Qdrant's engine in another process reached over Qdrant's REST API (``hybridrag
engine``: the path a Qdrant server or cluster is reached by), plus the shared cache's lookups.

Per backend: closed-loop QPS and latency at each concurrency (the load bench's machinery, ``bench/load.py``:
``bypass_cache``, the same queries cycled), the per-stage mean ``timings_ms``, and nDCG@10 of what was served.
The local backend is the baseline: every figure is also given as a ratio to it.

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
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.load import REPO, LevelSpec, RequestSpec, free_port, level_summary, run_level, spawn_server, stop_server, wait_serving


def _wait_http(url: str, timeout: float = 60.0) -> None:
    import httpx

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer in {timeout} s")


def _served_ndcg(target: str, queries: list[tuple[str, str]], qrels: dict) -> float:
    from retrieval.evaluate import evaluate
    from retrieval.serving.client import ClientOptions, RetrieverClient, RetryPolicy

    run = {}
    with RetrieverClient(target, ClientOptions(retry=RetryPolicy(attempts=1), timeout=60)) as c:
        for qid, text in queries:
            r = c.retrieve(text, 10, bypass_cache=True)
            run[qid] = {p.doc_id: float(10 - i) for i, p in enumerate(r.passages)}
    return round(float(evaluate({q: qrels[q] for q in run if q in qrels}, run)["ndcg@10"]), 4)


def measure_backend(name: str, index: Path, config: str | None, queries, qrels, args, log_dir: Path) -> dict:
    server = spawn_server(index, config, 0, log_dir)
    try:
        t = time.perf_counter()
        wait_serving(server.target, args.server_timeout, server)
        out: dict[str, Any] = {"backend": name, "start_s": round(time.perf_counter() - t, 1), "levels": {}}
        out["ndcg@10"] = _served_ndcg(server.target, queries[:args.quality_queries], qrels)
        out["quality_queries"] = min(len(queries), args.quality_queries)
        for c in args.levels:
            spec = LevelSpec(server.target, tuple(queries), c, args.duration, args.warmup, RequestSpec(top_k=10),
                             server_pid=server.proc.pid)
            out["levels"][str(c)] = level_summary(run_level(spec), c, args.duration)
            lv = out["levels"][str(c)]
            print(f"  {name:<14} C={c:<3} qps {lv['qps']:>7.1f}  p50 {lv['p50_ms']} ms  p99 {lv['p99_ms']} ms",
                  flush=True)
        return out
    finally:
        stop_server(server)


def cache_lookups(redis_bin: str, index: Path, queries: list[tuple[str, str]], n: int = 200) -> dict[str, Any]:
    """Per-lookup time of the shared semantic cache's two designs and of the exact GET, on real query vectors."""
    import redis
    from qdrant_client import QdrantClient, models

    from retrieval.config import load_config
    from retrieval.search.pipeline import Pipeline
    from retrieval.search.semantic_cache import SemanticCacheConfig
    from retrieval.search.shared_cache import SharedCache

    port = free_port()
    tmp = tempfile.mkdtemp(prefix="hybridrag-redis-")
    proc = subprocess.Popen([redis_bin, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        pipeline = Pipeline.open(index, load_config(environ={}))
        texts = [t for _, t in queries[:n]]
        results = [pipeline.search(t, 10, use_cache=False) for t in texts]
        pipeline.close()
        vecs = np.stack([res.query_vec for res in results])
        cache = SharedCache(SemanticCacheConfig(redis_url=f"redis://127.0.0.1:{port}/0"))
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

        def timed(fn) -> dict[str, float]:
            ms = []
            for i in range(n):
                t0 = time.perf_counter()
                fn(i % len(texts))
                ms.append((time.perf_counter() - t0) * 1000)
            a = np.asarray(ms)
            return {"p50_ms": round(float(np.percentile(a, 50)), 3), "p99_ms": round(float(np.percentile(a, 99)), 3)}

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
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    from retrieval.evaluate import judged_queries

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
                    "first N queries (the same N for every backend; full-set parity: hybridrag eval)")
    ap.add_argument("--backends", default="local,qdrant-in-process,qdrant-rest")
    ap.add_argument("--redis", default=shutil.which("redis-server") or "", help="redis-server binary ('' = skip)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    args.levels = [int(x) for x in args.concurrency.split(",") if x]
    index = Path(args.index)
    q, qrels = judged_queries(Path(args.dataset), args.split, args.limit)
    queries = list(q.items())
    work = Path(tempfile.mkdtemp(prefix="hybridrag-backends-"))
    result: dict[str, Any] = {"index": str(index), "dataset": Path(args.dataset).name, "split": args.split,
                              "queries": len(queries), "duration_s": args.duration, "backends": {}}
    try:
        for name in args.backends.split(","):
            print(f"{name}:", flush=True)
            if name == "local":
                result["backends"][name] = measure_backend(name, index, None, queries, qrels, args, work)
            elif name == "qdrant-in-process":
                cfg = work / "inproc.toml"
                cfg.write_text('[backend]\nkind = "qdrant"\nlocation = ":memory:"\n')
                result["backends"][name] = measure_backend(name, index, str(cfg), queries, qrels, args, work)
            elif name == "qdrant-rest":
                port = free_port()
                host = subprocess.Popen([sys.executable, "-m", "hybridrag", "engine", "--location", ":memory:",
                                         "--port", str(port)], cwd=REPO, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                try:
                    _wait_http(f"http://127.0.0.1:{port}/healthz")
                    cfg = work / "rest.toml"
                    cfg.write_text(f'[backend]\nkind = "qdrant"\nlocation = "http://127.0.0.1:{port}"\n')
                    t = time.perf_counter()
                    subprocess.run([sys.executable, "-m", "hybridrag", "migrate", "--index", str(index), "--config",
                                    str(cfg)], cwd=REPO, check=True)
                    migrate_s = round(time.perf_counter() - t, 1)
                    result["backends"][name] = measure_backend(name, index, str(cfg), queries, qrels, args, work)
                    result["backends"][name]["migrate_s"] = migrate_s
                finally:
                    host.terminate()
                    host.wait(timeout=30)
            else:
                raise SystemExit(f"unknown backend {name!r} (local, qdrant-in-process, qdrant-rest)")
        base = result["backends"].get("local")
        if base:
            for b in result["backends"].values():
                for c, lv in b["levels"].items():
                    ref = base["levels"].get(c)
                    if ref and ref["p50_ms"] and lv["p50_ms"]:
                        lv["p50_vs_local"] = round(lv["p50_ms"] / ref["p50_ms"], 2)
                        lv["qps_vs_local"] = round(lv["qps"] / ref["qps"], 3) if ref["qps"] else None
        if args.redis:
            result["shared_cache_lookup"] = cache_lookups(args.redis, index, queries)
            print("shared cache lookups:", json.dumps(result["shared_cache_lookup"]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
