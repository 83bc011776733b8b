"""The scale bench (issue #41): what the current build and serving path cost as the corpus grows, from thousands to a
million passages of real text (:mod:`bench.scale_corpus`: Debian's documentation, then recombined sentences).

Per size N (``--sizes``), one after another, every figure from the code and configuration as they are (``--config``
is given to the build and the server alike; nothing here knows today's file names or index types):

- **build**: the product's ``build_snapshot`` in a child process (``python -m bench.scale child-build``), measured
  alone: wall seconds, the build summary's own split (``timings``), the child's peak RSS (``ru_maxrss`` from
  ``wait4``) and the peaks of its anonymous and file-backed parts (sampled: pages of memory-mapped files count in
  RSS, the kernel can drop them), word pieces embedded, and where the vectors came from (``--vectors``, below);
- **disk**: bytes of the snapshot ``CURRENT`` points at, per passage, grouped into parts by file name (``PARTS``:
  tokens = ``token*``, dense = ``vectors*`` / ``hnsw*`` / ``*.faiss`` / ``dense*`` / ``ivf*``, BM25 = ``bm25*``,
  text = ``documents*`` / ``passages*``, other = the rest), each file listed;
- **serving**: a spawned ``hybridrag serve`` (:mod:`bench.harness.server`): seconds to SERVING, its memory once
  loaded and after ``--warmup-queries`` queries (VmRSS and its anonymous / file-backed parts, per passage, and per
  passage above the smallest size of the run; the resident MiB of the snapshot's memory-mapped files by part),
  Retrieve p50/p99 and QPS at each of ``--concurrency`` (closed loop, :mod:`bench.harness.loadgen`) with the mean
  per-stage split of the answers' ``timings_ms``;
- **recall@100** of the served dense stage against exact search over the same vectors
  (``retrieval.evaluate.run_stages``: ``dense`` vs ``dense_exact``), with each one's latency, in process.

Vectors (``--vectors``; :mod:`bench.harness.vectors`): ``model`` runs the real model on every passage (and records
its outputs in ``--vectors-dir``); ``perturbed`` takes the recorded real vectors where a passage has them and
*synthesises* the rest (small Gaussian perturbations of real rows, renormalised, as many token vectors as the text
has word pieces): **for cost curves only**, never for quality (the JSON says which rows were synthesised);
``auto`` (default) is ``model`` up to ``--model-up-to`` passages and ``perturbed`` above. A perturbed size reports
``embed_projected_s``: its word pieces at the model's word pieces per second measured by a ``model`` size.

Before each size the bench projects its disk and peak memory from the largest size measured so far (this run, or
the JSON file) and skips it, saying so, when it cannot fit (``--force`` tries anyway).

``--quality``: SciFact's (``--dataset``) test queries over SciFact alone and over SciFact plus ``--distractors``
real passages of the pool (never recombined, never SciFact's own text), every vector the real model's
(``cached``: SciFact's from ``--seed-index``, a built SciFact snapshot, when given; the rest embedded once and
recorded): nDCG@10 and recall@100 per stage, and the change.

    python -m bench.scale --corpus-dir /work/data/scale --sizes 1000,10000,100000 --dataset D --json J --plots P
    python -m bench.scale --quality --corpus-dir /work/data/scale --dataset D --distractors 100000 --seed-index I
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import ints, query_list, ratio, write_result
from bench.harness import plots as plotting
from bench.harness.loadgen import LevelSpec, RequestSpec, answer_each, measure_level
from bench.harness.server import run_measured, served, server_status
from bench.harness.stats import mapped_files_mib, proc_memory_mib
from bench.scale_rebuild import measure_rebuild, rebuild_kept
from bench.scale_recall import corpus_queries, measure_recall, recall_sweep

# A snapshot's files grouped into parts by name (the first path component or the file name, fnmatch patterns, the
# first part that matches wins): what today's and tomorrow's layouts call them.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tokens", ("token*", "late_interaction*", "maxsim*")),
    ("dense", ("vectors*", "hnsw*", "*.faiss", "dense*", "ivf*", "pq*", "sq8*")),
    ("bm25", ("bm25*",)),
    ("text", ("documents*", "passages*", "text*", "docs*")),
)
MODES = ("auto", "model", "cached", "perturbed")


class ScaleError(Exception):
    pass


# ---------------------------------------------------------------------------------------------- disk


def part_of(rel: str) -> str:
    """The part a snapshot file belongs to (see ``PARTS``).

    >>> [part_of(p) for p in ("token_vectors.npy", "hnsw.faiss", "dense/ivf_pq.faiss", "bm25/vocab.index.json",
    ...                       "documents.jsonl", "passages/000.bin", "manifest.json", "chunks.npy")]
    ['tokens', 'dense', 'dense', 'bm25', 'text', 'text', 'other', 'other']
    """
    parts = rel.split("/")
    for part, patterns in PARTS:
        if any(fnmatch.fnmatch(parts[0], p) or fnmatch.fnmatch(parts[-1], p) for p in patterns):
            return part
    return "other"


def snapshot_folder(index: Path) -> Path:
    from index_builder.snapshot.format import current_snapshot_dir

    return current_snapshot_dir(index)


def disk_by_part(snapshot: Path, passages: int, chunks: int) -> dict[str, Any]:
    """Bytes of a snapshot folder per part, per passage and per chunk, with every file's size."""
    files = {p.relative_to(snapshot).as_posix(): p.stat().st_size for p in sorted(snapshot.rglob("*")) if p.is_file()}
    parts: dict[str, int] = {name: 0 for name, _ in PARTS} | {"other": 0}
    for rel, size in files.items():
        parts[part_of(rel)] += size
    total = sum(parts.values())
    return {"bytes": total, "bytes_per_passage": round(total / max(passages, 1), 1),
            "bytes_per_chunk": round(total / max(chunks, 1), 1), "parts": parts,
            "parts_per_passage": {k: round(v / max(passages, 1), 1) for k, v in parts.items()}, "files": files}


