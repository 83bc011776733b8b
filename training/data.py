"""Training data for the rerankers, from a BEIR-layout corpus and its judgments.

- Splits: training queries come from ``--split`` (default ``train``); the dev split used for evaluation and early
  stopping is the dataset's ``qrels/dev.tsv`` when it has one, otherwise a fixed-seed share of the training
  queries held out (SciFact has no dev split). The test split is never read here.
- Hard negatives are mined with the project's own first stage over the index of that corpus: each training
  query's BM25 and dense top ``depth`` lists (:class:`retrieval.search.pipeline.Pipeline`, the same code that serves),
  minus every document judged relevant to that query in any split read. Random negatives are drawn from the whole
  corpus with the same exclusion.
- A training group is (query, one positive, hard negatives, random negatives): the listwise loss takes the
  positive's softmax probability over its group.
- The dev candidates are the served fused list (RRF of BM25 and dense) per dev query, so the evaluation measures
  exactly what reranking that list would give.
- Neighbour support (optional, ``mine(neighbors=K)``): each training query's K most similar *other* training queries
  (cosine of the served dense embeddings), weighted by similarity**8. :meth:`TrainingData.support` is the weighted
  share of those neighbours that judge a document relevant: a label transferred from similar queries. On NFCorpus
  (43 judgments per query, many queries on one topic) an unjudged hard negative that the neighbours judge relevant
  is often a missed judgment; the cross-encoder trainer can give such documents part of the target mass instead
  of pushing them down (RocketQA's denoised hard negatives, with neighbour labels as the denoiser). Only training
  queries are neighbours: dev judgments never reach the targets.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from index_builder.documents.corpus import read_corpus, resolve_corpus_path
from index_builder.errors import CorpusError
from rerank.interpolation import WEIGHT_GRID
from rerank.late_interaction import rerank_head
from retrieval.evaluate import Qrels, evaluate, load_qrels, load_queries


@dataclass(frozen=True)
class Group:
    query: str
    positive: str  # doc id
    negatives: tuple[str, ...]  # hard first, then random
    qid: str = ""


@dataclass
class TrainingData:
    passages: dict[str, str]  # doc id -> "title text"
    queries: dict[str, str]
    train: Qrels
    dev: Qrels
    dev_source: str  # "qrels/dev.tsv" or "held out from <split> (seed S, fraction F)"
    mined: dict[str, list[str]] = field(default_factory=dict)  # query id -> hard negatives, best first
    retrieved: dict[str, set[str]] = field(default_factory=dict)  # query id -> every doc of its first-stage pool
    dev_candidates: dict[str, list[str]] = field(default_factory=dict)  # dev query id -> fused list, best first
    neighbors: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # train qid -> [(train qid, weight)]
    fused: dict[str, list[str]] = field(default_factory=dict)  # train query id -> its served fused list, best first

    def positives(self, qid: str) -> list[str]:
        return [d for d, rel in self.train.get(qid, {}).items() if rel > 0]

    def support(self, qid: str, doc: str) -> float:
        """Share in [0, 1] of ``qid``'s neighbours (similarity-weighted) that judge ``doc`` relevant; 0 without
        neighbours."""
        near = self.neighbors.get(qid)
        if not near:
            return 0.0
        total = sum(w for _, w in near)
        return sum(w for q, w in near if self.train.get(q, {}).get(doc, 0) > 0) / total if total > 0 else 0.0


def passage_text(title: str, text: str) -> str:
    return f"{title} {text}".strip() if title else text


def load_training_data(dataset: Path, split: str = "train", *, dev_fraction: float = 0.2, seed: int = 13) -> TrainingData:
    """Corpus, queries, training judgments and a dev split (the dataset's, or held out from ``split``)."""
    dataset = Path(dataset)
    if split == "test":
        raise CorpusError("the test split is for the final evaluation only: train on 'train' (or 'dev')", path=str(dataset))
    docs, _ = read_corpus(resolve_corpus_path(dataset))
    passages = {d.id: passage_text(d.title, d.text) for d in docs}
    queries = load_queries(dataset)
    train = _judged(load_qrels(dataset, split))
    if split != "dev" and (dataset / "qrels" / "dev.tsv").is_file():
        dev, source = _judged(load_qrels(dataset, "dev")), "qrels/dev.tsv"
    else:
        ids = sorted(train)
        random.Random(seed).shuffle(ids)
        held = set(ids[: max(1, int(len(ids) * dev_fraction))])
        dev = {q: train[q] for q in held}
        train = {q: r for q, r in train.items() if q not in held}
        source = f"held out from {split} (seed {seed}, fraction {dev_fraction})"
    missing = [q for q in list(train) + list(dev) if q not in queries]
    if missing:
        raise CorpusError(f"{len(missing)} judged queries have no text in queries.jsonl (e.g. {missing[0]!r})",
                          path=str(dataset))
    return TrainingData(passages, queries, train, dev, source)


def _judged(qrels: Qrels) -> Qrels:
    """Only queries with at least one relevant document."""
    return {q: docs for q, docs in qrels.items() if any(r > 0 for r in docs.values())}


def mine(data: TrainingData, pipeline, *, depth: int = 30, dev_depth: int = 100, log_every: int = 0,
         neighbors: int = 0) -> None:
    """Hard negatives and the fused list of every training query, and the fused candidate list of every dev query,
    from ``pipeline`` (the first stage over the index of this corpus). Fills ``data.mined``, ``data.retrieved``,
    ``data.fused`` and ``data.dev_candidates``, and with
    ``neighbors`` > 0 ``data.neighbors`` (:func:`find_neighbors`, the pipeline's query embedder)."""
    judged: dict[str, set[str]] = {}
    for qrels in (data.train, data.dev):
        for q, docs in qrels.items():
            judged.setdefault(q, set()).update(d for d, r in docs.items() if r > 0)
    index = pipeline.index
    for i, qid in enumerate(sorted(data.train)):
        result = pipeline.search(data.queries[qid], depth, stages=("bm25", "dense"), candidates=depth, use_cache=False)
        seen: list[str] = []
        pool: set[str] = set()
        for stage in ("bm25", "dense"):
            for d in result.stages.get(stage, result.hits).doc.tolist():
                doc_id = index.documents[d].id
                pool.add(doc_id)
                if doc_id not in judged[qid] and doc_id not in seen:
                    seen.append(doc_id)
        data.mined[qid] = seen
        data.retrieved[qid] = pool
        data.fused[qid] = result.doc_ids()
        if log_every and (i + 1) % log_every == 0:
            print(f"mined {i + 1}/{len(data.train)} training queries", flush=True)
    for qid in sorted(data.dev):
        result = pipeline.search(data.queries[qid], dev_depth, stages=("bm25", "dense"), candidates=dev_depth,
                                 use_cache=False)
        data.dev_candidates[qid] = result.doc_ids()
    if neighbors > 0:
        qids = sorted(data.train)
        data.neighbors = find_neighbors(qids, pipeline.embedder.embed([data.queries[q] for q in qids]), neighbors)


# weight = cosine**8: the nearest neighbours dominate. On NFCorpus dev, reordering the fused top 5 by the support of
# the 5 nearest training queries alone scored nDCG@10 0.338 at powers 4, 8 and 16 alike (fused 0.329).
NEIGHBOR_POWER = 8.0


def find_neighbors(qids: Sequence[str], vectors: np.ndarray, k: int, power: float = NEIGHBOR_POWER
                   ) -> dict[str, list[tuple[str, float]]]:
    """Each query's ``k`` most similar other queries by cosine of ``vectors`` (float [n, d], L2-normalised rows,
    in ``qids`` order), weighted by max(cosine, 0) ** ``power``; never the query itself."""
    if k <= 0 or len(qids) < 2:
        return {}
    vectors = np.asarray(vectors, dtype=np.float32)
    out: dict[str, list[tuple[str, float]]] = {}
    k = min(k, len(qids) - 1)
    for start in range(0, len(qids), 512):
        sims = vectors[start:start + 512] @ vectors.T
        for row, sim in enumerate(sims):
            i = start + row
            sim[i] = -np.inf
            near = np.argpartition(-sim, k - 1)[:k]
            near = near[np.argsort(-sim[near], kind="stable")]
            out[qids[i]] = [(qids[j], float(max(sim[j], 0.0)) ** power) for j in near]
    return out


POSITIVES = ("all", "retrieved")


def make_groups(data: TrainingData, *, hard: int, random_negatives: int, seed: int, positives: str = "all"
                ) -> list[Group]:
    """One group per (training query, positive): ``hard`` negatives sampled from the mined pool (the pool's top
    half twice as likely) and ``random_negatives`` from the corpus, none judged relevant.

    ``positives = "retrieved"`` keeps only the positives that the first stage found (BM25 or dense top
    ``depth`` when mined): the documents a reranker of that first stage has to order. On a corpus with many
    judgments per query (NFCorpus: 43 per training query) most positives are never retrieved."""
    if positives not in POSITIVES:
        raise ValueError(f"positives must be one of {POSITIVES}, got {positives!r}")
    rng = random.Random(seed)
    doc_ids = sorted(data.passages)
    groups = []
    for qid in sorted(data.train):
        pool = data.mined.get(qid, [])
        relevant = set(data.positives(qid)) | {d for d, r in data.dev.get(qid, {}).items() if r > 0}
        for pos in data.positives(qid):
            if pos not in data.passages or (positives == "retrieved" and pos not in data.retrieved.get(qid, ())):
                continue
            weights = [2.0 if i < len(pool) // 2 else 1.0 for i in range(len(pool))]
            negatives = _weighted_sample(pool, weights, min(hard, len(pool)), rng)
            while len(negatives) < hard + random_negatives:
                d = doc_ids[rng.randrange(len(doc_ids))]
                if d not in relevant and d not in negatives:
                    negatives.append(d)
            groups.append(Group(data.queries[qid], pos, tuple(negatives), qid))
    rng.shuffle(groups)
    return groups


@dataclass(frozen=True)
class PoolList:
    """A training query's served fused top N, each document with its judgment (1 relevant, 0 not)."""
    qid: str
    query: str
    docs: tuple[str, ...]  # fused order, best first
    labels: tuple[float, ...]


def make_lists(data: TrainingData, *, depth: int, seed: int) -> list[PoolList]:
    """One list per training query: its fused top ``depth`` (``data.fused``, from :func:`mine`) with the training
    judgments as labels; only lists that hold both a relevant and an unjudged document (the others carry no
    ordering signal), shuffled with ``seed``. The unit of the pool-list objective: the model learns to order what
    it will rerank when served, every judged document of the list at once."""
    out = []
    for qid in sorted(data.train):
        docs = tuple(d for d in data.fused.get(qid, ())[:depth] if d in data.passages)
        if len(docs) < depth:
            continue
        labels = tuple(1.0 if data.train[qid].get(d, 0) > 0 else 0.0 for d in docs)
        if 0 < sum(labels) < len(labels):
            out.append(PoolList(qid, data.queries[qid], docs, labels))
    random.Random(seed).shuffle(out)
    return out


def _weighted_sample(items: Sequence[str], weights: Sequence[float], k: int, rng: random.Random) -> list[str]:
    items, weights = list(items), list(weights)
    out = []
    for _ in range(k):
        i = rng.choices(range(len(items)), weights=weights)[0]
        out.append(items.pop(i))
        weights.pop(i)
    return out


def rerank_run(candidates: Mapping[str, list[str]], scores: Mapping[str, Sequence[float]],
               weight: float = 1.0) -> dict[str, dict[str, float]]:
    """A run where each query's first ``len(scores[q])`` candidates are reordered by ``scores`` (blended with their incoming
    order when ``weight`` < 1) and the rest keep their order below them: what the cascade stage serves, through the
    same function (:func:`rerank.late_interaction.rerank_head`)."""
    run = {}
    for qid, docs in candidates.items():
        order = rerank_head(np.asarray(scores[qid], dtype=np.float32), len(docs), weight).order
        ordered = [docs[i] for i in order.tolist()]
        run[qid] = {d: float(len(ordered) - i) for i, d in enumerate(ordered)}
    return run


def dev_figures(qrels: Qrels, candidates: Mapping[str, list[str]], scores: Mapping[str, Sequence[float]]
                ) -> dict[str, Any]:
    """nDCG@10 of the reranked dev lists: the stage alone (``ndcg``), and blended with the fused order for each
    weight of :data:`rerank.interpolation.WEIGHT_GRID` (``by_weight``; ``weight``/``blended``: the best of them)."""
    by_weight = {w: evaluate(qrels, rerank_run(candidates, scores, w))["ndcg@10"] for w in WEIGHT_GRID}
    best = max(WEIGHT_GRID, key=lambda w: (by_weight[w], w))  # ties: the larger weight (less of the prior)
    return {"ndcg": by_weight[1.0], "weight": best, "blended": by_weight[best],
            "by_weight": {str(w): round(v, 5) for w, v in by_weight.items()}}


def fused_run(candidates: Mapping[str, list[str]]) -> dict[str, dict[str, float]]:
    return {qid: {d: float(len(docs) - i) for i, d in enumerate(docs)} for qid, docs in candidates.items()}
