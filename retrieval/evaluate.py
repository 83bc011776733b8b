"""BEIR-style evaluation: nDCG@10 and Recall@100 per stage, HNSW recall against exact search, single-thread QPS.

Follows ``beir.retrieval.evaluation.EvaluateRetrieval.evaluate`` exactly: qrels read with integer grades
(graded nDCG on NFCorpus), only queries present in the split's qrels are run, results whose document id equals
the query id are dropped (``ignore_identical_ids=True``), ``pytrec_eval`` computes ``ndcg_cut.10`` and
``recall.100``, and the mean is taken over the queries pytrec_eval scores.
"""

from __future__ import annotations

import csv
import functools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytrec_eval

from index_builder.errors import CorpusError
from index_builder.types import Hits
from retrieval.search.filters import Filter
from retrieval.search.pipeline import Pipeline
from retrieval.search.request import SearchRequest
from retrieval.search.view import IndexView

Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]


def load_queries(dataset: Path) -> dict[str, str]:
    path = Path(dataset) / "queries.jsonl"
    if not path.is_file():
        raise CorpusError("no queries.jsonl in the dataset folder", path=str(dataset))
    out = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    o = json.loads(line)
                    out[str(o["_id"])] = o["text"]
                except (json.JSONDecodeError, KeyError) as e:
                    raise CorpusError(f"bad query line ({e})", path=str(path), line=lineno) from None
    return out


def load_qrels(dataset: Path, split: str = "test") -> Qrels:
    path = Path(dataset) / "qrels" / f"{split}.tsv"
    if not path.is_file():
        raise CorpusError(f"no qrels for split {split!r}", path=str(path))
    qrels: Qrels = {}
    with open(path, encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_MINIMAL)
        next(reader)  # header
        for row in reader:
            if row:
                qrels.setdefault(row[0], {})[row[1]] = int(row[2])
    return qrels


def judged_queries(dataset: Path, split: str = "test", limit: int = 0) -> tuple[dict[str, str], Qrels]:
    """The split's judged queries that have a text, in qrels order (the first ``limit`` when > 0), and its qrels."""
    qrels = load_qrels(dataset, split)
    texts = load_queries(dataset)
    queries = {q: texts[q] for q in qrels if q in texts}
    return (dict(list(queries.items())[:limit]) if limit else queries), qrels


def evaluate(qrels: Qrels, run: Run, *, ignore_identical_ids: bool = True, failed: int = 0) -> dict[str, float]:
    """Mean nDCG@10 and Recall@100 over the queries pytrec_eval scores (BEIR's convention), plus ``failed``
    queries (refused or errored: no run) counted as 0 -- dropping them would flatter a stage that fails on the
    hard ones."""
    if ignore_identical_ids:
        run = {q: {d: s for d, s in docs.items() if d != q} for q, docs in run.items()}
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"})
    scores = evaluator.evaluate(run)
    n = max(len(scores) + failed, 1)
    return {"ndcg@10": round(sum(s["ndcg_cut_10"] for s in scores.values()) / n, 5),
            "recall@100": round(sum(s["recall_100"] for s in scores.values()) / n, 5),
            "queries": len(scores), "failed": failed}


def hits_to_run(index: IndexView, hits: Hits) -> dict[str, float]:
    """Document ids -> rank-based scores (n, n-1, ...): every tool that re-sorts by score (pytrec_eval, trec_eval)
    then sees exactly the ranking we serve, ties and reranked heads included (a reranked head carries the
    reranker's scores, its tail the previous stage's: not comparable, so raw scores must not be re-sorted)."""
    return docs_to_run(index, hits.doc)


def docs_to_run(index: IndexView, doc: np.ndarray) -> dict[str, float]:
    """:func:`hits_to_run` for a ranking given as document numbers (int [n], best first)."""
    n = len(doc)
    return {index.documents[d].id: float(n - rank) for rank, d in enumerate(doc.tolist())}


def _why(e: Exception) -> str:
    """A failed query's reason as recorded: the error's type and message, cut to 500 characters."""
    return f"{type(e).__name__}: {e}"[:500]


def write_trec(path: Path, run: Run, tag: str) -> None:
    """TREC run format: ``qid Q0 docid rank score tag``, best first."""
    with open(path, "w", encoding="utf-8") as f:
        for qid in sorted(run):
            ranked = sorted(run[qid].items(), key=lambda kv: -kv[1])
            for rank, (doc, score) in enumerate(ranked, 1):
                f.write(f"{qid} Q0 {doc} {rank} {score:.6f} {tag}\n")


