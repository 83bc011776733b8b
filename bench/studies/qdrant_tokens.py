"""Qdrant's own compact forms of the late-interaction multivectors (issue #41, ask 6), measured on Qdrant's engine.

The Qdrant backend (``retrieval/engines/qdrant/``) puts into the engine the vectors the snapshot's compact store
stands for (``pool3+bins``: a third as many vectors as tokens, decoded), and configures the multivector by
``[backend] token_datatype / token_memory / token_quantization / token_rescore``. No Qdrant server can be installed
here and qdrant-client's local mode scores float32 in numpy whatever the configuration, so this study runs those
configurations on **Qdrant Edge** (``qdrant-edge-py``): Qdrant's own Rust segment storage, quantization and
scoring, in process. Per form: bytes on disk per passage of the shard's segments (allocated blocks; its write-ahead
log apart; ``--all-chunks`` for figures that do not carry the preallocated chunk files), the process's anonymous RSS
it adds once loaded and queried, MaxSim ms per query in the engine, and the served cascade's nDCG@10 with the
engine's MaxSim in place of the snapshot's (the fused top ``li_top_k`` reranked at the served weight, the long-query
gate included, as :mod:`bench.studies.token_codes` scores a codec), with the largest score difference against the
snapshot's own MaxSim and the share of queries whose top 10 is the snapshot's.

Forms (``--forms``): ``ram-f32`` (float32, page cache), ``disk-f16`` (float16, memory-mapped: what the backend
configures by default), ``disk-f16+bq`` (binary quantization kept in RAM, the query at 8 bits; MaxSim from the
1-bit codes: ``token_rescore = false``), ``disk-f16+bq+rescore`` (candidates rescored from the stored vectors),
``disk-f16+sq8`` (int8 scalar quantization in RAM, MaxSim from it).

    python -m bench.studies.qdrant_tokens --set scifact-test:test:$B/scifact:$I:test --json results/qdrant-tokens.json
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import percentiles, write_result
from bench.harness.pipelines import opened
from bench.harness.stats import vm_rss_mib
from bench.studies.cascade_robustness import Scorer, parse_set, reorder_head
from bench.studies.token_codes import QuerySet, collect
from retrieval.config import load_config
from retrieval.evaluate import judged_queries

FORMS = ("ram-f32", "disk-f16", "disk-f16+bq", "disk-f16+bq+rescore", "disk-f16+sq8")


def edge_config(qe: Any, form: str, dim: int) -> Any:
    """The Edge shard's configuration for ``form``: one MaxSim multivector, no HNSW on it."""
    quant = None
    if "+bq" in form:
        quant = qe.BinaryQuantizationConfig(always_ram=True,
                                            query_encoding=qe.BinaryQuantizationQueryEncoding.Scalar8Bits)
    elif "+sq8" in form:
        quant = qe.ScalarQuantizationConfig(type=qe.ScalarType.Int8, always_ram=True)
    params = qe.EdgeVectorParams(
        size=dim, distance=qe.Distance.Dot,
        multivector_config=qe.MultiVectorConfig(qe.MultiVectorComparator.MaxSim),
        datatype=qe.VectorStorageDatatype.Float16 if "f16" in form else qe.VectorStorageDatatype.Float32,
        memory=qe.Memory.Cold if form.startswith("disk") else qe.Memory.Cached, quantization_config=quant,
        hnsw_config=qe.HnswIndexConfig(m=0, ef_construct=100, full_scan_threshold=10_000))  # as the backend: no graph
    return qe.EdgeConfig(vectors={"tokens": params})


def shard_folder(form: str) -> str:
    """Forms that differ only in how they are queried share one shard."""
    return form.removesuffix("+rescore")


