"""Choosing the reranking stages' blend by the worst case, not the mean; checking it out of domain (issue #23).

For every query of every set, the served fused list (top 100), the query's token vectors and the MaxSim scores of
its top 20 are computed once (and, with ``--cross-encoder``, the cross-encoder's scores of the same 20). Each
policy for the late-interaction weight is then scored offline from those arrays, per query, by BEIR nDCG@10:

* ``li_weight = w``: one weight for every query (w = 1: the stage alone; 0: the fused order);
* ``gate(L): w_short / w_long``: one weight for queries of at most L query tokens, another above (MaxSim sums over
  the query's tokens, so a 250-token query behaves unlike a 12-token one);
* ``decay(L): w * min(1, L / n)``: the weight shrinks with the query's token count n above L;
* ``normalised``: MaxSim divided by the query's token count before blending. The blend standardises the head's
  scores (z-scores), which a per-query scale cannot change: its figures equal ``li_weight`` (computed for real
  and reported as ``normalised_minus_plain`` to show it);
* ``tokz`` (any of the above on another score): each query token's max-sims z-scored over the head, then
  averaged, so that every query token has the same say whatever the spread of its similarities (a long query's
  many generic tokens then do not outvote its few discriminative ones by sheer number... or they do: measured).

A policy's robustness is its *worst* gain over the fused list across the tuning sets (SciFact train, NFCorpus dev
and the doc-query sets built from those splits by :mod:`bench.studies.ood`); the chosen one maximises that, ties broken by
the mean gain, then by fewer parameters. Test splits are reported, never used to choose. Cross-dataset checks:
the same choice made on one dataset's tuning sets, read on the other's test sets.

``--bm25-grid`` also sweeps BM25's k1 and b on the same sets (BM25 alone and fused with the unchanged dense list).

Usage::

    python -m bench.studies.cascade_robustness \\
        --set scifact:tune:../shared/data/beir/scifact:IDX_SCIFACT:train \\
        --set scifact-docq:tune:OOD/scifact-docq-train:IDX_SCIFACT:train ... \\
        [--cross-encoder ../shared/models/ce-minilm-l6-beir-train] [--bm25-grid] --json results/robustness.json
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import bm25s
import numpy as np
import pytrec_eval

from bench.harness import median, write_result
from bench.harness.pipelines import opened, with_sections
from index_builder.types import Hits
from rerank.late_interaction import head_scores, rerank_head
from retrieval.config import load_config
from retrieval.evaluate import docs_to_run, judged_queries
from retrieval.search.bm25 import BM25Retriever
from retrieval.search.stages.first_stage import fuse

if TYPE_CHECKING:
    from retrieval.search.pipeline import Pipeline

WEIGHTS = tuple(round(w, 1) for w in np.linspace(0.0, 1.0, 11))
GATE_TOKENS = (16, 24, 32, 48, 64, 96, 128)
LENGTH_BUCKETS = ((0, 16), (17, 32), (33, 64), (65, 128), (129, 10_000))
LI_TOP_K, CE_TOP_K, DEPTH = 20, 5, 100
K1_GRID = (0.6, 0.9, 1.2, 1.5, 2.0)
B_GRID = (0.3, 0.4, 0.6, 0.75, 0.9)


@dataclass
class QueryArrays:
    qid: str
    n_tokens: int
    fused: Hits
    li: np.ndarray  # MaxSim of the fused top LI_TOP_K
    tokz: np.ndarray  # the token-standardised variant: each query token's max-sims z-scored over the head, mean
    ce: np.ndarray | None = None  # cross-encoder logits of the fused top LI_TOP_K


@dataclass
class QuerySet:
    name: str
    role: str  # "tune" | "test"
    dataset: str  # the dataset family ("scifact" | "nfcorpus"): cross-dataset checks group by it
    qrels: dict[str, dict[str, int]]
    queries: dict[str, str]
    arrays: list[QueryArrays] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    dense: dict[str, Hits] = field(default_factory=dict)
    index_dir: str = ""


class Scorer:
    """Per-query nDCG@10 (BEIR conventions: identical ids dropped, graded qrels)."""

    def __init__(self, pipeline: Pipeline, qs: QuerySet) -> None:
        self.pipeline, self.qs = pipeline, qs
        judged = {q.qid: qs.qrels[q.qid] for q in qs.arrays}
        self.evaluator = pytrec_eval.RelevanceEvaluator(judged, {"ndcg_cut.10"})

    def ndcg(self, runs: dict[str, np.ndarray]) -> dict[str, float]:
        run = {q: {d: s for d, s in docs_to_run(self.pipeline.index, doc).items() if d != q}
               for q, doc in runs.items()}
        scores = self.evaluator.evaluate(run)
        return {q: scores[q]["ndcg_cut_10"] if q in scores else 0.0 for q in runs}


def reorder_head(doc: np.ndarray, scores: np.ndarray, weight: float) -> np.ndarray:
    """``doc`` (int [n]) with its head (``len(scores)``) reordered as the served stage does."""
    return doc[rerank_head(scores, len(doc), weight).order]


def collect(pipeline: Pipeline, qs: QuerySet, *, with_ce: bool) -> None:
    late = pipeline.index.late
    assert late is not None, "the index has no token vectors"
    for qid, text in qs.queries.items():
        try:
            res = pipeline.search(text, DEPTH, candidates=DEPTH, stages=("bm25", "dense"), use_cache=False)
        except Exception as e:  # the eval's own rule: count it, go on
            qs.refused[qid] = str(e)
            continue
        tokens = pipeline.token_encoder.encode_queries([text])[0]
        head = res.hits.chunk[:LI_TOP_K]
        per_token = late.token_maxsims(tokens, head)  # [head, q], on the index's own token store
        li, tokz = head_scores(per_token, "maxsim"), head_scores(per_token, "token_z")
        ce = None
        if with_ce:
            assert pipeline.cross_encoder is not None
            ce = pipeline.cross_encoder.score_pairs(text, [pipeline.index.passage_with_title(int(c)) for c in head])
        qs.arrays.append(QueryArrays(qid, len(tokens), res.hits, li, tokz, ce))
        qs.dense[qid] = res.stages["dense"]


SCORES = ("sum", "tokz")


def per_weight_ndcg(scorer: Scorer, qs: QuerySet, score: str = "sum") -> dict[float, dict[str, float]]:
    """nDCG@10 per query for each late-interaction weight (0 = the fused list), with MaxSim (``sum``) or its
    token-standardised variant (``tokz``)."""
    def s(q: QueryArrays) -> np.ndarray:
        return q.li if score == "sum" else q.tokz
    return {w: scorer.ndcg({q.qid: reorder_head(q.fused.doc, s(q), w) for q in qs.arrays}) for w in WEIGHTS}


def policies() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for score in SCORES:
        tag = "" if score == "sum" else "tokz "
        out += [(f"{tag}li_weight={w}", {"kind": "weight", "w": w, "score": score}) for w in WEIGHTS]
        for L, ws, wl in itertools.product(GATE_TOKENS, WEIGHTS, WEIGHTS):
            if ws != wl:
                out.append((f"{tag}gate({L}): {ws} / {wl}",
                            {"kind": "gate", "L": L, "w_short": ws, "w_long": wl, "score": score}))
        for L, w in itertools.product(GATE_TOKENS, WEIGHTS[1:]):
            out.append((f"{tag}decay({L}): {w} * min(1, {L}/n)", {"kind": "decay", "L": L, "w": w, "score": score}))
    return out


def weight_for(policy: dict[str, Any], n_tokens: int) -> float:
    kind = policy["kind"]
    if kind in ("weight", "normalised"):
        return float(policy["w"])
    if kind == "gate":
        return float(policy["w_short"] if n_tokens <= policy["L"] else policy["w_long"])
    w = float(policy["w"]) * min(1.0, policy["L"] / max(n_tokens, 1))
    return min(WEIGHTS, key=lambda g: abs(g - w))  # the weight grid's nearest value (scored per grid weight)


def policy_score(tables: dict[str, dict[float, dict[str, float]]], qs: QuerySet, policy: dict[str, Any]) -> float:
    table = tables[policy.get("score", "sum")]
    return float(np.mean([table[weight_for(policy, q.n_tokens)][q.qid] for q in qs.arrays]))


def n_params(policy: dict[str, Any]) -> int:
    return {"weight": 1, "gate": 3, "decay": 2}[policy["kind"]] + (policy.get("score", "sum") != "sum")


def choose(rows: list[dict[str, Any]], tune: list[str]) -> dict[str, Any]:
    def key(r: dict[str, Any]) -> tuple[float, float, int]:
        gains = [r["gain"][s] for s in tune]
        return (round(min(gains), 4), round(float(np.mean(gains)), 4), -n_params(r["policy"]))
    return max(rows, key=key)


NOISE = 0.001  # a gain below this on a tuning set is not evidence (one query moving a rank on a 300-query set)
MIN_CLASS_QUERIES = 30


def choose_by_length_class(sets: list[QuerySet], tables: dict[str, dict[float, dict[str, float]]],
                           tune: list[str]) -> dict[str, Any]:
    """The selection rule for a length gate: for each bound L of the grid, split the tuning queries into short
    (<= L query tokens) and long; for each class choose the weight with the best worst-case gain over the tuning
    sets that have at least MIN_CLASS_QUERIES queries of that class; a class whose best worst-case gain is below
    NOISE gets weight 0 (the stage does not run for it: it has not earned its cost). L is the one whose policy has
    the best worst-case gain over all tuning sets (then the best mean). ``tables``: one score variant's."""
    by_name = {qs.name: qs for qs in sets}
    candidates = []
    for L in GATE_TOKENS:
        weights = {}
        for cls in ("short", "long"):
            def in_class(n: int, cls: str = cls, L: int = L) -> bool:
                return n <= L if cls == "short" else n > L
            eligible = [s for s in tune if sum(in_class(q.n_tokens) for q in by_name[s].arrays) >= MIN_CLASS_QUERIES]
            best_w, best_worst = 0.0, 0.0
            for w in WEIGHTS[1:]:
                gains = []
                for s in eligible:
                    qs = [q for q in by_name[s].arrays if in_class(q.n_tokens)]
                    gains.append(float(np.mean([tables[s][w][q.qid] - tables[s][0.0][q.qid] for q in qs])))
                worst = min(gains) if gains else 0.0
                if worst > best_worst:
                    best_w, best_worst = w, worst
            weights[cls] = (float(best_w) if best_worst >= NOISE else 0.0, round(best_worst, 4), eligible)
        pol = {"kind": "gate", "L": L, "w_short": weights["short"][0], "w_long": weights["long"][0], "score": "sum"}
        gains = {s: float(np.mean([tables[s][weight_for(pol, q.n_tokens)][q.qid] - tables[s][0.0][q.qid]
                                   for q in by_name[s].arrays])) for s in by_name}
        candidates.append({"policy": pol, "class_best_worst_gain": {k: v[1] for k, v in weights.items()},
                           "class_sets": {k: v[2] for k, v in weights.items()},
                           "gain": {k: round(v, 4) for k, v in gains.items()},
                           "worst_tune": round(min(gains[s] for s in tune), 4),
                           "mean_tune": round(float(np.mean([gains[s] for s in tune])), 4)})
    best = max(candidates, key=lambda c: (c["worst_tune"], c["mean_tune"]))
    return {"chosen": best, "candidates": candidates, "noise": NOISE, "min_class_queries": MIN_CLASS_QUERIES}


