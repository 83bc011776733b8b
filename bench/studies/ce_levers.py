"""The cross-encoder's levers, each with its quality and its cost, in one run (issue #26).

For each judged query of a split, the served default cascade (fused + late interaction, the shipped blend) gives
the list the cross-encoder reorders; its top ``--top-k`` (the served ce_top_k, 5) is then scored by every variant,
one request at a time as the pipeline sends it, the variants interleaved per query so that machine noise hits all
alike. Variants:

* ``full``: the whole passage (title + chunk), cut at ``max_length`` word pieces: today's stage;
* ``window W``: only the ``W`` consecutive passage tokens with the highest windowed MaxSim
  (:mod:`rerank.windows`: late interaction's own token similarities say where the passage answers the query);
* ``int8``: the same model quantised dynamically by ONNX Runtime (u8 activations x s8 weights: VNNI where the CPU
  has it), on full passages and on windows;
* ``student``: a smaller cross-encoder distilled from the teacher (``--student DIR``, ``hybridrag train
  cross-encoder --teacher``), on windows;
* the runtime's own levers on whole passages (what was ``bench.ce_latency``): the pair length (``max_length 256``
  and ``192`` against the configured ``--max-length``), one intra-op thread, ONNX Runtime's basic graph
  optimisation instead of all;
* gating, for each variant: skip the cross-encoder when late interaction's head is already decisive (the z-score
  gap between its first two is over a threshold); thresholds at the 0/25/50/75% quantiles of the gap.

Each row: nDCG@10 of the final list (the cross-encoder alone on the head, ``ce_weight`` 1, and blended at 0.5),
the p50/p95 ms of one request's scoring, and its mean over the queries (gated rows count skipped ones as 0 ms).
The baseline is ``full`` fp32 of the same run; each variant's logits are also compared with it (Pearson over
every pair, and the share of queries whose reordered top K is the same). Usage::

    python -m bench.studies.ce_levers --dataset ../shared/data/beir/scifact --index indexes/scifact \\
        --model ../shared/models/ce-minilm-l6-beir-train [--student models/ce-student] --json results/ce-levers.json
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytrec_eval

from bench.harness import median, percentiles, write_result
from bench.harness.pipelines import opened
from index_builder.models.encoders import CrossEncoder
from index_builder.models.export import quantize_model
from index_builder.settings import CrossEncoderConfig, RuntimeConfig
from rerank.cross_encoder import decisive_gap
from rerank.late_interaction import rerank_head
from retrieval.config import load_config
from retrieval.evaluate import docs_to_run, judged_queries

Pipeline = Any  # retrieval.app.open_pipeline's

WIDTHS = (32, 48, 64)


@dataclass
class Query:
    qid: str
    text: str
    doc: np.ndarray  # the served list's documents (best first), the cross-encoder's input
    gap: float  # late interaction's decisiveness: z-score gap between its first two
    texts: dict[str, list[str]] = field(default_factory=dict)  # text variant -> the head's passages
    scores: dict[str, np.ndarray] = field(default_factory=dict)  # variant -> logits of the head
    ms: dict[str, float] = field(default_factory=dict)  # variant -> ms of the head's scoring


def windows_of(pipeline: Pipeline, tokens: np.ndarray, chunks: np.ndarray, width: int, with_title: bool) -> list[str]:
    """Each head chunk's best ``width``-token window, as served (the cross-encoder stage's ``passages``);
    ``with_title``: after its title when the window does not start with it."""
    index = pipeline.index
    out = []
    for c, text in zip(chunks.tolist(), pipeline.ce_stage.passages(index, chunks, tokens, width), strict=True):
        title = index.documents[index.chunks[c]["doc"]].title
        if with_title and title and not text.startswith(title):
            text = f"{title}\n{text}"
        out.append(text)
    return out


def collect(pipeline: Pipeline, queries: dict[str, str], top_k: int) -> list[Query]:
    late = pipeline.index.late
    assert late is not None, "the index has no token vectors"
    out = []
    for qid, text in queries.items():
        res = pipeline.search(text, 100, candidates=100, use_cache=False)
        head = res.hits.chunk[:top_k]
        tokens = pipeline.embedder.encode([text], with_tokens=True).token_vectors[0].astype(np.float32)
        # the gate's signal, as served: the head as late interaction (or, when it skipped, fusion) left it
        q = Query(qid, text, res.hits.doc, decisive_gap(res.hits.scores[:pipeline.config.rerank.li_top_k]))
        q.texts["full"] = [pipeline.index.passage_with_title(int(c)) for c in head]
        for w in WIDTHS:
            q.texts[f"window{w}"] = windows_of(pipeline, tokens, head, w, with_title=False)
            q.texts[f"title+window{w}"] = windows_of(pipeline, tokens, head, w, with_title=True)
        out.append(q)
    return out


def score_all(queries: list[Query], models: dict[str, CrossEncoder], variants: list[tuple[str, str, str]],
              repeats: int) -> None:
    """Each (variant, model, text) scored per query, interleaved; the fastest of ``repeats`` runs is its time."""
    for q in queries:
        for name, model, text in variants:
            pairs = [(q.text, p) for p in q.texts[text]]
            best = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                s = models[model].score(pairs)
                best = min(best, (time.perf_counter() - t) * 1000.0)
            q.scores[name], q.ms[name] = s, best


def ndcg(pipeline: Pipeline, qrels: dict[str, dict[str, int]], runs: dict[str, np.ndarray]) -> float:
    ev = pytrec_eval.RelevanceEvaluator({q: qrels[q] for q in runs}, {"ndcg_cut.10"})
    scores = ev.evaluate({q: docs_to_run(pipeline.index, d) for q, d in runs.items()})
    return round(float(np.mean([scores[q]["ndcg_cut_10"] if q in scores else 0.0 for q in runs])), 5)


def rows(pipeline: Pipeline, qrels: dict[str, dict[str, int]], queries: list[Query], names: list[str],
         top_k: int) -> list[dict[str, Any]]:
    out = [{"variant": "no cross-encoder (the default cascade)",
            "ndcg@10": ndcg(pipeline, qrels, {q.qid: q.doc for q in queries}), "ms_p50": 0.0, "ms_mean": 0.0}]
    gaps = np.array([q.gap for q in queries])
    for name in names:
        ms = np.array([q.ms[name] for q in queries])
        for weight in (1.0, 0.5):
            for share in (0.0, 0.25, 0.5, 0.75):
                thr = float(np.quantile(gaps, 1.0 - share)) if share else float("inf")
                runs = {}
                for q in queries:
                    gated = share and q.gap >= thr
                    order = rerank_head(q.scores[name], len(q.doc), weight).order
                    runs[q.qid] = q.doc if gated else q.doc[order]
                cost = np.where(gaps >= thr, 0.0, ms) if share else ms
                lat = percentiles(ms.tolist())
                row: dict[str, Any] = {"variant": name, "ce_weight": weight, "ndcg@10": ndcg(pipeline, qrels, runs),
                                       "ms_p50": lat["p50_ms"], "ms_p95": lat["p95_ms"],
                                       "ms_mean": round(float(cost.mean()), 2)}
                if share:
                    row.update(gate_gap=round(thr, 3), skipped=round(float((gaps >= thr).mean()), 3))
                out.append(row)
    base = next(r for r in out if r["variant"] == "full fp32" and r["ce_weight"] == 1.0 and "skipped" not in r)
    for r in out:
        if r["ms_mean"]:
            r["cost_vs_full"] = round(r["ms_mean"] / base["ms_mean"], 3)
    return out


def agreement(queries: list[Query], a: str, b: str) -> float:
    """Pearson correlation of two variants' logits over every scored pair."""
    x = np.concatenate([q.scores[a] for q in queries])
    y = np.concatenate([q.scores[b] for q in queries])
    return round(float(np.corrcoef(x, y)[0, 1]), 4)


