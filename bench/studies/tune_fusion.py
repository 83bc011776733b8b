"""Choose RRF's k and per-retriever weights on tuning splits, then report the test split -- never tune on test.

For each dataset the BM25 and dense top-100 lists are computed once per query; every (k, bm25 weight) pair of
the grid (dense weight 1) is then scored by BEIR nDCG@10. The chosen setting maximises the mean nDCG@10 over the
tuning splits (SciFact train, NFCorpus dev). Usage::

    python -m bench.studies.tune_fusion --set ../shared/data/beir/scifact:INDEX_DIR:train \\
                                        --set ../shared/data/beir/nfcorpus:INDEX_DIR:dev [--json results/fusion.json]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import write_result
from bench.harness.pipelines import opened
from retrieval.config import load_config
from retrieval.evaluate import evaluate, load_qrels, load_queries
from retrieval.search.fusion import rrf

K_GRID = (1, 5, 10, 20, 40, 60, 100)
W_GRID = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)


def rankings(index: Any, embedder: Any, queries: dict[str, str], depth: int = 100) -> dict[str, Any]:
    out = {}
    for qid, text in queries.items():
        bm = index.bm25.search(text, depth)
        de = index.dense.search(embedder.embed([text])[0], depth)
        out[qid] = (bm.doc, de.doc)
    return out


def fused_ndcg(index: Any, qrels, ranks, k: float, w_bm25: float, w_dense: float = 1.0) -> float:
    run = {}
    for qid, (bm, de) in ranks.items():
        ids, scores = rrf([bm, de], k=k, weights=[w_bm25, w_dense])
        ids, scores = ids[:100], scores[:100]
        run[qid] = {index.documents[d].id: float(s) + (100 - r) * 1e-9 for r, (d, s) in enumerate(zip(ids, scores, strict=False))}
    return evaluate(qrels, run)["ndcg@10"]


def single_ndcg(index: Any, qrels, ranks, which: int) -> float:
    run = {qid: {index.documents[d].id: float(100 - r) for r, d in enumerate(r_[which])} for qid, r_ in ranks.items()}
    return evaluate(qrels, run)["ndcg@10"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.studies.tune_fusion", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", action="append", required=True, metavar="DATASET:INDEX:SPLIT")
    ap.add_argument("--test-split", default="test")
    ap.add_argument("--config")
    ap.add_argument("--limit", type=int, default=0, help="only the first N queries of each split (smoke runs)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    config = load_config(args.config)
    with contextlib.ExitStack() as stack:
        pipelines = {d: stack.enter_context(opened(d, config)) for d in dict.fromkeys(
            spec.rsplit(":", 2)[1] for spec in args.set)}
        report = tune(args, pipelines)
    if args.json:
        write_result(args.json, "tune_fusion", {k: v for k, v in vars(args).items() if k != "json"}, report)
    return 0


def judged(dataset: str, split: str, limit: int) -> tuple[dict[str, str], dict]:
    queries = load_queries(Path(dataset))
    qrels = load_qrels(Path(dataset), split)
    texts = {q: queries[q] for q in qrels if q in queries}
    return dict(list(texts.items())[:limit]) if limit else texts, qrels


def tune(args: argparse.Namespace, pipelines: dict[str, Any]) -> dict[str, Any]:
    grid = list(itertools.product(K_GRID, W_GRID))
    tune_scores = np.zeros(len(grid))
    report: dict = {"grid": {"k": K_GRID, "bm25_weight": W_GRID, "dense_weight": 1.0}, "datasets": {}}
    loaded = []
    for spec in args.set:
        dataset, index_dir, split = spec.rsplit(":", 2)
        index, embedder = pipelines[index_dir].index, pipelines[index_dir].embedder
        queries, qrels = judged(dataset, split, args.limit)
        ranks = rankings(index, embedder, queries)
        scores = np.array([fused_ndcg(index, qrels, ranks, k, w) for k, w in grid])
        tune_scores += scores / len(args.set)
        name = Path(dataset).name
        report["datasets"][name] = {"tune_split": split, "queries": len(ranks),
                                    "bm25": single_ndcg(index, qrels, ranks, 0),
                                    "dense": single_ndcg(index, qrels, ranks, 1),
                                    "fused_by_setting": {f"k={k},w_bm25={w}": s for (k, w), s in zip(grid, scores, strict=False)}}
        loaded.append((name, dataset, index, embedder))
        print(f"{name} {split}: bm25 {report['datasets'][name]['bm25']:.4f} dense "
              f"{report['datasets'][name]['dense']:.4f} best fused {scores.max():.4f} at {grid[int(scores.argmax())]}")
    best = grid[int(tune_scores.argmax())]
    report["chosen"] = {"k": best[0], "bm25_weight": best[1], "dense_weight": 1.0,
                        "mean_tune_ndcg@10": round(float(tune_scores.max()), 5)}
    print(f"chosen on tuning splits: k={best[0]}, bm25_weight={best[1]} (mean nDCG@10 {tune_scores.max():.4f})")
    for name, dataset, index, embedder in loaded:
        queries, qrels = judged(dataset, args.test_split, args.limit)
        ranks = rankings(index, embedder, queries)
        test = {"bm25": single_ndcg(index, qrels, ranks, 0), "dense": single_ndcg(index, qrels, ranks, 1),
                "fused_chosen": fused_ndcg(index, qrels, ranks, best[0], best[1]),
                "fused_k60_equal": fused_ndcg(index, qrels, ranks, 60, 1.0)}
        report["datasets"][name]["test"] = test
        print(f"{name} {args.test_split}: " + ", ".join(f"{k} {v:.4f}" for k, v in test.items()))
    return report


if __name__ == "__main__":
    sys.exit(main())