def length_breakdown(sets: list[QuerySet], tables: dict[str, dict[str, dict[float, dict[str, float]]]],
                     named: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean nDCG@10 per query-length bucket (query tokens), pooled over ``sets``; ``tables[score][set]``."""
    out = []
    for lo, hi in LENGTH_BUCKETS:
        row: dict[str, Any] = {"tokens": f"{lo}-{hi}" if hi < 10_000 else f">{lo - 1}", "queries": 0}
        vals: dict[str, list[float]] = {name: [] for name in named}
        vals["fused"] = []
        for qs in sets:
            for q in qs.arrays:
                if lo <= q.n_tokens <= hi:
                    row["queries"] += 1
                    vals["fused"].append(tables["sum"][qs.name][0.0][q.qid])
                    for name, pol in named.items():
                        table = tables[pol.get("score", "sum")][qs.name]
                        vals[name].append(table[weight_for(pol, q.n_tokens)][q.qid])
        for name, v in vals.items():
            row[name] = round(float(np.mean(v)), 4) if v else None
        out.append(row)
    return out


def cross_encoder_rows(scorers: dict[str, Scorer], sets: list[QuerySet], li_policy: dict[str, Any]
                       ) -> list[dict[str, Any]]:
    """The cascade: late interaction (``li_policy``) on the top 20, then the cross-encoder on the top 5 with each
    ce_weight; the cross-encoder's scores come from the fused top-20 arrays (the head it sees is a subset)."""
    rows = []
    for w in WEIGHTS[1:]:
        row: dict[str, Any] = {"ce_weight": w, "ndcg": {}}
        for qs in sets:
            runs = {}
            for q in qs.arrays:
                assert q.ce is not None
                li_w = weight_for(li_policy, q.n_tokens)
                li = q.li if li_policy.get("score", "sum") == "sum" else q.tokz
                order = rerank_head(li, len(q.fused.doc), li_w).order  # the late-interaction list
                after_li = q.fused.doc[order]
                runs[q.qid] = reorder_head(after_li, q.ce[order[:LI_TOP_K]][:CE_TOP_K], w)
            row["ndcg"][qs.name] = round(float(np.mean(list(scorers[qs.name].ndcg(runs).values()))), 4)
        rows.append(row)
    return rows


def bm25_grid(pipelines: dict[str, Pipeline], sets: list[QuerySet]) -> list[dict[str, Any]]:
    """BM25 alone and fused (with the same dense list) for each (k1, b), per set."""
    rows = []
    passages: dict[str, list[list[str]]] = {}
    for qs in sets:
        if qs.index_dir not in passages:
            p = pipelines[qs.index_dir]
            texts = [p.index.passage_with_title(c) for c in range(len(p.index.chunks))]
            passages[qs.index_dir] = p.index.bm25.analyzer.batch(texts)
    for k1, b in itertools.product(K1_GRID, B_GRID):
        row: dict[str, Any] = {"k1": k1, "b": b, "bm25": {}, "fused": {}}
        for index_dir, terms in passages.items():
            p = pipelines[index_dir]
            model = bm25s.BM25(k1=k1, b=b, method="lucene")
            model.index(terms, show_progress=False)
            retriever = BM25Retriever(model, p.index.bm25.analyzer, p.index.starts)
            for qs in (s for s in sets if s.index_dir == index_dir):
                scorer = Scorer(p, qs)
                bm, fu = {}, {}
                for q in qs.arrays:
                    hits = retriever.search(qs.queries[q.qid], DEPTH)
                    bm[q.qid] = hits.doc
                    fu[q.qid] = fuse(hits, qs.dense[q.qid], p.config.fusion).doc
                row["bm25"][qs.name] = round(float(np.mean(list(scorer.ndcg(bm).values()))), 4)
                row["fused"][qs.name] = round(float(np.mean(list(scorer.ndcg(fu).values()))), 4)
        rows.append(row)
        print(f"bm25 k1={k1} b={b}: " + " ".join(f"{s}={v:.4f}" for s, v in row["bm25"].items()), file=sys.stderr)
    return rows


def parse_set(spec: str) -> tuple[str, str, Path, Path, str]:
    parts = spec.split(":")
    if len(parts) != 5 or parts[1] not in ("tune", "test"):
        raise SystemExit(f"--set wants NAME:tune|test:DATASET:INDEX:SPLIT, got {spec!r}")
    return parts[0], parts[1], Path(parts[2]), Path(parts[3]), parts[4]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.studies.cascade_robustness", description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", action="append", required=True, help="NAME:tune|test:DATASET:INDEX:SPLIT")
    ap.add_argument("--config", help="service config (TOML) the pipelines open with")
    ap.add_argument("--cross-encoder", help="also score the cascade with this cross-encoder folder")
    ap.add_argument("--ce-tune", default="", help="comma-separated tuning sets the cross-encoder was not trained on "
                                                  "(its ce_weight is chosen by the worst case over them)")
    ap.add_argument("--bm25-grid", action="store_true")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--per-query", type=Path, help="also write every query's nDCG@10 per weight and score here")
    args = ap.parse_args(argv)

    config = load_config(args.config)
    if args.cross_encoder:
        config = with_sections(config, cross_encoder={"model": args.cross_encoder})
    with contextlib.ExitStack() as stack:
        out = study(args, config, stack)
    if args.json:
        write_result(args.json, "cascade_robustness", {k: str(v) for k, v in vars(args).items() if k != "json"}, out)
    return 0