@dataclass
class StageRun:
    run: Run = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    hits: dict[str, Hits] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # query id -> why it has no run (refused, errored)


RERANK_VARIANTS = ("late_interaction", "cross_encoder", "cascade")


def run_stages(pipeline: Pipeline, queries: Mapping[str, str], *, depth: int = 100,
               progress: Callable[[int], None] | None = None,
               rerank: Sequence[str] = RERANK_VARIANTS) -> dict[str, StageRun]:
    """Run each stage alone per query, timing each call (query embedding included in the dense stages).

    ``rerank``: which reranking variants to run, where the index and models allow (late interaction alone on the
    fused list, the cross-encoder alone on it, and the cascade of both). A query a stage refuses or fails on is
    recorded in that stage's ``failed`` (with the error's message) and the run goes on."""
    index = pipeline.index
    names = ["bm25", "dense", "dense_exact", "fused"]
    li = pipeline.late_interaction_unavailable(index) is None
    ce = pipeline.cross_encoder is not None
    available = {"late_interaction": li, "cross_encoder": ce, "cascade": li and ce}
    names += [v for v in RERANK_VARIANTS if v in rerank and available[v]]
    stages = {name: StageRun() for name in names}

    def record(name: str, qid: str, hits: Hits, seconds: float) -> None:
        st = stages[name]
        st.run[qid] = hits_to_run(index, hits)
        st.seconds.append(seconds)
        st.hits[qid] = hits

    def attempt(names: Sequence[str], qid: str, fn: Callable[..., Hits], *args: Any, extra_s: float = 0.0) -> bool:
        t = time.perf_counter()
        try:
            hits = fn(*args)
        except Exception as e:  # noqa: BLE001 -- a refused or failed query is reported, never aborts the run
            for name in names:
                stages[name].failed[qid] = _why(e)
            return False
        record(names[0], qid, hits, extra_s + time.perf_counter() - t)
        return True

    def search(text: str, extra: tuple[str, ...]) -> Hits:
        return pipeline.search(text, depth, filter=Filter(), candidates=depth, stages=("bm25", "dense", *extra),
                               use_cache=False).hits

    for i, (qid, text) in enumerate(queries.items()):
        try:  # the service's own bounds apply to every stage, the ones called directly included
            pipeline.resolve(SearchRequest.of(text, depth, candidates=depth))
        except Exception as e:  # noqa: BLE001
            for st in stages.values():
                st.failed[qid] = _why(e)
            if progress:
                progress(i + 1)
            continue
        attempt(["bm25"], qid, index.bm25.search, text, depth)
        if index.dense is not None:
            t = time.perf_counter()
            try:
                vec = pipeline.embed_query(text)
            except Exception as e:  # noqa: BLE001
                for name in ("dense", "dense_exact"):
                    stages[name].failed[qid] = _why(e)
            else:
                embed_s = time.perf_counter() - t
                attempt(["dense"], qid, index.dense.search, vec, depth, extra_s=embed_s)
                attempt(["dense_exact"], qid, functools.partial(index.dense.search, exact=True), vec, depth,
                        extra_s=embed_s)
        attempt(["fused"], qid, search, text, ())
        # Each reranking variant is a full pipeline call (so it pays exactly what serving pays, e.g. late
        # interaction shares the dense stage's encoder pass); all start from the same (deterministic) fused list.
        for name, extra in (("late_interaction", ("late_interaction",)), ("cross_encoder", ("cross_encoder",)),
                            ("cascade", ("late_interaction", "cross_encoder"))):
            if name in stages:
                attempt([name], qid, search, text, extra)
        if progress:
            progress(i + 1)
    return {k: v for k, v in stages.items() if v.run or v.failed}


def failures(stages: Mapping[str, StageRun]) -> dict[str, dict[str, str]]:
    """Query id -> {stage: why it failed}, for every query some stage has no run for."""
    out: dict[str, dict[str, str]] = {}
    for name, st in stages.items():
        for qid, why in st.failed.items():
            out.setdefault(qid, {})[name] = why
    return out


def hnsw_recall(approx: Mapping[str, Hits], exact: Mapping[str, Hits], k: int = 100) -> float:
    """Mean over queries of |HNSW top-k docs ∩ exact top-k docs| / |exact top-k docs|."""
    vals = []
    for qid, ex in exact.items():
        if qid not in approx:
            continue
        truth = set(ex.doc[:k].tolist())
        if truth:
            vals.append(len(truth & set(approx[qid].doc[:k].tolist())) / len(truth))
    return round(float(np.mean(vals)), 5) if vals else float("nan")


