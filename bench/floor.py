"""The compute floor of a request: each stage's own compute, alone, for the same queries the load bench sends.

For each query, the served stage modules (retrieval/search/stages) run on the calling thread (no event loop, no
worker pool, no batcher, no server, no cache): the query encoding (the embedder's pass, with token vectors when
late interaction uses them; a ColBERT encoder's own pass is inside late interaction's time), BM25, HNSW, fusion,
MaxSim over the head, and the cross-encoder over its top when it is among the stages (its gate and windows as
served). Per stage the median; their sum is the **latency floor** of one request. The **throughput floor** is
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

from bench.harness import median, write_result


def measure_floor(pipeline: Any, queries: list[str], stages: tuple[str, ...] | None = None,
                  cores: int | None = None) -> dict[str, Any]:
    """Median ms of each stage's compute over ``queries``, their sum, CPU ms per request and the throughput floor.
    ``stages``: the request's stages (default: the pipeline's).

    The stages are the served ones (:mod:`retrieval.search.stages`), run in sequence on this thread with the models
    called directly (:class:`~retrieval.search.runner.ThreadRunner`), without the pipeline around them (its cache,
    its deadlines, its pools); each stage's time is what it reports of its own compute. A gated cross-encoder
    counts as 0, as served."""
    from retrieval.search.request import SearchRequest
    from retrieval.search.runner import ThreadRunner
    from retrieval.search.stages.query import Query

    runner = ThreadRunner(pipeline.models)
    first, late, ce = pipeline.first_stage, pipeline.li_stage, pipeline.ce_stage
    request = pipeline.resolve(SearchRequest.of(queries[0], 10, stages=stages, use_cache=False))
    assert request.stages is not None and request.li_top_k is not None
    stages = request.stages
    want_li = "late_interaction" in stages and late.unavailable(pipeline.index) is None
    want_ce = "cross_encoder" in stages and pipeline.cross_encoder is not None
    times: dict[str, list[float]] = {}

    async def stages_of(q: Query) -> None:
        if want_li:
            late.start(q)  # a ColBERT encoder's own pass (the embedder's tokens come with the embedding)
        hits = await first.run(q, need_tokens=want_li and late.embedder_tokens)
        if want_li:
            hits = await late.run(q, hits)
        if want_ce and ce.gated(hits, request.li_top_k) is None:
            hits = await ce.run(q, hits)
        elif want_ce:
            q.result.timings_ms["cross_encoder"] = 0.0

    def one(text: str) -> None:
        q = Query(pipeline.resolve(SearchRequest.of(text, 10, stages=stages, use_cache=False)), pipeline.index, runner)
        ThreadRunner.run(stages_of(q))
        for stage, ms in q.result.timings_ms.items():
            if not stage.endswith("_queue"):
                times.setdefault("query_encoding" if stage == "embed" else stage, []).append(ms)

    for q in queries[: min(5, len(queries))]:  # warm-up: sessions, caches, allocations
        one(q)
    times.clear()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for q in queries:
        one(q)
    cpu_ms = (time.process_time() - cpu0) * 1000.0 / len(queries)
    wall_ms = (time.perf_counter() - wall0) * 1000.0 / len(queries)
    stage_ms = {k: median(v) for k, v in times.items()}
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