def study(args: argparse.Namespace, config: Any, stack: contextlib.ExitStack) -> dict[str, Any]:
    pipelines: dict[str, Pipeline] = {}
    sets: list[QuerySet] = []
    t0 = time.perf_counter()
    for spec in args.set:
        name, role, dataset, index_dir, split = parse_set(spec)
        if str(index_dir) not in pipelines:
            pipelines[str(index_dir)] = stack.enter_context(opened(index_dir, config))
        p = pipelines[str(index_dir)]
        queries, qrels = judged_queries(dataset, split, args.limit)
        family = "scifact" if "scifact" in name else "nfcorpus" if "nfcorpus" in name else name
        qs = QuerySet(name, role, family, qrels, queries, index_dir=str(index_dir))
        collect(p, qs, with_ce=bool(args.cross_encoder))
        sets.append(qs)
        print(f"{name}: {len(qs.arrays)} queries ({len(qs.refused)} refused), {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)

    scorers = {qs.name: Scorer(pipelines[qs.index_dir], qs) for qs in sets}
    tables = {score: {qs.name: per_weight_ndcg(scorers[qs.name], qs, score) for qs in sets} for score in SCORES}
    # the normalised variant, computed for real (MaxSim / n before the blend) to show it equals li_weight
    norm_check = {}
    for qs in sets:
        for w in (1.0, 0.5):
            runs = {q.qid: reorder_head(q.fused.doc, q.li / max(q.n_tokens, 1), w) for q in qs.arrays}
            norm_check[f"{qs.name} w={w}"] = round(float(np.mean(list(scorers[qs.name].ndcg(runs).values()))) -
                                                   float(np.mean(list(tables["sum"][qs.name][w].values()))), 6)
    fused = {qs.name: float(np.mean(list(tables["sum"][qs.name][0.0].values()))) for qs in sets}
    rows = []
    for label, pol in policies():
        nd = {qs.name: policy_score({k: t[qs.name] for k, t in tables.items()}, qs, pol) for qs in sets}
        rows.append({"policy_label": label, "policy": pol, "ndcg": {k: round(v, 4) for k, v in nd.items()},
                     "gain": {k: round(nd[k] - fused[k], 4) for k in nd}})
    tune = [qs.name for qs in sets if qs.role == "tune"]
    test = [qs.name for qs in sets if qs.role == "test"]
    chosen = choose(rows, tune)
    by_mean = max(rows, key=lambda r: (round(float(np.mean([r["gain"][s] for s in tune])), 4), -n_params(r["policy"])))
    best_weight = choose([r for r in rows if r["policy"]["kind"] == "weight" and r["policy"]["score"] == "sum"], tune)
    cross = {}
    for fam in sorted({qs.dataset for qs in sets}):
        fam_tune = [qs.name for qs in sets if qs.role == "tune" and qs.dataset == fam]
        if fam_tune:
            c = choose(rows, fam_tune)
            cross[f"chosen on {fam} tuning sets"] = {"policy": c["policy_label"], "ndcg": c["ndcg"], "gain": c["gain"]}
    named = {"li_weight=1.0 (before)": {"kind": "weight", "w": 1.0, "score": "sum"},
             best_weight["policy_label"]: best_weight["policy"],
             chosen["policy_label"]: chosen["policy"]}
    out: dict[str, Any] = {
        "sets": {qs.name: {"role": qs.role, "queries": len(qs.arrays), "refused": len(qs.refused),
                           "median_query_tokens": median([q.n_tokens for q in qs.arrays], 1) or 0,
                           "fused": round(fused[qs.name], 4)} for qs in sets},
        "tune": tune, "test": test,
        "chosen": {"policy": chosen["policy_label"], **chosen},
        "best_single_weight": {"policy": best_weight["policy_label"], **best_weight},
        "best_by_mean": {"policy": by_mean["policy_label"], **by_mean},
        "weights": [r for r in rows if r["policy"]["kind"] == "weight"],
        "normalised_minus_plain": norm_check,
        "cross_dataset": cross,
        "length_breakdown_test": length_breakdown([qs for qs in sets if qs.role == "test"], tables, named),
        "length_breakdown_tune": length_breakdown([qs for qs in sets if qs.role == "tune"], tables, named),
        "top_policies_by_worst_case": sorted(rows, key=lambda r: -min(r["gain"][s] for s in tune))[:15],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    by_class = choose_by_length_class(sets, tables["sum"], tune)
    out["length_class_selection"] = by_class
    for fam in sorted({qs.dataset for qs in sets}):  # the same rule on one dataset's tuning sets alone
        fam_tune = [qs.name for qs in sets if qs.role == "tune" and qs.dataset == fam]
        if fam_tune:
            c = choose_by_length_class(sets, tables["sum"], fam_tune)["chosen"]
            out["cross_dataset"][f"length classes chosen on {fam} tuning sets"] = {
                "policy": f"gate({c['policy']['L']}): {c['policy']['w_short']} / {c['policy']['w_long']}",
                "gain": c["gain"]}
    lc = by_class["chosen"]["policy"]
    lc_label = f"gate({lc['L']}): {lc['w_short']} / {lc['w_long']}"
    named[lc_label] = lc
    out["length_breakdown_test"] = length_breakdown([qs for qs in sets if qs.role == "test"], tables, named)
    out["length_breakdown_tune"] = length_breakdown([qs for qs in sets if qs.role == "tune"], tables, named)
    out["length_class_policy"] = {"policy": lc_label, "ndcg": {qs.name: round(policy_score(
        {k: t[qs.name] for k, t in tables.items()}, qs, lc), 4) for qs in sets}}
    if args.per_query:
        args.per_query.parent.mkdir(parents=True, exist_ok=True)
        args.per_query.write_text(json.dumps({score: {name: {str(w): {q: round(v, 5) for q, v in t.items()}
                                                             for w, t in table.items()}
                                                      for name, table in per_set.items()}
                                              for score, per_set in tables.items()} | {
            "n_tokens": {qs.name: {q.qid: q.n_tokens for q in qs.arrays} for qs in sets}}) + "\n")
    if args.cross_encoder:
        ce_rows = cross_encoder_rows(scorers, sets, chosen["policy"])
        ce_tune = [n for n in args.ce_tune.split(",") if n] or tune
        for r in ce_rows:
            r["gain_over_li"] = {n: round(r["ndcg"][n] - chosen["ndcg"][n], 4) for n in r["ndcg"]}
        ce_best = max(ce_rows, key=lambda r: (min(r["gain_over_li"][n] for n in ce_tune),
                                              float(np.mean([r["gain_over_li"][n] for n in ce_tune]))))
        out["cross_encoder"] = {"model": args.cross_encoder, "li_policy": chosen["policy_label"], "tune": ce_tune,
                                "chosen_ce_weight": ce_best["ce_weight"], "rows": ce_rows,
                                "rows_li_weight_1": cross_encoder_rows(scorers, sets, {"kind": "weight", "w": 1.0,
                                                                                       "score": "sum"})}
    if args.bm25_grid:
        out["bm25_grid"] = bm25_grid(pipelines, sets)

    print(f"{'policy':<34}" + "".join(f"{s[:16]:>17}" for s in tune + test))
    print(f"{'fused':<34}" + "".join(f"{fused[s]:>17.4f}" for s in tune + test))
    for r in [r for r in rows if r["policy"]["kind"] == "weight"] + [chosen]:
        print(f"{r['policy_label'][:34]:<34}" + "".join(f"{r['ndcg'][s]:>17.4f}" for s in tune + test))
    print(f"{lc_label[:34]:<34}" + "".join(f"{out['length_class_policy']['ndcg'][s]:>17.4f}" for s in tune + test))
    print(f"chosen (worst case over {', '.join(tune)}): {chosen['policy_label']}")
    print(f"chosen by length class (a class's weight must gain >= {NOISE} on every tuning set with >= "
          f"{MIN_CLASS_QUERIES} of its queries): {lc_label}")
    return out


if __name__ == "__main__":
    sys.exit(main())
