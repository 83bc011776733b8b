"""The live index under writes: query latency while a rebuild runs against idle (same run), write throughput (one
document per call against batches) and the time from a write to its visibility, the cost of one small write as the
write buffer grows, and the process's memory over a stream of one-document writes with queries running.

Setup: the first ``--docs`` documents of ``--corpus`` (default the sample corpus) go into a fresh document store and
a snapshot built from it, in a temporary folder; the pipeline is opened over it as the server opens it
(``retrieval.app.open_pipeline``) and a live index (``LiveIndex``, or ``--live-module``'s) goes over the pipeline's
index, publishing its views to it and invalidating the semantic cache on writes, as the server wires them. Then,
in one process (the library the server runs, without the network), the parts asked for (``--parts``):

- ``rebuild``: C callers (threads) send the dataset's queries (cache bypassed) in a closed loop for ``--duration`` s
  while idle, then the same while ``LiveIndex.rebuild`` runs in a background thread (as the server's auto-rebuild
  does), until it has swapped the new generation in;
- ``writes`` (after ``rebuild``, same setup): for ``--duration`` s each, upserts of 1 new document per call, then
  of ``--batch`` per call; an upsert returns once the write is durable (SQLite, synchronous FULL) *and* searchable,
  so its latency is the time from write to visible; a query for the new document right after the acknowledgement
  confirms it; and commits of the store alone;
- ``buffer`` (fresh setup): for each buffered-document count in ``--levels`` (the buffer is filled up to it with
  batches of 250), ``--samples`` upserts of one new document; p50 / p95 in ms;
- ``memory`` (fresh setup): ``--readers`` threads send the queries in a closed loop (semantic cache on, invalidated
  by the writes) while ``--rss-writes`` upserts of one new document each are made; VmRSS before and after, its peak
  (sampled every 0.25 s), and the bytes the buffer's arrays hold. ``--max-seconds`` caps this part.

``buffer`` and ``memory`` write the corpus's own texts under new ids (realistic lengths). ``--live-module FILE``
takes ``LiveIndex`` from another copy of ``retrieval/live/live_index.py`` (``git show REV:retrieval/live/live_index.py
> /tmp/old.py``), so the same run measures two versions of the write path over the same everything else. Usage::

    python -m bench.live --corpus ../shared/data/beir/scifact --docs 1000 [--concurrency 4] [--duration 20]
    python -m bench.live --parts buffer,memory [--levels 0,250,500,1000,2000] [--rss-writes 2000] [--live-module F]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.harness import names, percentiles, ratio, write_result
from bench.harness.loadgen import closed_loop_threads, for_seconds
from bench.harness.stats import RssSampler, ms_since, vm_rss_mib

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "sample"
PARTS = ("rebuild", "writes", "buffer", "memory")


def live_class(path: str | None) -> Any:
    if not path:
        from retrieval.live.live_index import LiveIndex
        return LiveIndex
    spec = importlib.util.spec_from_file_location("bench_live_module", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.LiveIndex


def buffer_bytes(view: Any) -> int:
    """The bytes of the numpy arrays the view's write buffer holds (either layout of retrieval/live/live_index.py)."""
    state = view.state
    if hasattr(state, "segments"):
        return int(sum(s.vectors.nbytes + s.tokens.nbytes + s.chunks.nbytes for s in state.segments))
    n = state.vectors.nbytes + state.chunks.nbytes + sum(t.nbytes for t in state.tokens)
    tokens = getattr(view, "buffer_tokens", None)
    return int(n + (tokens.nbytes if tokens is not None else 0))


class Setup:
    """A fresh store + snapshot of ``docs``, the pipeline over it and the live index, wired as the server wires
    them."""

    def __init__(self, live_cls: Any, config: Any, docs: list[Any]) -> None:
        from index_builder.build.builder import build_snapshot
        from index_builder.models.encoders import Embedder
        from retrieval.app import open_pipeline
        from retrieval.live.store import DocumentStore

        self.tmp = tempfile.TemporaryDirectory(prefix="hybridrag-bench-live-")
        root = Path(self.tmp.name)
        self.store = DocumentStore(root / "store.db")
        for s in range(0, len(docs), 1000):
            self.store.upsert(docs[s:s + 1000])
        seq, stored = self.store.snapshot()
        t = time.perf_counter()
        build_snapshot(stored, root / "index", config.build_config(), Embedder(config.embedder), covered_seq=seq)
        self.build_s = round(time.perf_counter() - t, 1)
        self.documents = len(stored)
        self.pipeline = open_pipeline(root / "index", config)
        self.live = live_cls(self.pipeline.index, self.store, self.pipeline.embedder, self.pipeline.token_encoder,
                             config)
        self.live.on_publish(self.pipeline.publish)
        if self.pipeline.cache is not None:
            self.live.on_write(self.pipeline.cache.invalidate_docs)

    def close(self) -> None:
        self.pipeline.close()
        self.live.close()
        self.store.close()
        self.tmp.cleanup()


