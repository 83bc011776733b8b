"""``search`` and ``eval``: queries answered in this process, from a snapshot (no server)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from hybridrag.commands.common import config_from, open_pipeline, thread_overrides


def cmd_search(args: argparse.Namespace) -> int:
    from retrieval.search.filters import Filter

    config = config_from(args, thread_overrides(args))
    pipeline = open_pipeline(Path(args.index), config)
    meta = dict(kv.split("=", 1) for kv in args.filter)
    for query in args.query:
        res = pipeline.search(query, args.k, filter=Filter.of(args.tenant, meta),
                              stages=args.stages.split(",") if args.stages else None)
        if args.json:
            print(json.dumps(result_json(pipeline, query, res)))
            continue
        timings = ", ".join(f"{k} {v:.1f}" for k, v in res.timings_ms.items())
        print(f"\n{query}\n  ({timings} ms{'; degraded: ' + str(res.skipped) if res.degraded else ''})")
        for rank, (d, s, c) in enumerate(zip(res.hits.doc, res.hits.scores, res.hits.chunk, strict=False), 1):
            doc = pipeline.index.documents[d]
            text = " ".join(pipeline.index.passage(int(c)).split())
            print(f"  {rank:2d}. {doc.id:<14} {s:.4f}  {doc.title[:40]!r}: {text[:90]}...")
    pipeline.close()
    return 0


def result_json(pipeline, query: str, res) -> dict[str, Any]:
    idx = pipeline.index
    return {"query": query, "generation": res.generation, "degraded": res.degraded, "skipped": res.skipped,
            "timings_ms": {k: round(v, 3) for k, v in res.timings_ms.items()},
            "hits": [{"id": idx.documents[d].id, "score": float(s), "chunk": int(c),
                      "title": idx.documents[d].title, "text": idx.passage(int(c))}
                     for d, s, c in zip(res.hits.doc, res.hits.scores, res.hits.chunk, strict=False)]}


def print_eval(out: dict[str, Any], summary_stages: dict[str, dict[str, float]], failed: dict[str, dict[str, str]],
               *, ef_search: int) -> None:
    """The per-stage table ``eval`` prints (the same with and without ``--by-type``)."""
    print(f"{out['dataset']} ({out['split']}, {out['queries']} queries)")
    print(f"{'stage':<17} {'nDCG@10':>8} {'R@100':>7} {'QPS':>8} {'p50 ms':>7} {'p99 ms':>7} {'failed':>6}")
    for name, m in summary_stages.items():
        print(f"{name:<17} {m['ndcg@10']:>8.4f} {m['recall@100']:>7.4f} {m['qps']:>8.1f} {m['p50_ms']:>7.2f} "
              f"{m['p99_ms']:>7.2f} {m['failed']:>6}")
    if "hnsw_recall@100" in out:
        print(f"HNSW recall@100 vs exact: {out['hnsw_recall@100']:.4f} (ef_search={ef_search})")
    if failed:
        first_id, first = next(iter(failed.items()))
        print(f"{len(failed)} of {out['queries']} queries failed in some stage (counted as 0; listed under "
              f"failed_queries in --json); first: {first_id}: {next(iter(first.values()))}")


def cmd_eval(args: argparse.Namespace) -> int:
    from retrieval.evaluate import RERANK_VARIANTS, failures, hnsw_recall, judged_queries, run_stages, summarize, write_trec

    config = config_from(args, thread_overrides(args))
    dataset = Path(args.dataset)
    queries, qrels = judged_queries(dataset, args.split, args.limit)
    tmp = None
    index_dir = Path(args.index) if args.index else None
    if index_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="hybridrag-eval-")
        index_dir = Path(tmp.name)
    build_info = None
    if not (index_dir / "CURRENT").exists():
        from index_builder.build.builder import build_snapshot
        from index_builder.documents.corpus import read_corpus

        docs, _ = read_corpus(dataset)
        summary = build_snapshot(docs, index_dir, config.build_config(), progress=not args.quiet)
        print(summary.line(), file=sys.stderr)
        build_info = {"seconds": round(summary.seconds, 1), "chunks": summary.chunks,
                      "bytes": summary.bytes_on_disk, "timings": {k: round(v, 1) for k, v in summary.timings.items()}}
    pipeline = open_pipeline(index_dir, config)
    # warm-up: first calls pay for lazy initialisation
    for text in list(queries.values())[:5]:
        try:
            pipeline.search(text, 10)
        except Exception:  # noqa: BLE001 -- the evaluation itself reports refused queries
            pass
    rerank = tuple(args.rerank.split(",")) if args.rerank else RERANK_VARIANTS
    stages = run_stages(pipeline, queries, depth=100, rerank=rerank)
    summary_stages = summarize(stages, qrels)
    out: dict[str, Any] = {"dataset": dataset.name, "split": args.split, "queries": len(queries),
                           "stages": summary_stages, "index": str(index_dir), "generation": pipeline.index.generation,
                           "embedder": pipeline.embedder.describe(), "threads": args.threads or "default",
                           "config": {"fusion": vars(config.fusion), "dense": vars(config.dense),
                                      "chunking": vars(config.chunking), "analyzer": vars(config.analyzer),
                                      "bm25": vars(config.bm25), "hnsw": vars(config.hnsw),
                                      "rerank": vars(config.rerank)},
                           "token_vectors": pipeline.index.token_encoder,
                           "cross_encoder": pipeline.cross_encoder.describe() if pipeline.cross_encoder else None}
    failed = failures(stages)
    out["failed_queries"] = failed
    if "dense" in stages:
        out["hnsw_recall@100"] = hnsw_recall(stages["dense"].hits, stages["dense_exact"].hits)
    if build_info:
        out["build"] = build_info
    print_eval(out, summary_stages, failed, ef_search=config.dense.ef_search)
    if args.by_type:
        from retrieval.evaluate import by_type, format_by_type, load_query_types, type_gaps

        table = by_type(qrels, {n: st.run for n, st in stages.items()}, load_query_types(dataset),
                        {n: st.failed for n, st in stages.items()})
        out["by_type"], out["type_gaps"] = table, type_gaps(table, served=list(stages)[-1])
        print(format_by_type(table, out["type_gaps"]))
    if args.run_dir:
        run_dir = Path(args.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        for name, st in stages.items():
            write_trec(run_dir / f"{name}.trec", st.run, f"hybridrag-{name}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    pipeline.close()
    if tmp is not None:
        tmp.cleanup()
    return 0
