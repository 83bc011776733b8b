"""Out-of-domain query sets built from a BEIR dataset's own judgments: the check that the cascade's defaults
travel to a task type they were not tuned on (issue #23).

``doc-query`` ("find the related passage"): a judged document becomes the query, and the *other* documents
judged relevant to the same original query are its relevant documents, with their grades. The query is a whole
abstract (100-300 words, like an argument-retrieval query), the relevant documents are its neighbours through
a shared information need (in SciFact a claim's supporting and contradicting abstracts, close to an argument and
its counter-argument), and the labels come from the dataset's assessors, not from any of our models (so no
stage is favoured by construction). The query's id is its source document's id: the BEIR convention
``ignore_identical_ids`` (:func:`retrieval.evaluate.evaluate`) drops the source document from every run, as BEIR
does for ArguAna and Quora.

Only queries with 2 to 20 relevant documents yield a doc-query; every relevant document of such a query is
a source (a source shared by several original queries gets the union of their relevant documents, the highest
grade kept). ``max_queries`` keeps a seeded sample. The result is a BEIR folder (``queries.jsonl``,
``qrels/<split>.tsv``, the corpus linked) that ``hybridrag eval`` and ``bench.cascade_robustness`` take as it is.

Usage::

    python -m bench.ood --dataset ../shared/data/beir/nfcorpus --split dev --out /tmp/nfcorpus-docq-dev
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from index_builder.corpus import iter_corpus, resolve_corpus_path
from retrieval.evaluate import Qrels, load_qrels

KINDS = ("doc-query",)


def doc_queries(qrels: Qrels, texts: dict[str, str], *, max_queries: int = 300, seed: int = 0,
                max_words: int = 300, max_relevant: int = 20) -> tuple[dict[str, str], Qrels]:
    """The doc-query set of one split (see the module docstring): ``(queries, qrels)``.

    ``texts``: document id -> title + text; a query keeps its first ``max_words`` words (the encoders truncate
    far sooner; BM25 reads them all). Only original queries with 2 to ``max_relevant`` relevant documents count:
    a broad need (NFCorpus has queries with hundreds of relevant documents) does not make its documents each
    other's neighbours.

    >>> q, r = doc_queries({"q1": {"a": 2, "b": 1, "c": 0}, "q2": {"a": 1}}, {"a": "alpha text", "b": "beta"})
    >>> sorted(q), r["a"], r["b"]
    (['a', 'b'], {'b': 1}, {'a': 2})
    """
    rel: Qrels = {}
    for judged in qrels.values():
        positive = {d: g for d, g in judged.items() if g > 0}
        if not 2 <= len(positive) <= max_relevant:
            continue
        for source in positive:
            if source not in texts:
                continue
            merged = rel.setdefault(source, {})
            for d, g in positive.items():
                if d != source:
                    merged[d] = max(g, merged.get(d, 0))
    ids = sorted(rel)
    if max_queries and len(ids) > max_queries:
        ids = sorted(random.Random(seed).sample(ids, max_queries))
    queries = {d: " ".join(texts[d].split()[:max_words]) for d in ids}
    return queries, {d: rel[d] for d in ids}


def document_texts(dataset: Path) -> dict[str, str]:
    return {d.id: f"{d.title}. {d.text}" if d.title else d.text for d in iter_corpus(dataset)}


def write_beir(out: Path, dataset: Path, split: str, queries: dict[str, str], qrels: Qrels,
               info: dict[str, object]) -> None:
    """A BEIR folder: ``queries.jsonl``, ``qrels/<split>.tsv``, the source corpus linked, and ``ood.json``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
        for qid, text in queries.items():
            f.write(json.dumps({"_id": qid, "text": text}) + "\n")
    with open(out / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for qid, judged in qrels.items():
            for d, g in sorted(judged.items()):
                f.write(f"{qid}\t{d}\t{g}\n")
    corpus = resolve_corpus_path(dataset)
    link = out / corpus.name
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(corpus.resolve())
    (out / "ood.json").write_text(json.dumps(info, indent=1) + "\n")


def build(dataset: Path, split: str, out: Path, *, kind: str = "doc-query", max_queries: int = 300,
          seed: int = 0) -> dict[str, object]:
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
    queries, qrels = doc_queries(load_qrels(dataset, split), document_texts(dataset), max_queries=max_queries,
                                 seed=seed)
    words = sorted(len(t.split()) for t in queries.values())
    info: dict[str, object] = {
        "kind": kind, "source": str(dataset), "split": split, "queries": len(queries),
        "qrels": sum(len(v) for v in qrels.values()), "seed": seed, "max_queries": max_queries,
        "query_words_median": words[len(words) // 2] if words else 0,
        "query_chars_max": max(map(len, queries.values()), default=0)}
    write_beir(out, dataset, split, queries, qrels, info)
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ood", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True, type=Path)
    p.add_argument("--split", default="test")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--kind", default="doc-query", choices=KINDS)
    p.add_argument("--max-queries", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    info = build(args.dataset, args.split, args.out, kind=args.kind, max_queries=args.max_queries, seed=args.seed)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
