"""BM25 serving speed: bm25s (what the service uses) against rank-bm25 (the usual tutorial choice), same run.

Both index the same units (the snapshot's chunks, title prepended) with the same Lucene-like analysis and
k1/b, answer the dataset's test queries one at a time (analysis + scoring + top-100 per document), and are scored
with BEIR's nDCG@10 so the speed-up is not bought with quality. Usage::

    python -m bench.bm25_speed --dataset ../shared/data/beir/scifact [--json results/bench.json] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from bench.harness import machine, measure, write_result
from index_builder.documents.analysis import Analyzer
from index_builder.documents.chunking import Chunker, chunk_passage
from index_builder.documents.corpus import read_corpus
from index_builder.models.encoders import bundled_minilm
from index_builder.settings import BM25Config, ChunkConfig
from index_builder.types import Hits
from retrieval.evaluate import evaluate, load_qrels, load_queries
from retrieval.search.aggregate import doc_starts, top_docs_from_chunk_scores


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--split", default="test")
    ap.add_argument("--limit", type=int, default=0, help="only the first N queries (smoke runs)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="merge the result into this JSON file")
    args = ap.parse_args(argv)

    import bm25s
    from rank_bm25 import BM25Okapi

    docs, _ = read_corpus(args.dataset)
    chunks = Chunker(bundled_minilm().tokenizer_path, ChunkConfig()).chunk(docs)
    passages = [chunk_passage(docs[c["doc"]].title, docs[c["doc"]].text[c["start"]:c["end"]]) for c in chunks]
    starts = doc_starts(chunks["doc"].astype(np.int64), len(docs))
    analyzer, params = Analyzer(), BM25Config()
    corpus_tokens = analyzer.batch(passages)

    t = time.perf_counter()
    fast = bm25s.BM25(k1=params.k1, b=params.b, method="lucene")
    fast.index(corpus_tokens, show_progress=False)
    index_fast = time.perf_counter() - t
    t = time.perf_counter()
    slow = BM25Okapi(corpus_tokens, k1=params.k1, b=params.b)
    index_slow = time.perf_counter() - t

    qrels = load_qrels(args.dataset, args.split)
    all_q = load_queries(args.dataset)
    queries = [(q, all_q[q]) for q in qrels if q in all_q]
    if args.limit:
        queries = queries[: args.limit]

    def search_bm25s(text: str) -> Hits:
        scores = fast.get_scores_from_ids(fast.get_tokens_ids(analyzer(text)))
        return top_docs_from_chunk_scores(scores, starts, 100, min_score=0.0)

    def search_rank_bm25(text: str) -> Hits:
        scores = np.asarray(slow.get_scores(analyzer(text)), dtype=np.float32)
        return top_docs_from_chunk_scores(scores, starts, 100, min_score=0.0)

    def quality(search) -> float:
        run = {q: {docs[d].id: float(s) for d, s in zip(h.doc, h.scores, strict=False)}
               for q, h in ((q, search(text)) for q, text in queries)}
        return evaluate(qrels, run)["ndcg@10"]

    texts = [text for _, text in queries]
    # back to back in one process, same queries, same machine load as far as a shared machine allows
    res_fast = measure(search_bm25s, texts, repeats=args.repeats)
    res_slow = measure(search_rank_bm25, texts, repeats=args.repeats)
    result = {
        "dataset": args.dataset.rstrip("/").split("/")[-1], "queries": len(texts), "chunks": len(passages),
        "bm25s": {**res_fast, "index_s": round(index_fast, 2), "ndcg@10": quality(search_bm25s)},
        "rank_bm25": {**res_slow, "index_s": round(index_slow, 2), "ndcg@10": quality(search_rank_bm25)},
    }
    result["qps_ratio"] = round(res_fast["qps"] / res_slow["qps"], 1)
    result["p50_ratio"] = round(res_slow["p50_ms"] / res_fast["p50_ms"], 1)
    print(f"{result['dataset']}: {len(texts)} queries over {len(passages)} chunks ({machine()['cpu']})")
    for name in ("bm25s", "rank_bm25"):
        r = result[name]
        print(f"  {name:<10} {r['qps']:>9.1f} q/s  p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
              f"index {r['index_s']:6.2f} s  nDCG@10 {r['ndcg@10']:.4f}")
    print(f"  bm25s / rank-bm25: {result['qps_ratio']}x queries per second")
    if args.json:
        write_result(args.json, "bm25_speed", {"dataset": result["dataset"], "split": args.split,
                                              "limit": args.limit, **vars(params)}, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
