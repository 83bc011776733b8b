"""Generate benchmark: time to first token and total time with the embedded llama.cpp backend, the semantic cache
on a query log with repeats, paraphrases and near-misses, and Retrieve latency while answers are generated.

All through a spawned ``hybridrag serve`` on loopback (:mod:`bench.harness.server`) with the embedded llama.cpp
server (SmolLM2-135M Q4_1 by default) in its own process; a part that needs an empty cache gets a fresh server:

1. ``generate``: the first ``--queries`` test queries, one after another, cache bypassed: client-side time to the
   passages, to the first token and to the end; the server's stats (retrieval ms, tokens in/out).
2. ``cache``: the query log (bench/querylog/scifact_variants.jsonl: hand-written paraphrases and near-misses of
   SciFact test claims). Sequence: the originals (they fill the cache), then, shuffled with a fixed seed, exact
   repeats of half the originals, the paraphrases and the near-misses. Run once with the cache and once bypassing
   it, for Retrieve and for Generate; reports hit rates per kind (a near-miss hit is a false hit) and latency.
   ``cache_overhead``: in process (the pipeline as the server opens it), what a miss costs against no cache, and
   what a hit costs (150 test queries).
3. ``load``: Retrieve p50/p99 alone, then while ``--streams`` Generate calls run back to back
   with the embedded server at its configured nice value and again at nice 0 (why it runs niced, in its own
   process).

Usage: python -m bench.generate --dataset ../shared/data/beir/scifact --index IDX --json results/bench.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import ms_since, percentiles, query_list, ratio, write_result
from bench.harness.pipelines import opened
from bench.harness.server import Server, served

QUERYLOG = Path(__file__).resolve().parent / "querylog" / "scifact_variants.jsonl"


def _pct(values: list[float]) -> dict[str, Any]:
    return percentiles(values, 1)


def _generate_once(client, question: str, top_k: int, max_tokens: int, bypass: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    out: dict[str, Any] = {"tokens": 0}
    for msg in client.generate(question, top_k, max_tokens=max_tokens, bypass_cache=bypass, timeout=600):
        kind = msg.WhichOneof("event")
        now = (time.perf_counter() - t0) * 1000
        if kind == "passages":
            out["passages_ms"] = now
            out["cache_hit"] = msg.passages.cache_hit
        elif kind == "token":
            out.setdefault("first_token_ms", now)
            out["tokens"] += 1
        else:
            out["stats"] = msg.stats
    out["total_ms"] = (time.perf_counter() - t0) * 1000
    return out


def query_log(path: Path, seed: int, limit: int | None) -> list[dict[str, str]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    sources = list(dict.fromkeys(r["source_id"] for r in rows))[:limit]
    rows = [r for r in rows if r["source_id"] in set(sources)]
    originals = [r for r in rows if r["kind"] == "original"]
    rng = random.Random(seed)
    repeats = [{**r, "kind": "repeat"} for r in rng.sample(originals, len(originals) // 2)]
    rest = repeats + [r for r in rows if r["kind"] != "original"]
    rng.shuffle(rest)
    return originals + rest


def run_log(call, log: list[dict[str, str]], bypass: bool) -> dict[str, Any]:
    by_kind: dict[str, dict[str, list]] = {}
    for r in log:
        ms, hit = call(r["text"], bypass)
        k = by_kind.setdefault(r["kind"], {"ms": [], "hits": []})
        k["ms"].append(ms)
        k["hits"].append(bool(hit))
    out: dict[str, Any] = {}
    for kind, v in by_kind.items():
        out[kind] = {"n": len(v["hits"]), "hit_rate": round(float(np.mean(v["hits"])), 3), **_pct(v["ms"])}
    all_ms = [ms for v in by_kind.values() for ms in v["ms"]]
    all_hits = [h for v in by_kind.values() for h in v["hits"]]
    out["all"] = {"n": len(all_ms), "hit_rate": round(float(np.mean(all_hits)), 3), **_pct(all_ms),
                  "total_s": round(sum(all_ms) / 1000, 2)}
    return out


def _retrieve_load(client, queries: list[str], seconds: float) -> list[float]:
    lat = []
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        t = time.perf_counter()
        client.retrieve(queries[i % len(queries)], 10, bypass_cache=True)
        lat.append((time.perf_counter() - t) * 1000)
        i += 1
    return lat


def _with_generate_load(target: str, questions: list[str], streams: int, top_k: int, max_tokens: int, fn):
    from retrieval.client import ClientOptions, RetrieverClient

    stop = threading.Event()
    done = [0]

    def worker(offset: int) -> None:
        with RetrieverClient(target, ClientOptions(timeout=600)) as c:
            i = offset
            while not stop.is_set():
                _generate_once(c, questions[i % len(questions)], top_k, max_tokens, True)
                done[0] += 1
                i += streams
    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(streams)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # the generations are under way
    try:
        return fn(), done
    finally:
        stop.set()
        for t in threads:
            t.join()


def _generate_part(c, questions: list[str], args: argparse.Namespace) -> dict[str, Any]:
    runs = [_generate_once(c, q, args.top_k, args.max_tokens, True) for q in questions]
    st = [r["stats"] for r in runs]
    return {
        "queries": len(runs),
        "client_passages": _pct([r["passages_ms"] for r in runs]),
        "client_first_token": _pct([r["first_token_ms"] for r in runs if "first_token_ms" in r]),
        "client_total": _pct([r["total_ms"] for r in runs]),
        "server_retrieval": _pct([s.retrieval_ms for s in st]),
        "server_first_token": _pct([s.time_to_first_token_ms for s in st]),
        "server_generation": _pct([s.generation_ms for s in st]),
        "tokens_in_mean": round(float(np.mean([s.tokens_in for s in st])), 1),
        "tokens_out_mean": round(float(np.mean([s.tokens_out for s in st])), 1),
        # prompt processing (tokens in / time to first token) and decoding (the tokens after the first)
        "prompt_tokens_per_s": round(sum(s.tokens_in for s in st)
                                     / max(sum(s.time_to_first_token_ms for s in st) / 1000, 1e-9), 1),
        "decode_tokens_per_s": round(sum(s.tokens_out - 1 for s in st)
                                     / max(sum(s.generation_ms - s.time_to_first_token_ms for s in st) / 1000, 1e-9), 1)}


def _retrieve_log(c: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The query log through Retrieve, with the cache then bypassing it (a fresh server: the cache starts empty)."""
    def retrieve(text: str, bypass: bool) -> tuple[float, bool]:
        t = time.perf_counter()
        r = c.retrieve(text, 10, bypass_cache=bypass)
        return ms_since(t), r.cache_hit

    log = query_log(Path(args.querylog), 0, args.log_sources)
    out: dict[str, Any] = {"log_requests": len(log)}
    out["retrieve_cached"] = run_log(retrieve, log, False)
    out["retrieve_uncached"] = run_log(retrieve, log, True)
    out["retrieve_speedup_mean"] = ratio(out["retrieve_uncached"]["all"]["mean_ms"],
                                         out["retrieve_cached"]["all"]["mean_ms"], 2)
    return out


