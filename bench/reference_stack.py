"""The reference stack (issue #53): what a user would build instead, from the usual tutorial, run on the same
BEIR folder and scored by the same per-type code as ``hybridrag eval --by-type``
(:func:`retrieval.evaluate.by_type`).

- **BM25**: ``bm25s.BM25(k1=1.5, b=0.75)`` (its defaults, Lucene's IDF) over whole documents (``title. text``),
  tokenised the bm25s README's way (``bm25s.tokenize``: English stopwords, PyStemmer's English stemmer); top 100,
  documents scoring 0 left out;
- **dense**: one embedding per whole document by the bundled MiniLM through the product's
  :class:`index_builder.models.encoders.Embedder` (truncated at 256 word pieces, as the model truncates), in a
  ``faiss.IndexHNSWFlat`` (M 32, efConstruction 40, efSearch 128, inner product over normalised vectors); top 100.
  The document embeddings are cached as ``.npy`` keyed by the corpus file's path, size and time;
- **reference**: reciprocal rank fusion of the two lists, ``sum 1 / (60 + rank)`` (rank from 1).

Usage::

    python -m bench.reference_stack --dataset results/querytypes/scifact --split tune [--json F]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.evaluate import (
    Run,
    by_type,
    document_texts,
    evaluate,
    format_by_type,
    judged_queries,
    load_query_types,
)

RRF_K = 60
DEPTH = 100
CACHE = Path(os.environ.get("TMPDIR", "/tmp")) / "hybridrag-reference-stack"


def _stemmer() -> Any:
    import Stemmer

    return Stemmer.Stemmer("english")


def bm25_runs(ids: list[str], texts: list[str], queries: dict[str, str], depth: int = DEPTH) -> Run:
    import bm25s

    stemmer = _stemmer()
    model = bm25s.BM25(k1=1.5, b=0.75)
    model.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
    qids = list(queries)
    tokens = bm25s.tokenize([queries[q] for q in qids], stopwords="en", stemmer=stemmer, show_progress=False,
                            return_ids=False)
    run: Run = {}
    k = min(depth, len(ids))
    for qid, toks in zip(qids, tokens, strict=True):
        if not toks:
            run[qid] = {}
            continue
        docs, scores = model.retrieve([toks], k=k, show_progress=False, n_threads=1)
        run[qid] = {ids[d]: float(s) for d, s in zip(docs[0].tolist(), scores[0].tolist(), strict=True) if s > 0}
    return run


def document_vectors(dataset: Path, texts: list[str], embedder: Any) -> np.ndarray:
    from index_builder.documents.corpus import resolve_corpus_path

    corpus = resolve_corpus_path(dataset).resolve()
    st = corpus.stat()
    key = hashlib.sha1(f"{corpus}:{st.st_size}:{st.st_mtime_ns}:{embedder.files.sha256}".encode()).hexdigest()[:16]
    path = CACHE / f"{key}.npy"
    if path.is_file():
        return np.load(path)
    vecs = embedder.embed(texts, progress=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, vecs)
    return vecs


def dense_runs(ids: list[str], vecs: np.ndarray, qvecs: dict[str, np.ndarray], depth: int = DEPTH) -> Run:
    import faiss

    index = faiss.IndexHNSWFlat(vecs.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 40
    index.add(np.ascontiguousarray(vecs, dtype=np.float32))
    index.hnsw.efSearch = 128
    qids = list(qvecs)
    scores, docs = index.search(np.stack([qvecs[q] for q in qids]).astype(np.float32), min(depth, len(ids)))
    return {q: {ids[d]: float(s) for d, s in zip(docs[i].tolist(), scores[i].tolist(), strict=True) if d >= 0}
            for i, q in enumerate(qids)}


def rrf(*runs: Run, k: int = RRF_K) -> Run:
    """Reciprocal rank fusion: ``sum 1 / (k + rank)`` over the runs a document is in (rank from 1).

    >>> rrf({"q": {"a": 2.0, "b": 1.0}}, {"q": {"b": 0.9}})["q"]["b"] > rrf({"q": {"a": 2.0}}, {"q": {}})["q"]["a"]
    True
    """
    out: Run = {}
    for run in runs:
        for q, docs in run.items():
            fused = out.setdefault(q, {})
            for rank, (d, _) in enumerate(sorted(docs.items(), key=lambda kv: -kv[1]), 1):
                fused[d] = fused.get(d, 0.0) + 1.0 / (k + rank)
    return out


def run_reference(dataset: Path, split: str) -> dict[str, Any]:
    """The three runs on ``dataset``'s ``split`` and their figures: overall (nDCG@10, Recall@100) and per type."""
    from index_builder.models.encoders import Embedder
    from retrieval.config import EmbedderConfig

    t0 = time.perf_counter()
    queries, qrels = judged_queries(dataset, split)
    docs = document_texts(dataset)
    ids, texts = list(docs), list(docs.values())
    embedder = Embedder(EmbedderConfig())
    vecs = document_vectors(dataset, texts, embedder)
    qids = list(queries)
    qv = embedder.embed([queries[q] for q in qids])
    runs = {"bm25s": bm25_runs(ids, texts, queries)}
    runs["faiss_hnsw"] = dense_runs(ids, vecs, {q: qv[i] for i, q in enumerate(qids)})
    runs["reference"] = rrf(runs["bm25s"], runs["faiss_hnsw"])
    return {"dataset": str(dataset), "split": split, "queries": len(queries), "documents": len(ids),
            "overall": {n: evaluate(qrels, r) for n, r in runs.items()},
            "by_type": by_type(qrels, runs, load_query_types(dataset)),
            "settings": {"bm25": {"k1": 1.5, "b": 0.75, "stopwords": "en", "stemmer": "english"},
                         "hnsw": {"M": 32, "efConstruction": 40, "efSearch": 128}, "rrf_k": RRF_K, "depth": DEPTH,
                         "embedder": embedder.describe()},
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.reference_stack", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True, type=Path)
    p.add_argument("--split", default="tune")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    out = run_reference(args.dataset, args.split)
    print(f"{args.dataset.name} ({args.split}, {out['queries']} queries): " + ", ".join(
        f"{n} nDCG@10 {m['ndcg@10']:.4f}" for n, m in out["overall"].items()))
    print(format_by_type(out["by_type"], {}))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
