"""BM25 design check: whole documents vs chunks (MaxP), Porter vs Snowball English stemming, on test and tuning
splits. Justifies the defaults (chunk-level BM25 and Porter): see README, Results. Usage::

    python -m bench.studies.bm25_units --dataset ../shared/data/beir/scifact --splits test,train [--json F]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import bm25s
import numpy as np

from bench.harness import write_result
from index_builder.documents.analysis import Analyzer
from index_builder.documents.chunking import CHUNK_DTYPE, Chunker, chunk_passage
from index_builder.documents.corpus import read_corpus
from index_builder.models.encoders import bundled_minilm
from index_builder.settings import AnalyzerConfig, ChunkConfig
from retrieval.evaluate import evaluate, load_qrels, load_queries
from retrieval.search.aggregate import doc_starts, top_docs_from_chunk_scores


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.studies.bm25_units", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--splits", default="test")
    ap.add_argument("--json", help="merge the result into this JSON file")
    args = ap.parse_args(argv)
    result: dict[str, dict[str, dict[str, float]]] = {}
    docs, _ = read_corpus(args.dataset)
    queries = load_queries(args.dataset)
    units = {"document": np.array([(i, 0, len(d.text)) for i, d in enumerate(docs)], dtype=CHUNK_DTYPE),
             "chunk 224/48": Chunker(bundled_minilm().tokenizer_path, ChunkConfig(224, 48)).chunk(docs)}
    for unit, chunks in units.items():
        passages = [chunk_passage(docs[c["doc"]].title, docs[c["doc"]].text[c["start"]:c["end"]]) for c in chunks]
        starts = doc_starts(chunks["doc"].astype(np.int64), len(docs))
        for stemmer in ("porter", "english"):
            analyzer = Analyzer(AnalyzerConfig(stemmer=stemmer))
            bm25 = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
            bm25.index(analyzer.batch(passages), show_progress=False)
            row = []
            for split in args.splits.split(","):
                qrels = load_qrels(args.dataset, split)
                run = {}
                for q in qrels:
                    scores = bm25.get_scores_from_ids(bm25.get_tokens_ids(analyzer(queries[q])))
                    h = top_docs_from_chunk_scores(scores, starts, 100, min_score=0.0)
                    run[q] = {docs[d].id: float(100 - r) for r, d in enumerate(h.doc)}
                m = evaluate(qrels, run)
                row.append(f"{split} nDCG@10 {m['ndcg@10']:.4f} R@100 {m['recall@100']:.4f}")
                result.setdefault(f"{unit}, {stemmer}", {})[split] = {"ndcg@10": m["ndcg@10"],
                                                                      "recall@100": m["recall@100"],
                                                                      "units": len(chunks)}
            print(f"{unit:<13} ({len(chunks):>6} units) {stemmer:<8} " + " | ".join(row), flush=True)
    if args.json:
        write_result(args.json, "bm25_units", {"dataset": Path(args.dataset).name, "splits": args.splits}, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