# ---------------------------------------------------------------------------------------------- the build (child)


def child_build(spec_path: str) -> int:
    """``python -m bench.scale child-build SPEC``: the product's build of one corpus with the embedder the spec
    names; writes what it did to ``spec["result"]``."""
    from bench.harness.vectors import CachedEmbedder, PerturbedEmbedder, RecordingEmbedder, VectorCache, model_identity
    from index_builder.build.builder import build_snapshot
    from index_builder.models.encoders import Embedder
    from retrieval.config import load_config

    spec = json.loads(Path(spec_path).read_text())
    try:  # on a shared machine, the build is the process the kernel kills first if memory runs out
        Path("/proc/self/oom_score_adj").write_text("1000")
    except OSError:
        pass
    config = load_config(spec.get("config") or None)
    build_config = config.build_config()
    t = time.perf_counter()
    docs, kwargs = _documents(spec["corpus"], build_snapshot)
    read_s = time.perf_counter() - t
    t = time.perf_counter()
    inner = Embedder(build_config.embedder)
    load_model_s = time.perf_counter() - t
    identity = model_identity(inner)
    caches = [VectorCache(p, identity) for p in spec["vectors"]]
    mode = spec["mode"]
    if mode == "model":
        embedder: Any = RecordingEmbedder(inner, caches[0])
    elif mode == "cached":
        embedder = CachedEmbedder(inner, caches)
    else:
        embedder = PerturbedEmbedder(inner, caches, caches[0], sigma=spec["sigma"], seed=spec["seed"])
    from bench.harness.stats import vm_rss_mib

    rss_before = vm_rss_mib()
    summary = build_snapshot(docs, Path(spec["out"]), build_config, embedder=embedder, progress=False, **kwargs)
    embedder.close()
    result = {"documents": summary.documents, "chunks": summary.chunks, "token_vectors": summary.token_vectors,
              "seconds": round(summary.seconds, 2), "bytes_on_disk": summary.bytes_on_disk,
              "timings": {k: round(v, 2) for k, v in summary.timings.items()}, "snapshot": str(summary.path),
              "read_corpus_s": round(read_s, 2), "load_model_s": round(load_model_s, 2),
              "rss_before_build_mib": round(rss_before, 1),
              "streamed": "total" in kwargs, "vectors": embedder.stats(), "embedder": identity,
              "anon_mib_at": getattr(summary, "memory_mib", {}),
              **{k: getattr(summary, k) for k in ("embedded", "reused") if hasattr(summary, k)}}
    Path(spec["result"]).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _documents(corpus: str, build_snapshot: Any) -> tuple[Any, dict[str, Any]]:
    """The corpus as ``hybridrag build`` hands it to the build: a stream with its count where the build takes one
    (``total``), else the list."""
    import inspect

    from index_builder.documents import corpus as readers

    if hasattr(readers, "iter_corpus") and "total" in inspect.signature(build_snapshot).parameters:
        total = sum(1 for _ in readers.iter_corpus(corpus))
        return readers.iter_corpus(corpus), {"total": total}
    docs, _ = readers.read_corpus(corpus)
    return docs, {}