def folder_bytes(path: Path) -> dict[str, int]:
    """Bytes the shard takes on disk (allocated blocks: the engine preallocates its mmap chunks), apart: its
    segments (vectors, quantized copies, id tracker) and its write-ahead log (a copy of recent writes, truncated as
    the engine flushes)."""
    out = {"segments": 0, "wal": 0}
    for p in path.rglob("*"):
        if p.is_file():
            out["wal" if "wal" in p.relative_to(path).parts[:1] else "segments"] += p.stat().st_blocks * 512
    return out


def fill(qe: Any, shard: Any, late: Any, chunks: np.ndarray, batch: int = 256) -> float:
    """Every chunk of ``chunks`` upserted with the vectors the snapshot's store stands for (the migration's
    ``decoded``); returns the seconds it took."""
    t = time.perf_counter()
    for lo in range(0, len(chunks), batch):
        pts = [qe.Point(int(c), {"tokens": late.decoded(int(c)).tolist()}) for c in chunks[lo:lo + batch]]
        shard.update(qe.UpdateOperation.upsert_points(pts))
    shard.flush()
    shard.optimize()
    return time.perf_counter() - t


def engine_maxsim(qe: Any, shard: Any, tokens: np.ndarray, head: np.ndarray, rescore: bool | None) -> np.ndarray:
    ids = [int(c) for c in head]
    got = shard.query(qe.QueryRequest(
        limit=len(ids), query=qe.Query.Nearest(np.asarray(tokens, dtype=np.float32).tolist(), using="tokens"),
        filter=qe.Filter(must=[qe.HasIdCondition(set(ids))]),
        params=qe.SearchParams(quantization=qe.QuantizationSearchParams(rescore=rescore))))
    by_id = {int(p.id): float(p.score) for p in got}
    return np.array([by_id.get(c, 0.0) for c in ids], dtype=np.float32)