def rebuild_part(s: Setup, queries: list[str], args: argparse.Namespace) -> dict[str, Any]:
    from index_builder.types import Document

    def search(q: str) -> Any:
        return s.pipeline.search(q, 10, use_cache=False)

    for q in queries[:10]:
        search(q)
    idle = closed_loop_threads(search, queries, args.concurrency, for_seconds(args.duration))
    s.live.upsert([Document(id="bench-live-0", text="a write so the rebuild has something to cover", tenant="")])
    done = threading.Event()
    rebuild_s: list[float] = []

    def rebuild() -> None:
        t0 = time.perf_counter()
        s.live.rebuild()
        rebuild_s.append(time.perf_counter() - t0)
        done.set()

    threading.Thread(target=rebuild, daemon=True).start()
    during = closed_loop_threads(search, queries, args.concurrency, done.is_set)
    out: dict[str, Any] = {"idle": percentiles(idle), "during_rebuild": percentiles(during),
                           "rebuild_s": round(rebuild_s[0], 1)}
    out["p99_ratio"] = ratio(out["during_rebuild"]["p99_ms"], out["idle"]["p99_ms"], 2)
    out["p50_ratio"] = ratio(out["during_rebuild"]["p50_ms"], out["idle"]["p50_ms"], 2)
    print(f"queries idle: {out['idle']}; during a rebuild ({out['rebuild_s']} s): {out['during_rebuild']}; "
          f"p99 ratio {out['p99_ratio']}", file=sys.stderr)
    return out


def writes_part(s: Setup, args: argparse.Namespace) -> dict[str, Any]:
    from index_builder.types import Document

    writes: dict[str, Any] = {}
    n = 0
    for size in (1, args.batch):
        lat, count = [], 0
        until = for_seconds(args.duration)
        while not until():
            batch = [Document(id=f"w{n + j}", tenant="", text=f"written note zq{n + j} about item {n + j}")
                     for j in range(size)]
            t = time.perf_counter()
            s.live.upsert(batch)
            lat.append(ms_since(t))
            res = s.pipeline.search(f"zq{n}", 5, stages=["bm25"], use_cache=False)
            assert res.index.documents[res.hits.doc[0]].id == f"w{n}", "a write was not visible after its ack"
            n += size
            count += size
        writes[f"batch_{size}"] = {"docs_per_s": round(count / (sum(lat) / 1000), 1), "ack_visible": percentiles(lat)}
        print(f"writes, {size} per call: {writes[f'batch_{size}']}", file=sys.stderr)
    t = time.perf_counter()
    for i in range(50):
        s.store.upsert([Document(id=f"s{i}", tenant="", text="store only")])
    writes["store_only_commits_per_s"] = round(50 / (time.perf_counter() - t), 1)
    print(f"store alone (SQLite WAL, synchronous FULL): {writes['store_only_commits_per_s']} commits/s",
          file=sys.stderr)
    return writes


def copies(docs: list[Any]) -> Any:
    """New documents: the corpus's own texts under new ids, endlessly."""
    from index_builder.types import Document

    for i in itertools.count():
        d = docs[i % len(docs)]
        yield Document(id=f"wl-{i}", tenant=d.tenant, title=d.title, metadata=d.metadata,
                       text=f"{d.text} (written copy wl{i})")


def memory_part(s: Setup, queries: list[str], new_docs: Any, args: argparse.Namespace) -> dict[str, Any]:
    for q in queries[:5]:
        s.pipeline.search(q, 10)
    for _ in range(5):  # warm-up: the write path's encoder exists before the first reading
        s.live.upsert([next(new_docs)])
    stop = threading.Event()
    reads: list[int] = []
    readers = threading.Thread(target=lambda: reads.append(len(closed_loop_threads(
        lambda q: s.pipeline.search(q, 10), queries, args.readers, stop.is_set))))
    rss_before = vm_rss_mib()
    sampler = RssSampler().start()
    readers.start()
    lat: list[float] = []
    until = for_seconds(args.max_seconds)
    try:
        for _ in range(args.rss_writes):
            if until():
                break
            d = next(new_docs)
            t = time.perf_counter()
            s.live.upsert([d])
            lat.append(ms_since(t))
    finally:
        stop.set()
        readers.join()
        peak = sampler.stop()
    rss_after = vm_rss_mib()
    view = s.live.view
    p, last = percentiles(lat, 1), percentiles(lat[-100:], 1)
    out = {"writes": len(lat), "writes_asked": args.rss_writes, "readers": args.readers, "queries": reads[0] if reads else 0,
           "seconds": round(sum(lat) / 1000, 1), "buffered": int(view.buffered),
           "rss_before_mib": round(rss_before, 1), "rss_after_mib": round(rss_after, 1), "rss_peak_mib": peak,
           "rss_growth_mib": round(rss_after - rss_before, 1), "buffer_array_mib": round(buffer_bytes(view) / 2**20, 1),
           "buffer_bytes_per_doc": round(buffer_bytes(view) / max(1, view.buffered)),
           "upsert_p50_ms": p["p50_ms"], "upsert_p95_ms": p["p95_ms"], "last_100_p50_ms": last["p50_ms"]}
    if hasattr(view.state, "segments"):
        out["segments"] = len(view.state.segments)
    print(f"memory: {out['writes']} one-document upserts ({out['seconds']} s) with {args.readers} readers "
          f"({out['queries']} queries): VmRSS {out['rss_before_mib']} -> {out['rss_after_mib']} MiB (peak "
          f"{out['rss_peak_mib']}), buffer arrays {out['buffer_array_mib']} MiB for {out['buffered']} documents",
          file=sys.stderr)
    return out


