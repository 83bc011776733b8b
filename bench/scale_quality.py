"""The scale bench's quality run (``hybridrag bench scale --quality``, :mod:`bench.scale`): SciFact's judged queries
over SciFact alone and over SciFact plus ``--distractors`` real passages of the Debian pool (never recombined,
never SciFact's own text), every vector the real model's (recorded ones reused, the rest embedded once and
recorded): nDCG@10 and recall@100 per stage, and the change."""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_quality(args: argparse.Namespace, log_dir: Path, run_build: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """SciFact test over SciFact alone and with ``--distractors`` real passages, real vectors throughout; each
    index built by ``run_build`` (:func:`bench.scale.run_build`: the product's build in a measured child).
    ValueError for what the options cannot give."""
    from bench.harness.pipelines import opened
    from bench.harness.vectors import VectorCache, model_identity, seed_cache_from_snapshot
    from bench.scale_corpus import read_pool, real_passages, write_jsonl
    from index_builder.documents.corpus import resolve_corpus_path
    from index_builder.models.encoders import Embedder
    from retrieval.config import load_config
    from retrieval.evaluate import hnsw_recall, judged_queries, run_stages, summarize

    if not args.dataset:
        raise ValueError("--quality needs --dataset (a BEIR folder: SciFact)")
    dataset = Path(args.dataset)
    config = load_config(args.config)
    vectors = Path(args.vectors_dir)
    own = vectors / dataset.name
    if args.seed_index:
        inner = Embedder(config.build_config().embedder)
        cache = VectorCache(own, model_identity(inner))
        added = seed_cache_from_snapshot(cache, args.seed_index, inner)
        print(f"  seeded {added} {dataset.name} rows from {args.seed_index} ({len(cache)} cached)", file=sys.stderr)
        del inner
    pool = read_pool(Path(args.corpus_dir))
    distractors = real_passages(Path(args.corpus_dir), args.distractors, args.seed, pool)
    if len(distractors) < args.distractors:
        raise ValueError(f"the pool has {len(pool)} real passages, fewer than --distractors {args.distractors}")
    work = Path(args.work)
    alone_corpus = resolve_corpus_path(dataset)
    mixed_corpus = work / f"quality-{dataset.name}-{args.distractors}.jsonl"
    write_jsonl(mixed_corpus.with_suffix(".distractors"), distractors)
    with open(mixed_corpus, "wb") as f:
        opener = gzip.open if alone_corpus.name.endswith(".gz") else open
        with opener(alone_corpus, "rb") as src:
            f.write(src.read().rstrip(b"\n") + b"\n")
        f.write(mixed_corpus.with_suffix(".distractors").read_bytes())
    mixed_corpus.with_suffix(".distractors").unlink()
    queries, qrels = judged_queries(dataset, args.split, args.limit)
    out: dict[str, Any] = {"dataset": dataset.name, "split": args.split, "queries": len(queries),
                           "distractors": args.distractors, "distractor_sources": _sources(distractors)}
    for name, corpus in (("alone", alone_corpus), ("with_distractors", mixed_corpus)):
        index = work / f"quality-{name}"
        build = run_build(corpus, index, "cached", args, [vectors / "debian", own], log_dir)
        with opened(index, config) as pipeline:
            for text in list(queries.values())[:5]:
                pipeline.search(text, 10)
            stages = run_stages(pipeline, queries, depth=100)
        summary = summarize(stages, qrels)
        out[name] = {"build": build, "chunks": build["chunks"],
                     "stages": {s: {k: m[k] for k in ("ndcg@10", "recall@100", "p50_ms", "p99_ms") if k in m}
                                for s, m in summary.items()},
                     "dense_recall@100": hnsw_recall(stages["dense"].hits, stages["dense_exact"].hits)}
        print(f"  {name}: " + ", ".join(f"{s} {m['ndcg@10']:.4f}" for s, m in summary.items()), file=sys.stderr)
        if not args.keep_indexes:
            shutil.rmtree(index, ignore_errors=True)
    out["ndcg@10_change"] = {s: round(m["ndcg@10"] - out["alone"]["stages"][s]["ndcg@10"], 4)
                             for s, m in out["with_distractors"]["stages"].items() if s in out["alone"]["stages"]}
    out["model_embedded"] = sum(out[n]["build"]["vectors"]["model"] for n in ("alone", "with_distractors"))
    return out


def _sources(rows: list[dict[str, Any]]) -> dict[str, int]:
    from collections import Counter

    return dict(sorted(Counter(r["metadata"]["source"] for r in rows).items()))


# ---------------------------------------------------------------------------------------------- main