def summarize(stages: Mapping[str, StageRun], qrels: Qrels) -> dict[str, dict[str, float]]:
    out = {}
    for name, st in stages.items():
        metrics = evaluate(qrels, st.run, failed=len(st.failed))
        secs = np.asarray(st.seconds)
        metrics["qps"] = round(len(secs) / secs.sum(), 1) if len(secs) and secs.sum() > 0 else float("nan")
        metrics["p50_ms"] = round(float(np.percentile(secs, 50) * 1000), 2) if len(secs) else float("nan")
        metrics["p99_ms"] = round(float(np.percentile(secs, 99) * 1000), 2) if len(secs) else float("nan")
        out[name] = metrics
    return out


# ---------------------------------------------------------------------------------------------- per query type

TYPE_METRICS = ("ndcg@10", "success@1", "success@3", "mrr@10")


def load_query_types(dataset: Path) -> dict[str, str]:
    """Query id -> its ``metadata.type`` in ``queries.jsonl`` (the query-type suite, ``bench.querytypes``); only
    the queries that have one."""
    out = {}
    with open(Path(dataset) / "queries.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                o = json.loads(line)
                t = (o.get("metadata") or {}).get("type") if isinstance(o, dict) else None
                if isinstance(t, str) and t:
                    out[str(o["_id"])] = t
    return out


def query_metrics(qrels: Qrels, run: Run, *, ignore_identical_ids: bool = True) -> dict[str, dict[str, float]]:
    """Per query of ``run`` that has judgments: nDCG@10 (pytrec_eval, graded), success@1 and @3 and MRR@10 (a
    document is relevant when its grade is above 0; the run ranked by score, best first).

    >>> m = query_metrics({"q": {"a": 1}}, {"q": {"b": 3.0, "a": 2.0}})["q"]
    >>> m["success@1"], m["success@3"], m["mrr@10"]
    (0.0, 1.0, 0.5)
    """
    if ignore_identical_ids:
        run = {q: {d: s for d, s in docs.items() if d != q} for q, docs in run.items()}
    run = {q: docs for q, docs in run.items() if q in qrels}
    ndcg = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    out = {}
    for q, sc in ndcg.items():
        relevant = {d for d, g in qrels[q].items() if g > 0}
        ranked = [d for d, _ in sorted(run[q].items(), key=lambda kv: -kv[1])[:10]]
        first = next((i for i, d in enumerate(ranked, 1) if d in relevant), 0)
        out[q] = {"ndcg@10": sc["ndcg_cut_10"], "success@1": float(first == 1), "success@3": float(0 < first <= 3),
                  "mrr@10": 1.0 / first if first else 0.0}
    return out


def mean_metrics(per_query: Mapping[str, Mapping[str, float]], qids: Sequence[str], failed: int = 0
                 ) -> dict[str, float]:
    """The mean of :data:`TYPE_METRICS` over ``qids`` (those with no run count as 0), and how many queries."""
    n = len(qids) + failed
    return {**{m: round(sum(per_query[q][m] for q in qids if q in per_query) / max(n, 1), 5) for m in TYPE_METRICS},
            "queries": n}


def by_type(qrels: Qrels, runs: Mapping[str, Run], types: Mapping[str, str],
            failed: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """Type -> stage (or system) -> :func:`mean_metrics` over the judged queries of that type. ``runs``: stage ->
    run; ``failed``: stage -> {query id: why} (counted as 0)."""
    per_stage = {name: query_metrics(qrels, run) for name, run in runs.items()}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for t in sorted({types[q] for q in qrels if q in types}):
        qids = [q for q in qrels if types.get(q) == t]
        out[t] = {}
        for name in runs:
            fails = (failed or {}).get(name, {})
            out[t][name] = mean_metrics(per_stage[name], [q for q in qids if q not in fails],
                                        sum(q in fails for q in qids))
    return out


def type_gaps(table: Mapping[str, Mapping[str, Mapping[str, float]]], served: str,
              exclude: Sequence[str] = ("dense_exact",)) -> dict[str, dict[str, Any]]:
    """Per type, the served stage's nDCG@10 against the best other single stage's (``gap`` = served - best,
    negative where the served default trails), success@1 beside it."""
    out = {}
    for t, stages in table.items():
        others = {n: m for n, m in stages.items() if n != served and n not in exclude}
        if served not in stages or not others:
            continue
        best = max(others, key=lambda n: others[n]["ndcg@10"])
        out[t] = {"served": served, "best": best, "served_ndcg@10": stages[served]["ndcg@10"],
                  "best_ndcg@10": others[best]["ndcg@10"],
                  "gap": round(stages[served]["ndcg@10"] - others[best]["ndcg@10"], 5),
                  "served_success@1": stages[served]["success@1"], "best_success@1": others[best]["success@1"]}
    return out


def format_by_type(table: Mapping[str, Mapping[str, Mapping[str, float]]],
                   gaps: Mapping[str, Mapping[str, Any]]) -> str:
    """The per-type table as printed: one row per type and stage, then a line per type naming the served
    stage's gap to the best single stage."""
    lines = [f"{'type':<20} {'stage':<17} {'n':>4} {'nDCG@10':>8} {'S@1':>6} {'S@3':>6} {'MRR@10':>7}"]
    for t, stages in table.items():
        for name, m in stages.items():
            lines.append(f"{t:<20} {name:<17} {int(m['queries']):>4} {m['ndcg@10']:>8.4f} {m['success@1']:>6.3f} "
                         f"{m['success@3']:>6.3f} {m['mrr@10']:>7.4f}")
    for t, g in gaps.items():
        lines.append(f"{t}: served {g['served']} nDCG@10 {g['served_ndcg@10']:.4f} vs best single stage "
                     f"{g['best']} {g['best_ndcg@10']:.4f} (gap {g['gap']:+.4f}; success@1 "
                     f"{g['served_success@1']:.3f} vs {g['best_success@1']:.3f})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- out-of-domain sets

OOD_KINDS = ("doc-query",)


def doc_queries(qrels: Qrels, texts: dict[str, str], *, max_queries: int = 300, seed: int = 0,
                max_words: int = 300, max_relevant: int = 20) -> tuple[dict[str, str], Qrels]:
    """The doc-query set of one split (an out-of-domain check built from a BEIR dataset's own judgments, issue #23):
    ``(queries, qrels)``. A judged document becomes the query, and the *other* documents judged relevant to the
    same original query are its relevant documents, with their grades: a whole abstract as the query (like an
    argument-retrieval query), its neighbours through a shared information need as the answers, labels from the
    dataset's assessors (no stage is favoured by construction). The query's id is its source document's id, so
    :func:`evaluate`'s ``ignore_identical_ids`` drops the source from every run, as BEIR does for ArguAna.

    ``texts``: document id -> title + text; a query keeps its first ``max_words`` words (the encoders truncate far
    sooner; BM25 reads them all). Only original queries with 2 to ``max_relevant`` relevant documents count: a broad
    need (NFCorpus has queries with hundreds of relevant documents) does not make its documents each other's
    neighbours. A source shared by several original queries gets the union of their relevant documents (the
    highest grade kept); ``max_queries`` keeps a seeded sample.

    >>> q, r = doc_queries({"q1": {"a": 2, "b": 1, "c": 0}, "q2": {"a": 1}}, {"a": "alpha text", "b": "beta"})
    >>> sorted(q), r["a"], r["b"]
    (['a', 'b'], {'b': 1}, {'a': 2})
    """
    import random

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
    from index_builder.documents.corpus import iter_corpus

    return {d.id: f"{d.title}. {d.text}" if d.title else d.text for d in iter_corpus(dataset)}


def write_beir(out: Path, dataset: Path, split: str, queries: dict[str, str], qrels: Qrels,
               info: dict[str, object]) -> None:
    """A BEIR folder: ``queries.jsonl``, ``qrels/<split>.tsv``, the source corpus linked, and ``ood.json``."""
    from index_builder.documents.corpus import resolve_corpus_path

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


def build_ood_set(dataset: Path, split: str, out: Path, *, kind: str = "doc-query", max_queries: int = 300,
                  seed: int = 0) -> dict[str, object]:
    """Write the ``kind`` out-of-domain set of ``dataset``'s ``split`` as a BEIR folder at ``out`` (one
    ``hybridrag eval`` takes as it is); returns what it holds (also in ``out/ood.json``)."""
    if kind not in OOD_KINDS:
        raise ValueError(f"unknown kind {kind!r} (known: {', '.join(OOD_KINDS)})")
    dataset, out = Path(dataset), Path(out)
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