def buffer_part(s: Setup, new_docs: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for _ in range(3):
        s.live.upsert([next(new_docs)])
    for level in [int(x) for x in args.levels.split(",") if x]:
        while s.live.view.buffered < level:
            s.live.upsert([next(new_docs) for _ in range(min(250, level - s.live.view.buffered))])
        lat = []
        for _ in range(args.samples):
            d = next(new_docs)
            t = time.perf_counter()
            s.live.upsert([d])
            lat.append(ms_since(t))
        rows.append({"buffered": level, **percentiles(lat, 1)})
        print(f"  buffered {level:>5}: p50 {rows[-1]['p50_ms']:>8.1f} ms  p95 {rows[-1]['p95_ms']:>8.1f} ms",
              file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.live", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(SAMPLE), help="BEIR folder (its corpus and queries)")
    ap.add_argument("--docs", type=int, default=1000, help="the first N documents of the corpus")
    ap.add_argument("--parts", default="rebuild,writes", help=f"comma-separated of {', '.join(PARTS)}")
    ap.add_argument("--concurrency", type=int, default=4, help="rebuild: query callers")
    ap.add_argument("--duration", type=float, default=20.0, help="rebuild: seconds idle; writes: seconds per size")
    ap.add_argument("--batch", type=int, default=16, help="writes: the batched upsert's size")
    ap.add_argument("--levels", default="0,250,500,1000,2000", help="buffer: buffered documents at which to time upserts")
    ap.add_argument("--samples", type=int, default=20, help="buffer: 1-document upserts timed at each level")
    ap.add_argument("--rss-writes", type=int, default=2000, help="memory: 1-document upserts")
    ap.add_argument("--readers", type=int, default=2, help="memory: query threads beside the writes")
    ap.add_argument("--max-seconds", type=float, default=150.0, help="memory: cap on the writes' time")
    ap.add_argument("--live-module", help="a copy of retrieval/live/live_index.py to take LiveIndex from")
    ap.add_argument("--label", default="", help="names the run in the JSON (e.g. old / new)")
    ap.add_argument("--config")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    parts = names(args.parts)
    if not parts or set(parts) - set(PARTS):
        ap.error(f"--parts: choose from {', '.join(PARTS)}")

    from index_builder.documents.corpus import read_corpus
    from retrieval.config import load_config
    from retrieval.evaluate import load_queries

    config = load_config(args.config)
    live_cls = live_class(args.live_module)
    docs = read_corpus(args.corpus)[0][: args.docs]
    queries = list(load_queries(Path(args.corpus)).values())[:200]
    new_docs = copies(docs)
    result: dict[str, Any] = {"label": args.label, "live_module": args.live_module or "retrieval/live/live_index.py",
                              "corpus": Path(args.corpus).name, "concurrency": args.concurrency,
                              "rebuild_threads": config.live.rebuild_threads}
    groups = [g for g in (("rebuild", "writes"), ("buffer",), ("memory",)) if set(g) & set(parts)]
    for group in groups:
        s = Setup(live_cls, config, docs)
        result["documents"] = s.documents
        print(f"built {s.documents} documents in {s.build_s} s", file=sys.stderr)
        try:
            if "rebuild" in parts and "rebuild" in group:
                result.update(rebuild_part(s, queries, args))
            if "writes" in parts and "writes" in group:
                result["writes"] = writes_part(s, args)
            if "buffer" in group:
                result["upsert_latency"] = buffer_part(s, new_docs, args)
            if "memory" in group:
                result["memory"] = memory_part(s, queries, new_docs, args)
        finally:
            s.close()
    for r in result.get("upsert_latency", []):
        print(f"buffered {r['buffered']:>6}: upsert p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms")
    if args.json:
        write_result(args.json, "live", {k: v for k, v in vars(args).items() if k != "json"}, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