def run_build(corpus: Path, out: Path, mode: str, args: argparse.Namespace, vectors: list[Path],
              log_dir: Path, *, fresh: bool = True) -> dict[str, Any]:
    """One build in a child process, measured alone (its seconds, peak RSS, CPU) with the child's own report;
    ``fresh=False`` builds into ``out`` as it is (a rebuild: what its snapshot holds is reused)."""
    if fresh and out.exists():
        shutil.rmtree(out)
    spec = {"corpus": str(corpus), "out": str(out), "mode": mode, "config": str(args.config or ""),
            "vectors": [str(v) for v in vectors], "sigma": args.sigma, "seed": args.seed,
            "result": str(log_dir / f"build-{out.name}.json")}
    spec_path = log_dir / f"build-{out.name}-spec.json"
    spec_path.write_text(json.dumps(spec))
    print(f"  {'building' if fresh else 'rebuilding'} {out.name} ({mode} vectors) from {corpus.name}...",
          file=sys.stderr)
    proc = run_measured([sys.executable, "-m", "bench.scale", "child-build", str(spec_path)], log_dir,
                        f"build-{out.name}", timeout_s=args.build_timeout)
    child = json.loads(Path(spec["result"]).read_text())
    return {**child, "wall_s": proc["seconds"], "cpu_s": proc["cpu_s"],
            **{k: proc[k] for k in ("peak_rss_mib", "peak_anon_mib", "peak_file_mib")}}


# ---------------------------------------------------------------------------------------------- serving, recall


def measure_serving(index: Path, queries: list[tuple[str, str]], args: argparse.Namespace,
                    log_dir: Path) -> dict[str, Any]:
    """A spawned server over ``index``: load time, memory loaded / warm / after the levels, the levels."""
    snapshot = snapshot_folder(index)

    def mapped(pid: int) -> dict[str, float]:  # resident MiB of the snapshot's memory-mapped files, by part
        parts: dict[str, float] = {}
        for path, mib in mapped_files_mib(pid, str(snapshot)).items():
            part = part_of(Path(path).relative_to(snapshot).as_posix())
            parts[part] = round(parts.get(part, 0.0) + mib, 1)
        return parts

    t = time.perf_counter()
    with served(index, log_dir, config=args.config, timeout_s=args.server_timeout) as server:
        load_s = round(time.perf_counter() - t, 2)
        loaded, loaded_maps = proc_memory_mib(server.pid), mapped(server.pid)
        warm_spec = LevelSpec(server.target, tuple(queries[:args.warmup_queries]), 1, 0.0, 0.0, RequestSpec())
        asyncio.run(answer_each(warm_spec))
        warm, warm_maps = proc_memory_mib(server.pid), mapped(server.pid)
        levels = {}
        for c in ints(args.concurrency):
            spec = LevelSpec(server.target, tuple(queries), c, args.duration, args.warmup, RequestSpec(),
                             server_pid=server.pid)
            entry, _ = measure_level(spec)
            levels[str(c)] = {k: entry[k] for k in ("qps", "n", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "errors",
                                                     "degraded", "stage_ms", "client_cpu_util")
                              if k in entry} | {"server_cpu_util": entry.get("server_cpu_util")}
            print(f"    C={c}: p50 {entry['p50_ms']} ms, p99 {entry['p99_ms']} ms, {entry['qps']} QPS, "
                  f"stages {entry['stage_ms']}", file=sys.stderr)
        after, after_maps = proc_memory_mib(server.pid), mapped(server.pid)
        status = server_status(server.target)
    return {"load_s": load_s, "memory_mib": {"loaded": loaded, "warm": warm, "after_levels": after},
            "mapped_snapshot_mib": {"loaded": loaded_maps, "warm": warm_maps, "after_levels": after_maps},
            "levels": levels, "status": status}


