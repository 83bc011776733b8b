"""Where the cross-encoder stage's time goes, and which levers cut it without losing ranking quality.

For each query of the dataset split, the fused top-K passages (K = ``--top-k``, the served ce_top_k) are scored
as one request, the way the pipeline scores them. Variants, all in the same run against the baseline (the
configured model as served before this benchmark: fp32, max_length 256, ONNX Runtime's default threads, full
graph optimisation):

* ``max_length`` (pair length in word pieces; the passage side is cut),
* intra-op threads, graph optimisation level,
* int8: ONNX Runtime dynamic quantisation of the same model (``--int8`` writes it next to the results),

Each variant reports p50/p99 ms per request and, so that speed is never bought with quality, nDCG@10 of the fused
list with its top K reordered by that variant, plus the share of queries whose reordered top K equals the
baseline's. Usage::

    python -m bench.ce_latency --dataset ../shared/data/beir/nfcorpus --split dev --index /tmp/idx/nfcorpus \\
        --model ../shared/models/ce-minilm-l6-beir-train [--limit 100] [--int8 /tmp/ce-int8] [--json results/bench.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import write_result


def _quantize(model_dir: Path, out_dir: Path) -> Path:
    """Dynamic int8 (weights int8, activations quantised per call) of ``model_dir``'s model.onnx into ``out_dir``."""
    import shutil

    from onnxruntime.quantization import QuantType, quantize_dynamic

    out_dir.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and f.name != "model.onnx":
            shutil.copy(f, out_dir / f.name)
    quantize_dynamic(str(model_dir / "model.onnx"), str(out_dir / "model.onnx"), weight_type=QuantType.QInt8)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--split", default="dev")
    ap.add_argument("--index", required=True)
    ap.add_argument("--model", required=True, help="cross-encoder folder (model.onnx + tokenizer.json)")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--int8", help="write the int8 copy here and include it")
    ap.add_argument("--variants", default="", help="comma-separated subset of variant names (default: all)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from index_builder.models import CrossEncoder, CrossEncoderConfig, Embedder
    from index_builder.onnx_runner import RuntimeConfig
    from rerank.cross_encoder import rerank_by_scores
    from retrieval.config import load_config
    from retrieval.evaluate import evaluate, hits_to_run, load_qrels, load_queries
    from retrieval.search.index import SearchIndex
    from retrieval.search.pipeline import Pipeline, reorder

    config = load_config(environ={})
    embedder = Embedder(config.embedder)
    index = SearchIndex.load(Path(args.index), config, embedder)
    qrels = load_qrels(args.dataset, args.split)
    all_q = load_queries(args.dataset)
    qids = [q for q in qrels if q in all_q][: args.limit or None]
    pipeline = Pipeline(index, embedder, config)
    fused = {q: pipeline.search(all_q[q], 100, stages=("bm25", "dense")).hits for q in qids}
    pipeline.close()
    heads = {q: [index.passage_with_title(int(c)) for c in fused[q].chunk[: args.top_k]] for q in qids}
    tokens = [len(p.split()) for q in qids for p in heads[q]]

    model = Path(args.model)
    variants: dict[str, tuple[Path, int, RuntimeConfig]] = {
        "baseline (fp32, 256, default threads, opt all)": (model, 256, RuntimeConfig()),
        "1 thread": (model, 256, RuntimeConfig(intra_op_threads=1)),
        "graph opt basic": (model, 256, RuntimeConfig(graph_optimization="basic")),
        "max_length 192": (model, 192, RuntimeConfig()),
        "max_length 128": (model, 128, RuntimeConfig()),
    }
    if args.int8:
        q8 = _quantize(model, Path(args.int8))
        variants["int8 dynamic"] = (q8, 256, RuntimeConfig())
        variants["int8 dynamic, max_length 192"] = (q8, 192, RuntimeConfig())
    if args.variants:
        wanted = set(args.variants.split(","))
        variants = {k: v for k, v in variants.items() if k in wanted or k.startswith("baseline")}

    results: dict[str, Any] = {}
    base_order: dict[str, list[int]] = {}
    for name, (folder, max_length, runtime) in variants.items():
        ce = CrossEncoder(CrossEncoderConfig(model=str(folder), max_length=max_length, runtime=runtime))
        for q in qids[:5]:  # warm-up
            ce.score_pairs(all_q[q], heads[q])
        lat, run, same = [], {}, 0
        for q in qids:
            t = time.perf_counter()
            scores = ce.score_pairs(all_q[q], heads[q])
            lat.append((time.perf_counter() - t) * 1000)
            hits = reorder(fused[q], rerank_by_scores(scores, len(fused[q])))
            run[q] = hits_to_run(index, hits)
            order = hits.doc[: args.top_k].tolist()
            if name.startswith("baseline"):
                base_order[q] = order
            same += order == base_order[q]
        lat_a = np.asarray(lat)
        results[name] = {"p50_ms": round(float(np.percentile(lat_a, 50)), 1),
                         "p99_ms": round(float(np.percentile(lat_a, 99)), 1),
                         "ndcg@10": evaluate(qrels, run)["ndcg@10"], "same_top_k_as_baseline": round(same / len(qids), 3),
                         "max_length": max_length, "model": str(folder)}
        print(f"{name:<48} p50 {results[name]['p50_ms']:7.1f} ms  p99 {results[name]['p99_ms']:7.1f} ms  "
              f"nDCG@10 {results[name]['ndcg@10']:.4f}  same top-{args.top_k} "
              f"{results[name]['same_top_k_as_baseline']:.3f}", file=sys.stderr)
    fused_ndcg = evaluate(qrels, {q: hits_to_run(index, fused[q]) for q in qids})["ndcg@10"]
    print(f"fused (no cross-encoder) nDCG@10 {fused_ndcg:.4f}; {len(qids)} queries, top {args.top_k}, "
          f"passages ~{np.mean(tokens):.0f} words", file=sys.stderr)
    if args.json:
        cfg = {"dataset": Path(args.dataset).name, "split": args.split, "queries": len(qids), "top_k": args.top_k,
               "model": str(model)}
        write_result(args.json, "ce_latency", cfg, {"variants": results, "fused_ndcg@10": fused_ndcg})
    return 0


if __name__ == "__main__":
    sys.exit(main())