def _generate_log(c: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The first sources of the log through Generate, with the cache then bypassing it (a fresh server)."""
    def generate(text: str, bypass: bool) -> tuple[float, bool]:
        r = _generate_once(c, text, args.top_k, args.max_tokens, bypass)
        return r["total_ms"], r["stats"].cache_hit

    small = query_log(Path(args.querylog), 0, args.generate_log_sources)
    out: dict[str, Any] = {"generate_log_requests": len(small)}
    out["generate_cached"] = run_log(generate, small, False)
    out["generate_uncached"] = run_log(generate, small, True)
    out["generate_speedup_mean"] = ratio(out["generate_uncached"]["all"]["mean_ms"],
                                         out["generate_cached"]["all"]["mean_ms"], 2)
    return out


def _cache_overhead_part(pipeline, questions: list[str]) -> dict[str, Any]:
    """In process, alternating passes: every query a miss (cache cleared per pass) against the cache bypassed, then
    every query a hit."""
    for q in questions[:10]:
        pipeline.search(q, 10, use_cache=False)
    lat: dict[str, list[float]] = {"miss": [], "bypassed": [], "hit": []}
    for _ in range(2):
        for mode in ("miss", "bypassed"):
            pipeline.cache.clear()
            for q in questions:
                t = time.perf_counter()
                r = pipeline.search(q, 10, use_cache=mode == "miss")
                if not r.cache_hit:  # near-duplicate questions in the set hit each other: not a miss
                    lat[mode].append(ms_since(t))
    for q in questions:  # fill
        pipeline.search(q, 10)
    for q in questions:
        t = time.perf_counter()
        r = pipeline.search(q, 10)
        if r.cache_hit:
            lat["hit"].append(ms_since(t))
    return {k: _pct(v) for k, v in lat.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.generate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True, help="BEIR folder (its test queries)")
    ap.add_argument("--index", required=True, help="index folder built from that corpus")
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=5, help="context passages per question")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--querylog", default=str(QUERYLOG))
    ap.add_argument("--log-sources", type=int, default=None, help="use the first N source queries of the log")
    ap.add_argument("--generate-log-sources", type=int, default=20, help="sources for the Generate pass of the log")
    ap.add_argument("--load-seconds", type=float, default=20.0)
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--no-nice-compare", action="store_true", help="skip the run with the LLM process at nice 0")
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0 = all cores)")
    ap.add_argument("--parts", default="generate,cache,cache_overhead,load",
                    help="which of generate, cache, cache_overhead, load to run")
    ap.add_argument("--server-timeout", type=float, default=300.0)
    ap.add_argument("--config")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))

    from retrieval.client import ClientOptions, RetrieverClient
    from retrieval.config import load_config

    config = load_config(args.config)
    test = [t for _, t in query_list(args.dataset, "test")[0]]
    result: dict[str, Any] = {"dataset": Path(args.dataset).name, "max_tokens": args.max_tokens, "top_k": args.top_k,
                              "threshold": config.cache.threshold, "guard": config.cache.guard}
    t_bench = time.perf_counter()

    def phase(name: str) -> None:
        print(f"[{time.perf_counter() - t_bench:7.1f} s] {name}", file=sys.stderr)

    def client(server: Server) -> RetrieverClient:
        return RetrieverClient(server.target, ClientOptions(timeout=600))

    with tempfile.TemporaryDirectory(prefix="hybridrag-generate-") as tmp, contextlib.ExitStack() as stack:
        def fresh(nice: int | None = None) -> Server:
            """A new server (an empty cache), the previous one stopped; the first Generate waits for its LLM."""
            stack.close()
            env = {"HYBRIDRAG_GENERATION__EMBEDDED__THREADS": str(args.threads),
                   "HYBRIDRAG_GENERATION__MAX_TOKENS": str(args.max_tokens),
                   "HYBRIDRAG_GENERATION__MAX_TOKENS_LIMIT": str(max(args.max_tokens, config.generation.max_tokens_limit))}
            if nice is not None:
                env["HYBRIDRAG_GENERATION__EMBEDDED__NICE"] = str(nice)
            t = time.perf_counter()
            server = stack.enter_context(served(args.index, Path(tmp), config=args.config, llm=True, env=env,
                                                timeout_s=args.server_timeout))
            with client(server) as c:
                for q in test[: max(1, args.warmup)]:  # bypass: nothing enters the cache
                    first = _generate_once(c, q, args.top_k, 8, True)
            result.setdefault("first_answers_s", round(time.perf_counter() - t, 2))
            result.setdefault("model", first["stats"].model)
            phase(f"server up (nice {config.generation.embedded.nice if nice is None else nice})")
            return server

        server = fresh()
        if "generate" in parts:
            with client(server) as c:
                result["generate"] = _generate_part(c, test[: args.queries], args)
            phase(f"generate: {json.dumps(result['generate'])}")
        if "cache" in parts:
            with client(server) as c:  # bypassed calls only so far: the cache is empty
                result["cache"] = _retrieve_log(c, args)
            phase("retrieve log done")
            server = fresh()
            with client(server) as c:
                result["cache"].update(_generate_log(c, args))
            phase(f"cache: {json.dumps(result['cache'])}")
        if "load" in parts:
            with client(server) as c:
                idle = _retrieve_load(c, test, args.load_seconds)
            loaded: dict[str, Any] = {"idle": _pct(idle), "streams": args.streams}
            levels = [(f"nice_{config.generation.embedded.nice}", None)] + ([] if args.no_nice_compare else [("nice_0", 0)])
            for label, nice in levels:
                if nice is not None:
                    server = fresh(nice)
                with client(server) as c:
                    lat, done = _with_generate_load(server.target, test, args.streams, args.top_k, args.max_tokens,
                                                    lambda c=c: _retrieve_load(c, test, args.load_seconds))
                loaded[label] = {**_pct(lat), "generations_done": done[0]}
                loaded[label]["p50_ratio"] = ratio(loaded[label]["p50_ms"], loaded["idle"]["p50_ms"], 2)
                loaded[label]["p99_ratio"] = ratio(loaded[label]["p99_ms"], loaded["idle"]["p99_ms"], 2)
                phase(f"retrieve under generate, {label}")
            result["retrieve_under_generate"] = loaded
            phase(f"retrieve under generate: {json.dumps(loaded)}")
    if "cache_overhead" in parts:
        with opened(args.index, config) as pipeline:
            assert pipeline.cache is not None, "the semantic cache is off in this configuration"
            result["cache_overhead"] = _cache_overhead_part(pipeline, test[:150])
        phase(f"cache overhead: {json.dumps(result['cache_overhead'])}")
    if args.json:
        write_result(args.json, "generate", {"dataset": result["dataset"], "max_tokens": args.max_tokens,
                                             "queries": args.queries, "top_k": args.top_k, "parts": args.parts,
                                             "threshold": config.cache.threshold}, result)
    print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