def serve_alternating(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """``--serve-indexes A,B``: each built index served in turn (A, B, A, B, ...), ``--rounds`` times, by the code
    as it is: memory per passage and latency per index, each round kept, and the ratios of the medians against the
    first index. For a latency comparison between sizes that a noisy shared machine does not decide."""
    from bench.harness import median

    indexes = [Path(p) for p in args.serve_indexes.split(",") if p]
    if args.dataset:
        queries, _ = query_list(args.dataset, args.split, args.limit)
    else:
        raise ScaleError("--serve-indexes needs --dataset (the queries asked)")
    rounds: dict[str, list[dict[str, Any]]] = {str(i): [] for i in indexes}
    for r in range(args.rounds):
        for index in indexes:
            print(f"round {r + 1}: {index}", file=sys.stderr)
            rounds[str(index)].append(measure_serving(index, queries, args, log_dir))
    out: dict[str, Any] = {"indexes": {}}
    for index in indexes:
        chunks = json.loads((snapshot_folder(index) / "manifest.json").read_text())["counts"]["chunks"]
        runs = rounds[str(index)]
        levels = {c: {k: median([run["levels"][c][k] for run in runs]) for k in ("p50_ms", "p99_ms", "qps")}
                  for c in runs[0]["levels"]}
        stage = {c: {k: median([run["levels"][c]["stage_ms"].get(k, 0.0) for run in runs])
                     for k in runs[0]["levels"][c]["stage_ms"]} for c in runs[0]["levels"]}
        warm = {k: median([run["memory_mib"]["warm"][k] for run in runs]) for k in ("rss", "anon", "file")}
        out["indexes"][str(index)] = {"chunks": chunks, "levels": levels, "stage_ms": stage, "warm_mib": warm,
                                      "rounds": runs}
    first = out["indexes"][str(indexes[0])]
    for index in indexes[1:]:
        e = out["indexes"][str(index)]
        e["vs_first"] = {c: {k: ratio(e["levels"][c][k], first["levels"][c][k]) for k in ("p50_ms", "p99_ms")}
                         for c in e["levels"]}
        e["rss_above_first_per_chunk_bytes"] = {k: round((e["warm_mib"][k] - first["warm_mib"][k]) * 2**20
                                                         / (e["chunks"] - first["chunks"]), 1)
                                                for k in ("rss", "anon", "file")}
        print(f"{index}: p50 vs first {e['vs_first']}, RSS above the first per chunk "
              f"{e['rss_above_first_per_chunk_bytes']}", file=sys.stderr)
    return out


# ---------------------------------------------------------------------------------------------- projections


def _mem_available_mib() -> float:
    with open("/proc/meminfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    return float("inf")


def projection(size: int, measured: dict[int, dict[str, Any]], work: Path) -> dict[str, Any] | None:
    """Disk and peak build memory of ``size`` from the largest measured size, and what is free: disk linear per
    passage; memory the child's RSS before the build (model, runtime) plus what the build added, scaled per
    passage (where two sizes were measured, the slope between the two largest: without the fixed part)."""
    done = {n: e for n, e in measured.items() if "build" in e and n < size}
    if not done:
        return None
    n0 = max(done)
    e = done[n0]
    disk = e["disk"]["bytes_per_passage"] * size
    base = e["build"].get("rss_before_build_mib", 0.0)
    slope = (e["build"]["peak_rss_mib"] - base) / n0
    if len(done) >= 2:  # what a passage adds, without the fixed part (the model runtime's arena)
        n1 = sorted(done)[-2]
        slope = max(0.0, (e["build"]["peak_rss_mib"] - done[n1]["build"]["peak_rss_mib"]) / (n0 - n1))
    rss = base + slope * size
    return {"from_size": n0, "disk_gib": round(disk / 2**30, 1), "build_peak_rss_gib": round(rss / 1024, 1),
            "free_disk_gib": round(shutil.disk_usage(work).free / 2**30, 1),
            "mem_available_gib": round(_mem_available_mib() / 1024, 1)}


def too_big(p: dict[str, Any] | None) -> str | None:
    if p is None:
        return None
    why = []
    if p["disk_gib"] * 1.1 > p["free_disk_gib"]:
        why.append(f"the snapshot would take ~{p['disk_gib']} GiB, {p['free_disk_gib']} GiB free")
    if p["build_peak_rss_gib"] > p["mem_available_gib"]:
        why.append(f"the build would peak at ~{p['build_peak_rss_gib']} GiB RSS, {p['mem_available_gib']} GiB "
                   "available")
    return "; ".join(why) or None


# ---------------------------------------------------------------------------------------------- one size


def vector_mode(args: argparse.Namespace, size: int) -> str:
    """``--vectors`` for this size: one mode for all, or one per size (``model,cached,perturbed``)."""
    modes = [m.strip() for m in args.vectors.split(",")]
    bad = set(modes) - set(MODES)
    if bad:
        raise ScaleError(f"--vectors: unknown mode(s) {sorted(bad)}; choose from {list(MODES)}")
    if len(modes) > 1:
        sizes = sorted(ints(args.sizes))
        if len(modes) != len(sizes):
            raise ScaleError(f"--vectors gives {len(modes)} modes for {len(sizes)} sizes")
        mode = modes[sizes.index(size)]
    else:
        mode = modes[0]
    if mode != "auto":
        return mode
    return "model" if size <= args.model_up_to else "perturbed"


def measure_size(size: int, args: argparse.Namespace, queries: list[tuple[str, str]], log_dir: Path,
                 measured: dict[int, dict[str, Any]]) -> dict[str, Any]:
    from bench.scale_corpus import ensure_corpus

    corpus, meta = ensure_corpus(Path(args.corpus_dir), size, args.seed)
    mode = vector_mode(args, size)
    out: dict[str, Any] = {"passages": size, "corpus": meta, "vectors_mode": mode}
    proj = projection(size, measured, Path(args.work))
    out["projection"] = proj
    why = too_big(proj)
    if why and not args.force:
        out["skipped"] = why
        print(f"  {size}: skipped: {why}", file=sys.stderr)
        return out
    index = Path(args.work) / f"index-{size}"
    build = run_build(corpus, index, mode, args, [Path(args.vectors_dir) / "debian"], log_dir)
    out["build"] = build
    v = build["vectors"]
    out["quality_valid"] = v["synthesised"] == 0
    if v["model"] and build["timings"].get("embed"):
        out["model_word_pieces_per_s"] = round(v["word_pieces"] / build["timings"]["embed"], 1)
    print(f"  built in {build['wall_s']} s (peak RSS {build['peak_rss_mib']} MiB): {build['timings']}",
          file=sys.stderr)
    snapshot = snapshot_folder(index)
    out["disk"] = disk_by_part(snapshot, size, build["chunks"])
    manifest = json.loads((snapshot / "manifest.json").read_text())
    out["snapshot_settings"] = {k: v for k, v in manifest.items() if k not in ("files", "created_at")}
    print(f"  disk: {out['disk']['bytes_per_passage']:.0f} B/passage {out['disk']['parts_per_passage']}",
          file=sys.stderr)
    out["serving"] = measure_serving(index, queries, args, log_dir)
    m = out["serving"]["memory_mib"]["warm"]
    out["serving"]["rss_per_passage_bytes"] = {k: round(m[k] * 2**20 / size, 1) for k in ("rss", "anon", "file")}
    out["recall"] = measure_recall(index, queries[:args.recall_queries], args.config,
                                   in_domain=corpus_queries(corpus, args.recall_queries, args.seed + 1))
    print(f"  serving RSS warm {m['rss']} MiB (anon {m['anon']}, file {m['file']}); dense recall@100 "
          f"{out['recall'].get('recall')} (in domain {(out['recall'].get('in_domain') or {}).get('recall')})",
          file=sys.stderr)
    if args.rebuild_writes:
        out["rebuild"] = measure_rebuild(corpus, index, args, log_dir, run_build)
    if not args.keep_indexes:
        shutil.rmtree(index, ignore_errors=True)
    return out


def derive(sizes: dict[int, dict[str, Any]]) -> None:
    """Figures across sizes: RSS per passage above the smallest size's server, latency against the smallest size,
    projected model time for perturbed sizes."""
    built = {n: e for n, e in sizes.items() if "serving" in e}
    if not built:
        return
    n0 = min(built)
    base = built[n0]["serving"]["memory_mib"]["warm"]
    rate = next((e["model_word_pieces_per_s"] for _, e in sorted(built.items()) if e.get("model_word_pieces_per_s")),
                None)
    for n, e in built.items():
        warm = e["serving"]["memory_mib"]["warm"]
        if n > n0:
            e["serving"]["rss_above_smallest_per_passage_bytes"] = {
                k: round((warm[k] - base[k]) * 2**20 / (n - n0), 1) for k in ("rss", "anon", "file")}
        e["serving"]["vs_smallest"] = {
            c: {"p50_ratio": ratio(lv["p50_ms"], built[n0]["serving"]["levels"].get(c, {}).get("p50_ms")),
                "p99_ratio": ratio(lv["p99_ms"], built[n0]["serving"]["levels"].get(c, {}).get("p99_ms"))}
            for c, lv in e["serving"]["levels"].items()}
        v = e["build"]["vectors"]
        if rate and v["mode"] != "model":
            e["build"]["embed_projected_s"] = round(v["word_pieces"] / rate, 1)
            e["build"]["embed_projected_rate"] = rate
        if "rebuild" in e:  # against the full build; a build that did not run the model, with its model time added
            full = e["build"]["wall_s"] + (e["build"].get("embed_projected_s") or 0.0)
            e["rebuild"]["over_full_build"] = ratio(e["rebuild"]["wall_s"], full)
            e["rebuild"]["full_build_s"] = round(full, 1)
            e["rebuild"]["full_build_projected"] = bool(e["build"].get("embed_projected_s"))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus-dir", required=True, help="bench.scale_corpus's folder (pool.jsonl; corpora are made "
                                                        "there); outside the repository")
    ap.add_argument("--work", default="", help="where indexes are built (default CORPUS_DIR/runs)")
    ap.add_argument("--vectors-dir", default="", help="recorded real vectors (default CORPUS_DIR/vectors)")
    ap.add_argument("--sizes", default="1000,10000", help="passages per corpus, smallest first")
    ap.add_argument("--vectors", default="auto", help="auto | model | cached | perturbed, or one per size "
                                                       "(model,cached,perturbed)")
    ap.add_argument("--model-up-to", type=int, default=10_000, help="auto: the real model up to this size")
    ap.add_argument("--sigma", type=float, default=0.025, help="perturbed: noise per dimension (cos ~0.9 to the base)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default=None, help="TOML for the build and the server (default: the defaults)")
    ap.add_argument("--dataset", default="", help="a BEIR folder whose judged queries are asked (default: first "
                                                  "sentences of corpus passages)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--limit", type=int, default=0, help="at most this many queries (0 = all)")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--warmup-queries", type=int, default=30)
    ap.add_argument("--recall-queries", type=int, default=100)
    ap.add_argument("--server-timeout", type=float, default=900.0)
    ap.add_argument("--build-timeout", type=float, default=48 * 3600.0)
    ap.add_argument("--keep-indexes", action="store_true")
    ap.add_argument("--serve-indexes", default="",
                    help="instead of building: serve these built index roots (comma-separated), alternating for "
                         "--rounds rounds (one run compares them on the same machine state)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--recall-indexes", default="", help="built indexes (comma-separated): recall@100 of their dense "
                                                         "stage at each --recall-ef, instead of the size runs")
    ap.add_argument("--recall-ef", default="128,512,1024,2048", help="--recall-indexes: ef_search values")
    ap.add_argument("--rebuild-writes", type=int, default=0,
                    help="per size, then edit this many documents and time the rebuild (only they are embedded)")
    ap.add_argument("--rebuild-indexes", default="",
                    help="instead of building: rebuild these kept index roots (comma-separated, each made from "
                         "CORPUS_DIR's corpus of its size) after --rebuild-writes edits, measuring each build's time "
                         "and peak memory by the code as it is")
    ap.add_argument("--force", action="store_true", help="build a size even when projected not to fit")
    ap.add_argument("--quality", action="store_true", help="the quality run (SciFact + distractors) instead")
    ap.add_argument("--distractors", type=int, default=100_000)
    ap.add_argument("--seed-index", default="", help="--quality: a SciFact snapshot whose vectors are reused")
    ap.add_argument("--json", default="results/scale/scale.json")
    ap.add_argument("--plots", default="results/scale", help="folder for the PNG ('' for none)")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["child-build"]:
        return child_build(argv[1])
    args = build_parser().parse_args(argv)
    corpus_dir = Path(args.corpus_dir)
    args.work = args.work or str(corpus_dir / "runs")
    args.vectors_dir = args.vectors_dir or str(corpus_dir / "vectors")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="scale-", dir=args.work))
    config = {k: getattr(args, k) for k in ("sizes", "vectors", "model_up_to", "sigma", "seed", "config", "dataset",
                                            "split", "limit", "concurrency", "duration", "warmup_queries",
                                            "recall_queries", "rebuild_writes")}
    try:
        if args.quality:
            config = {"quality": True, "distractors": args.distractors, "dataset": args.dataset, "split": args.split,
                      "limit": args.limit, "seed": args.seed, "config": args.config}
            from bench.scale_quality import run_quality

            result = {**run_quality(args, log_dir, run_build), "code": code_version()}
            write_result(args.json, "scale_quality", config, result)
            print(json.dumps(result["ndcg@10_change"]))
            return 0
        if args.recall_indexes:
            result = {**recall_sweep(args), "code": code_version()}
            config = {"recall_indexes": args.recall_indexes, "recall_ef": args.recall_ef, "dataset": args.dataset,
                      "recall_queries": args.recall_queries, "config": args.config}
            write_result(args.json, "scale_recall", config, result)
            return 0
        if args.rebuild_indexes:
            result = {"rebuilds": rebuild_kept(args, log_dir, run_build), "code": code_version()}
            config = {"rebuild_indexes": args.rebuild_indexes, "rebuild_writes": args.rebuild_writes,
                      "config": args.config}
            write_result(args.json, "scale_rebuild", config, result)
            return 0
        if args.serve_indexes:
            result = {**serve_alternating(args, log_dir), "code": code_version()}
            config = {"serve_indexes": args.serve_indexes, "rounds": args.rounds, "dataset": args.dataset,
                      "concurrency": args.concurrency, "duration": args.duration, "config": args.config}
            write_result(args.json, "scale_serving", config, result)
            return 0
        sizes = sorted(ints(args.sizes))
        from bench.scale_corpus import ensure_corpus

        if args.dataset:
            queries, _ = query_list(args.dataset, args.split, args.limit)
        else:
            first, _ = ensure_corpus(corpus_dir, sizes[0], args.seed)
            queries = corpus_queries(first, args.limit or 300, args.seed)
        code = code_version()
        measured: dict[int, dict[str, Any]] = _earlier(args.json, code)
        result: dict[str, Any] = {"sizes": {}, "queries": len(queries), "log_dir": str(log_dir), "code": code}
        for size in sizes:
            print(f"size {size}:", file=sys.stderr)
            entry = measure_size(size, args, queries, log_dir, {**measured, **{int(n): e for n, e in
                                                                              result["sizes"].items()}})
            result["sizes"][str(size)] = entry
            derive({int(n): e for n, e in result["sizes"].items()})
            result["complete"] = size == sizes[-1]
            write_result(args.json, "scale", config, result)  # after each size: a long run killed keeps its sizes
        if args.plots and plotting.available():
            path = Path(args.plots) / f"scale-{code.replace('+', '-')}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            plotting.plot_scale(collect_sizes(args.json, code), path, f"hybridrag scale bench, code {code}")
            print(f"plot: {path}", file=sys.stderr)
        print(summary_table(result["sizes"]))
    except (ScaleError, ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"bench scale: {e}", file=sys.stderr)
        return 2
    return 0