def same_head(queries: list[Query], a: str, b: str) -> float:
    """The share of queries whose head, reordered by each variant alone (``ce_weight`` 1), is the same."""
    same = [np.array_equal(np.argsort(-q.scores[a], kind="stable"), np.argsort(-q.scores[b], kind="stable"))
            for q in queries]
    return round(float(np.mean(same)), 3) if same else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.studies.ce_levers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--split", default="test")
    ap.add_argument("--index", required=True)
    ap.add_argument("--config", help="TOML configuration of the served cascade (default: the shipped one)")
    ap.add_argument("--model", required=True, help="the cross-encoder (teacher) folder")
    ap.add_argument("--student", action="append", default=[], help="a distilled cross-encoder folder (repeatable)")
    ap.add_argument("--int8-dir", default="/tmp/hybridrag-ce-int8", help="where the int8 copy is written")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="ONNX intra-op threads (0 = onnxruntime's choice)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--only", default="", help="a regular expression: run only the variants it finds (the baseline, "
                                                "'full fp32', always runs)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    config = load_config(args.config)
    queries, qrels = judged_queries(Path(args.dataset), args.split, args.limit)
    runtime = RuntimeConfig(intra_op_threads=args.threads)

    def ce(folder: str | Path, max_length: int = 0, rt: RuntimeConfig | None = None) -> CrossEncoder:
        # precision "fp32": each variant's model as it is (the int8 ones are quantised folders), no automatic copy
        return CrossEncoder(CrossEncoderConfig(model=str(folder), max_length=max_length or args.max_length,
                                               runtime=rt or runtime, precision="fp32"))

    def int8(folder: str, out: str) -> Path:
        quantize_model(Path(folder), Path(out), force=True)
        return Path(out)

    # every model a variant may score with, made only when a kept variant needs it (int8 copies are written)
    factories: dict[str, Callable[[], CrossEncoder]] = {
        "fp32": lambda: ce(args.model), "int8": lambda: ce(int8(args.model, args.int8_dir))}
    variants = [("full fp32", "fp32", "full"), ("full int8", "int8", "full")]
    # the runtime's levers on whole passages (bench.ce_latency before): pair length, threads, graph optimisation
    levers = {f"max_length {n}": (n, runtime) for n in (256, 192) if n != args.max_length}
    levers["1 thread"] = (0, RuntimeConfig(intra_op_threads=1))
    levers["graph opt basic"] = (0, RuntimeConfig(intra_op_threads=args.threads, graph_optimization="basic"))
    for lever, (max_length, rt) in levers.items():
        factories[lever] = functools.partial(ce, args.model, max_length, rt)
        variants.append((f"full fp32 {lever}", lever, "full"))
    for w in WIDTHS:
        variants += [(f"window{w} fp32", "fp32", f"window{w}"), (f"title+window{w} fp32", "fp32", f"title+window{w}"),
                     (f"window{w} int8", "int8", f"window{w}")]
    for i, folder in enumerate(args.student):
        key = f"student{i}" if len(args.student) > 1 else "student"
        factories[key] = functools.partial(ce, folder)
        factories[key + " int8"] = functools.partial(lambda f, out: ce(int8(f, out)), folder, f"{args.int8_dir}-{key}")
        variants += [(f"{key} full", key, "full"), (f"{key} window48", key, "window48"),
                     (f"{key} window64", key, "window64"), (f"{key} int8 window48", key + " int8", "window48")]
    if args.only:
        variants = [v for v in variants if v[0] == "full fp32" or re.search(args.only, v[0])]
    models = {key: factories[key]() for key in dict.fromkeys(m for _, m, _ in variants)}
    with opened(args.index, config) as pipeline:
        t = time.perf_counter()
        qs = collect(pipeline, queries, args.top_k)
        print(f"collected {len(qs)} queries in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        score_all(qs[:3], models, variants, 1)  # warm-up
        t = time.perf_counter()
        score_all(qs, models, variants, args.repeats)
        print(f"scored {len(variants)} variants in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        table = rows(pipeline, qrels, qs, [v[0] for v in variants], args.top_k)
        pieces = {name: median([sum(len(e.ids) for e in models["fp32"].model.tokenize(
            [(q.text, p) for p in q.texts[text]])) / len(q.texts[text]) for q in qs], 1) for name, _, text in variants}
    agree = {name: agreement(qs, "full fp32", name) for name, _, _ in variants if name != "full fp32"}
    same = {name: same_head(qs, "full fp32", name) for name, _, _ in variants if name != "full fp32"}
    result = {"queries": len(qs), "top_k": args.top_k, "rows": table, "pearson_vs_full_fp32": agree,
              "same_head_order_as_full_fp32": same, "median_pair_pieces": pieces}
    print(f"{'variant':32} {'w':>4} {'skip':>5} {'nDCG@10':>8} {'p50 ms':>7} {'mean ms':>8} {'cost':>6}")
    for r in table:
        print(f"{r['variant']:32} {r.get('ce_weight', ''):>4} {r.get('skipped', 0):>5} {r['ndcg@10']:>8.4f} "
              f"{r['ms_p50']:>7.2f} {r['ms_mean']:>8.2f} {r.get('cost_vs_full', ''):>6}")
    if args.json:
        write_result(args.json, f"ce_levers_{Path(args.dataset).name}_{args.split}",
                     {k: v for k, v in vars(args).items() if k != "json"}, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