def study(args: argparse.Namespace, config: Any, stack: contextlib.ExitStack) -> dict[str, Any]:
    import qdrant_edge as qe

    li_top_k = config.rerank.li_top_k
    name, _role, dataset, index_dir, split = parse_set(args.set)
    pipeline = stack.enter_context(opened(index_dir, config))
    late = pipeline.index.late
    if late is None:
        raise SystemExit(f"{index_dir} has no token vectors")
    queries, qrels = judged_queries(dataset, split, args.limit)
    qs = QuerySet(name, "test", str(index_dir), qrels, queries)
    collect(pipeline, qs)
    scorer = Scorer(pipeline, qs)  # type: ignore[arg-type]
    items = qs.items
    scored = [q for q in items if q.weight > 0]
    n_chunks = len(late.offsets) - 1
    chunks = (np.arange(n_chunks) if args.all_chunks else
              np.unique(np.concatenate([q.fused.chunk[:li_top_k] for q in scored] or [np.zeros(0, np.int64)])))
    dim = int(late.decoded(int(chunks[0])).shape[1]) if len(chunks) else 0
    stored_vectors = int(sum(int(late.offsets[c + 1] - late.offsets[c]) for c in chunks))

    def run_of(scores: dict[str, np.ndarray]) -> dict[str, float]:
        return scorer.ndcg({q.qid: reorder_head(q.fused.doc, scores[q.qid], q.weight) if q.qid in scores
                            else q.fused.doc for q in items})

    ref = {q.qid: late.scores(q.tokens, q.fused.chunk[:li_top_k]) for q in scored}  # the served stage's MaxSim
    ref_ndcg = run_of(ref)
    ref_top = {q.qid: reorder_head(q.fused.doc, ref[q.qid], q.weight)[:10] for q in scored}
    out: dict[str, Any] = {
        "set": name, "index": str(index_dir), "storage": late.storage, "queries": len(items),
        "reranked": len(scored), "passages_stored": len(chunks), "vectors_stored": stored_vectors,
        "vectors_per_passage": round(stored_vectors / max(len(chunks), 1), 1), "dim": dim,
        "fused_ndcg": round(float(np.mean(list(scorer.ndcg({q.qid: q.fused.doc for q in items}).values()))), 4),
        "snapshot_ndcg": round(float(np.mean(list(ref_ndcg.values()))), 4),
        "snapshot_bytes_per_passage": round(float(np.asarray(late.vectors[:1]).nbytes) *
                                            float(late.offsets[-1]) / n_chunks, 1),
        "forms": {}}
    work = Path(tempfile.mkdtemp(prefix="qdrant-tokens-", dir=args.work or None))
    shards: dict[str, Any] = {}
    try:
        for form in args.forms:
            folder = shard_folder(form)
            anon0 = vm_rss_mib("RssAnon")
            fill_s = None
            if folder not in shards:
                path = work / folder
                shard = qe.EdgeShard.create(str(path), edge_config(qe, folder, dim))
                fill_s = fill(qe, shard, late, chunks)
                shard.close()
                shards[folder] = qe.EdgeShard.load(str(path))  # as a server opens it: from disk
            shard = shards[folder]
            rescore = form.endswith("+rescore") if ("+bq" in form or "+sq8" in form) else None
            times, scores = [], {}
            for q in scored:
                t = time.perf_counter()
                scores[q.qid] = engine_maxsim(qe, shard, q.tokens, q.fused.chunk[:li_top_k], rescore)
                times.append((time.perf_counter() - t) * 1000)
            ndcg = run_of(scores)
            diffs = [float(np.max(np.abs(scores[q.qid] - ref[q.qid]))) for q in scored if len(ref[q.qid])]
            same = [np.array_equal(reorder_head(q.fused.doc, scores[q.qid], q.weight)[:10], ref_top[q.qid])
                    for q in scored]
            disk = folder_bytes(work / folder)
            row = {"disk_bytes_per_passage": round(disk["segments"] / max(len(chunks), 1), 1),
                   "wal_bytes_per_passage": round(disk["wal"] / max(len(chunks), 1), 1),
                   "rss_anon_added_mib": round(vm_rss_mib("RssAnon") - anon0, 1) if fill_s is not None else None,
                   "fill_s": None if fill_s is None else round(fill_s, 1),
                   "ndcg": round(float(np.mean(list(ndcg.values()))), 4),
                   "delta_vs_snapshot": round(float(np.mean([ndcg[q] - ref_ndcg[q] for q in ndcg])), 4),
                   "max_abs_score_diff": round(max(diffs, default=0.0), 4),
                   "same_top10": round(float(np.mean(same)) if same else 1.0, 4),
                   "maxsim_ms": percentiles(times)}
            out["forms"][form] = row
            print(f"{form}: nDCG {row['ndcg']} ({row['delta_vs_snapshot']:+.4f}), |dscore| <= "
                  f"{row['max_abs_score_diff']}, same top 10 {row['same_top10']}, {row['disk_bytes_per_passage']:.0f} "
                  f"B/passage on disk, p50 {row['maxsim_ms']['p50_ms']} ms", file=sys.stderr)
    finally:
        for s in shards.values():
            s.close()
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.studies.qdrant_tokens", description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", required=True, help="NAME:test:DATASET:INDEX:SPLIT")
    ap.add_argument("--forms", type=lambda s: [f.strip() for f in s.split(",") if f.strip()], default=list(FORMS))
    ap.add_argument("--config", help="service config (TOML) the pipeline opens with")
    ap.add_argument("--all-chunks", action="store_true", help="store every passage, not only the queries' heads")
    ap.add_argument("--work", default="", help="folder for the Edge shards (default: the system's temp folder)")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    bad = set(args.forms) - set(FORMS)
    if bad:
        ap.error(f"unknown forms {sorted(bad)}; choose from {', '.join(FORMS)}")
    config = load_config(args.config)
    with contextlib.ExitStack() as stack:
        out = study(args, config, stack)
    if args.json:
        write_result(args.json, "qdrant_tokens", {k: str(v) for k, v in vars(args).items() if k != "json"}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
