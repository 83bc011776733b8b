"""The scale bench's dense recall (:mod:`bench.scale`): recall@100 of the served dense stage against exact search,
for the bench's queries and for in-domain sentences of the corpus, and the ``--recall-indexes`` / ``--recall-ef``
sweep over built indexes; kept apart from the size runs (:mod:`bench.scale`), as the quality run is
(:mod:`bench.scale_quality`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.harness import ints, percentiles, query_list
from index_builder.snapshot.format import current_snapshot_dir


def corpus_queries(corpus: Path, n: int, seed: int) -> list[tuple[str, str]]:
    """Without ``--dataset``: the first sentence (at most 20 words) of ``n`` passages drawn from the corpus."""
    import numpy as np

    with open(corpus, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    pick = np.random.default_rng(seed).permutation(len(rows))[:n]
    return [(f"q{i}", " ".join(rows[i]["text"].split(". ")[0].split()[:20])) for i in pick]


def measure_recall(index: Path, queries: list[tuple[str, str]], config_path: str | None, k: int = 100, *,
                   in_domain: list[tuple[str, str]] | None = None, ef_search: int | None = None) -> dict:
    """recall@k of the served dense stage against exact search over the same vectors, in process: for
    ``queries`` (the bench's queries: with ``--dataset``, out of the corpus's domain) and, when given, for
    ``in_domain`` queries (sentences of the corpus itself, :func:`corpus_queries`; under ``"in_domain"``). HNSW
    finds the neighbours of queries far from every passage less well than of queries among them. ``ef_search``:
    the served ``[dense] ef_search`` replaced (a sweep)."""
    import dataclasses

    from bench.harness.pipelines import opened
    from retrieval.config import load_config
    from retrieval.evaluate import hnsw_recall, run_stages

    config = load_config(config_path)
    if ef_search:
        config = dataclasses.replace(config, dense=dataclasses.replace(config.dense, ef_search=ef_search))
    sets = {"main": queries, **({"in_domain": in_domain} if in_domain else {})}
    out: dict[str, Any] = {"k": k, "ef_search": config.dense.ef_search}
    with opened(index, config) as pipeline:
        for _, text in queries[:3]:  # lazy initialisation outside the timings
            pipeline.search(text, 10)
        for name, qs in sets.items():
            stages = run_stages(pipeline, dict(qs), depth=k, rerank=())
            if "dense" not in stages or "dense_exact" not in stages:
                return {"recall": None, "why": "no dense stage"}
            got = {"recall": hnsw_recall(stages["dense"].hits, stages["dense_exact"].hits, k),
                   "queries": len(stages["dense"].hits),
                   "dense": percentiles(1000 * s for s in stages["dense"].seconds),
                   "dense_exact": percentiles(1000 * s for s in stages["dense_exact"].seconds)}
            if name == "main":
                out.update(got)
            else:
                out[name] = got
    return out


def recall_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """``--recall-indexes A,B --recall-ef E1,E2``: recall@100 of each built index's dense stage against exact search
    at each ``ef_search``, for the bench's queries and for sentences of the index's own corpus (in domain)."""
    from bench.scale_corpus import corpus_path

    if not args.dataset:
        raise ValueError("--recall-indexes needs --dataset (the out-of-domain queries)")
    queries, _ = query_list(args.dataset, args.split, args.limit)
    queries = queries[:args.recall_queries]
    out: dict[str, Any] = {"indexes": {}}
    for index in [Path(p) for p in args.recall_indexes.split(",") if p]:
        manifest = json.loads((current_snapshot_dir(index) / "manifest.json").read_text())
        docs = manifest["counts"]["documents"]
        corpus = corpus_path(Path(args.corpus_dir), docs)
        in_domain = corpus_queries(corpus, args.recall_queries, args.seed + 1) if corpus.is_file() else None
        rows = {}
        for ef in ints(args.recall_ef):
            r = measure_recall(index, queries, args.config, in_domain=in_domain, ef_search=ef)
            rows[str(ef)] = r
            print(f"{index.name} ef_search {ef}: recall@100 {r.get('recall')} (in domain "
                  f"{(r.get('in_domain') or {}).get('recall')}), dense p50 {r['dense']['p50_ms']} ms, exact "
                  f"{r['dense_exact']['p50_ms']} ms", file=sys.stderr)
        out["indexes"][str(index)] = {"documents": docs, "chunks": manifest["counts"]["chunks"],
                                      "dense": manifest.get("dense", {}),
                                      "by_ef_search": rows}
    return out
