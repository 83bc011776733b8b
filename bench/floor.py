"""The compute floor of a request: each stage's own compute, alone, for the same queries the load bench sends.

For each query, on the calling thread (no event loop, no worker pool, no batcher, no server): the query encoding
(the embedder's pass, with token vectors when late interaction uses them; a ColBERT encoder's own pass when one
is configured), BM25, HNSW, fusion, MaxSim over the head, and the cross-encoder over its top when it is among the
stages. Per stage the median; their sum is the **latency floor** of one request. The **throughput floor** is
``cores / CPU seconds per request`` of that same stage compute (the process's CPU time over the loop, so the ONNX
and BLAS threads' work counts), the most requests per second the machine could serve if nothing but the stages'
own work ran. ``bench.load`` reports each closed-loop level against both (``p50_over_floor``, ``qps_over_floor``).

Usage::

    python -m bench.floor --index indexes/scifact --dataset ../shared/data/beir/scifact [--queries 50] [--json F]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import write_result


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def measure_floor(pipeline: Any, queries: list[str], stages: tuple[str, ...] | None = None,
                  cores: int | None = None) -> dict[str, Any]:
    """Median ms of each stage's compute over ``queries``, their sum, CPU ms per request and the throughput floor.
    ``stages``: the request's stages (default: the pipeline's)."""
    from rerank.cross_encoder import decisive_gap, pairs_for
    from retrieval.search.pipeline import reorder
    from retrieval.search.request import SearchRequest

    index = pipeline.index
    request = pipeline.resolve(SearchRequest.of(queries[0], 10, stages=stages))
    stages = request.stages
    assert stages is not None and request.candidates is not None and request.li_top_k is not None
    rr = pipeline.config.rerank
    embedder_tokens = pipeline.models.embedder_tokens
    want_li = "late_interaction" in stages and pipeline.late_interaction_unavailable(index) is None
    want_ce = "cross_encoder" in stages and pipeline.cross_encoder is not None
    times: dict[str, list[float]] = {}

    def timed(stage: str, fn: Any) -> Any:
        t = time.perf_counter()
        out = fn()
        times.setdefault(stage, []).append(_ms(t))
        return out

    def one(q: str) -> None:
        enc = timed("query_encoding", lambda: pipeline.embedder.encode([q], with_tokens=embedder_tokens and want_li))
        vec = enc.embeddings[0]
        tokens = None
        if want_li:
            tokens = enc.token_vectors[0].astype(np.float32) if embedder_tokens else \
                timed("query_tokens", lambda: pipeline.token_encoder.encode_queries([q])[0])
        bm25 = timed("bm25", lambda: index.bm25.search(q, request.candidates, None)) if "bm25" in stages else None
        dense = timed("dense", lambda: index.dense.search(vec, request.candidates, None, None)) \
            if "dense" in stages else None
        if bm25 is not None and dense is not None:
            current = timed("fusion", lambda: pipeline.fuse(bm25, dense))
        else:
            current = bm25 if bm25 is not None else dense
        if want_li and tokens is not None:
            truncated = embedder_tokens and len(tokens) >= pipeline.embedder.config.max_length - 2
            weight = rr.li_weight_for(len(tokens), truncated)
            if weight > 0:
                r = timed("late_interaction", lambda: index.late.rerank(tokens, current.chunk, request.li_top_k,
                                                                        weight, rr.li_score))
                current = reorder(current, r)
        # the cross-encoder as served: its gate, its passage windows, then the pairs (the gate's skips count as 0)
        if want_ce and rr.ce_gate_gap > 0 and decisive_gap(current.scores[: request.li_top_k]) >= rr.ce_gate_gap:
            times.setdefault("cross_encoder", []).append(0.0)
        elif want_ce:
            def score() -> Any:
                passages = pipeline.ce_passages(index, current.chunk[: request.ce_top_k], tokens, rr.ce_window_tokens)
                return pipeline.cross_encoder.score(pairs_for(q, passages))

            timed("cross_encoder", score)

    for q in queries[: min(5, len(queries))]:  # warm-up: sessions, caches, allocations
        one(q)
    times.clear()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for q in queries:
        one(q)
    cpu_ms = (time.process_time() - cpu0) * 1000.0 / len(queries)
    wall_ms = (time.perf_counter() - wall0) * 1000.0 / len(queries)
    stage_ms = {k: round(float(np.median(v)), 3) for k, v in times.items()}
    cores = cores or os.cpu_count() or 1
    return {"queries": len(queries), "stages": list(stages), "stage_p50_ms": stage_ms,
            "floor_ms": round(sum(stage_ms.values()), 3), "mean_wall_ms": round(wall_ms, 3),
            "cpu_ms_per_request": round(cpu_ms, 3), "cores": cores,
            "throughput_floor_qps": round(cores * 1000.0 / cpu_ms, 1) if cpu_ms > 0 else None}


def against_floor(entry: dict[str, Any], floor: dict[str, Any]) -> None:
    """Add ``p50_over_floor`` and ``qps_over_floor`` to a closed-loop level's entry.

    >>> e = {"p50_ms": 13.0, "qps": 100.0}
    >>> against_floor(e, {"floor_ms": 10.0, "throughput_floor_qps": 200.0}); e["p50_over_floor"], e["qps_over_floor"]
    (1.3, 0.5)
    """
    if entry.get("p50_ms") is not None and floor.get("floor_ms"):
        entry["p50_over_floor"] = round(entry["p50_ms"] / floor["floor_ms"], 3)
    if entry.get("qps") is not None and floor.get("throughput_floor_qps"):
        entry["qps_over_floor"] = round(entry["qps"] / floor["throughput_floor_qps"], 3)


def floor_of_index(index_dir: str, config_path: str | None, queries: list[str],
                   stages: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Open the pipeline the server would serve (same configuration) and measure its floor."""
    from retrieval.app import open_pipeline
    from retrieval.config import load_config

    pipeline = open_pipeline(Path(index_dir), load_config(config_path))
    try:
        return measure_floor(pipeline, queries, stages)
    finally:
        pipeline.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--dataset", required=True, help="BEIR folder: its judged queries of --split")
    ap.add_argument("--split", default="test")
    ap.add_argument("--config")
    ap.add_argument("--stages", default="", help="comma-separated stages (default: as configured)")
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--json", help="merge the result into this JSON file")
    args = ap.parse_args(argv)
    from retrieval.evaluate import judged_queries

    judged, _ = judged_queries(Path(args.dataset), args.split, args.queries)
    stages = tuple(s for s in args.stages.split(",") if s) or None
    floor = floor_of_index(args.index, args.config, list(judged.values()), stages)
    print(f"floor {floor['floor_ms']:.2f} ms ({', '.join(f'{k} {v:.2f}' for k, v in floor['stage_p50_ms'].items())}); "
          f"CPU {floor['cpu_ms_per_request']:.2f} ms/request -> throughput floor {floor['throughput_floor_qps']} QPS "
          f"on {floor['cores']} cores")
    if args.json:
        write_result(args.json, "floor", {"dataset": Path(args.dataset).name, "queries": args.queries,
                                          "stages": args.stages, "config": args.config or ""}, floor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