def code_version() -> str:
    """The commit the measured code is (``+dirty`` with uncommitted changes; a copy made with ``git archive``
    carries it in ``.commit``)."""
    import subprocess

    from bench.harness.server import REPO

    if (REPO / ".commit").is_file():
        return (REPO / ".commit").read_text().strip()[:7]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _earlier(path: str, code: str) -> dict[int, dict[str, Any]]:
    """Sizes measured by earlier runs of the same code in the same JSON file (for the projections)."""
    try:
        return collect_sizes(path, code)
    except (OSError, ValueError, KeyError):
        return {}


def collect_sizes(path: str | Path, code: str | None = None) -> dict[int, dict[str, Any]]:
    """Every size measured in a JSON file's ``scale`` entries (of ``code`` only, when given), the latest run's
    where several measured one size."""
    data = json.loads(Path(path).read_text())
    out: dict[int, tuple[str, dict[str, Any]]] = {}
    for entry in data.get("scale", {}).values():
        if code is not None and entry.get("code") != code:
            continue
        for n, e in entry["sizes"].items():
            if "build" in e and (int(n) not in out or entry["when"] >= out[int(n)][0]):
                out[int(n)] = (entry["when"], e)
    return {n: e for n, (_, e) in sorted(out.items())}


def summary_table(sizes: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'passages':>9} {'vectors':>9} {'build s':>8} {'peak MiB':>9} {'disk B/p':>9} {'RSS B/p':>8} "
             f"{'p50@1':>7} {'p99@1':>7} {'p50@16':>7} {'p99@16':>7} {'recall':>7}"]
    for n, e in sizes.items():
        if "build" not in e:
            lines.append(f"{n:>9} skipped: {e.get('skipped')}")
            continue
        lv = e["serving"]["levels"]
        one, six = lv.get("1", {}), lv.get("16", {})
        lines.append(f"{n:>9} {e['vectors_mode']:>9} {e['build']['wall_s']:8.1f} {e['build']['peak_rss_mib']:9.0f} "
                     f"{e['disk']['bytes_per_passage']:9.0f} {e['serving']['rss_per_passage_bytes']['rss']:8.0f} "
                     f"{one.get('p50_ms') or 0:7.1f} {one.get('p99_ms') or 0:7.1f} {six.get('p50_ms') or 0:7.1f} "
                     f"{six.get('p99_ms') or 0:7.1f} {e['recall'].get('recall') or 0:7.4f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
