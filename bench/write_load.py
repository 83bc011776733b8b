"""The live index under a write load: what one small write costs as the write buffer grows, and the process's
memory over a stream of one-document writes with queries running.

Setup: the sample corpus (``data/sample/corpus.jsonl``) goes into a fresh document store and a snapshot built from
it, in a temporary folder. Then, in one process (the library the server runs, without the network):

1. memory: 2 reader threads send the sample queries in a closed loop (semantic cache on, invalidated by the writes
   as in the server) while ``--rss-writes`` upserts of one new document each are made; VmRSS (``/proc/self/status``)
   before and after, its peak (sampled every 0.25 s), and the bytes the buffer's arrays hold. ``--max-seconds``
   caps this phase (the writes done are reported);
2. latency: for each buffered-document count in ``--levels`` (the buffer is filled up to it with batches of 250),
   ``--samples`` upserts of one new document; p50 / p95 in ms. An upsert returns once the write is durable (SQLite,
   synchronous FULL) and searchable.

The written documents are the corpus's own texts under new ids (realistic lengths). ``--live-module FILE`` takes
``LiveIndex`` from another copy of ``retrieval/live/live_index.py`` (e.g. ``git show 11c4e1a:retrieval/live.py > /tmp/old.py``),
so the same run measures two versions of the write path over the same everything else.

Usage::

    python -m bench.write_load [--levels 0,250,500,1000,2000] [--samples 20] [--rss-writes 2000]
        [--max-seconds 150] [--live-module FILE] [--json results/bench.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import write_result

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "sample"


def vm_rss_mib(field: str = "VmRSS") -> float:
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _live_class(path: str | None):
    if not path:
        from retrieval.live.live_index import LiveIndex
        return LiveIndex
    spec = importlib.util.spec_from_file_location("bench_write_load_live", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.LiveIndex


def buffer_bytes(view) -> int:
    """The bytes of the numpy arrays the view's write buffer holds (either layout of retrieval/live/live_index.py)."""
    state = view.state
    if hasattr(state, "segments"):
        return int(sum(s.vectors.nbytes + s.tokens.nbytes + s.chunks.nbytes for s in state.segments))
    n = state.vectors.nbytes + state.chunks.nbytes + sum(t.nbytes for t in state.tokens)
    tokens = getattr(view, "buffer_tokens", None)
    return int(n + (tokens.nbytes if tokens is not None else 0))


class Setup:
    """A fresh store + snapshot of the sample corpus, its pipeline and live index."""

    def __init__(self, live_cls, config, embedder, docs) -> None:
        from index_builder.build import build_snapshot
        from retrieval.live.store import DocumentStore
        from retrieval.search.index import SearchIndex
        from retrieval.search.pipeline import Pipeline

        self.tmp = tempfile.TemporaryDirectory(prefix="hybridrag-bench-writes-")
        root = Path(self.tmp.name)
        self.store = DocumentStore(root / "store.db")
        self.store.upsert(docs)
        seq, stored = self.store.snapshot()
        build_snapshot(stored, root / "index", config.build_config(), embedder, covered_seq=seq)
        self.pipeline = Pipeline(SearchIndex.load(root / "index", config, embedder), embedder, config)
        self.live = live_cls(self.pipeline.index, self.store, embedder, self.pipeline.token_encoder, config)
        self.live.on_publish(self.pipeline.publish)
        if self.pipeline.cache is not None:
            self.live.on_write(self.pipeline.cache.invalidate_docs)

    def close(self) -> None:
        self.pipeline.close()
        self.live.close()
        self.store.close()
        self.tmp.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="0,250,500,1000,2000", help="buffered documents at which to time upserts")
    ap.add_argument("--samples", type=int, default=20, help="1-document upserts timed at each level")
    ap.add_argument("--rss-writes", type=int, default=2000)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=150.0, help="cap on the memory phase's writes")
    ap.add_argument("--live-module", help="a copy of retrieval/live/live_index.py to take LiveIndex from")
    ap.add_argument("--label", default="", help="names the run in the JSON (e.g. old / new)")
    ap.add_argument("--config")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from index_builder.corpus import read_corpus
    from index_builder.models import Embedder
    from index_builder.types import Document
    from retrieval.config import load_config
    from retrieval.evaluate import load_queries

    config = load_config(args.config)
    live_cls = _live_class(args.live_module)
    docs, _ = read_corpus(SAMPLE / "corpus.jsonl")
    queries = list(load_queries(SAMPLE).values())
    embedder = Embedder(config.embedder)
    counter = iter(range(10**9))

    def new_docs(n: int) -> list[Document]:
        out = []
        for _ in range(n):
            i = next(counter)
            d = docs[i % len(docs)]
            out.append(Document(id=f"wl-{i}", tenant=d.tenant, title=d.title, metadata=d.metadata,
                                text=f"{d.text} (written copy wl{i})"))
        return out

    result: dict[str, Any] = {"label": args.label, "live_module": args.live_module or "retrieval/live/live_index.py",
                              "corpus_docs": len(docs), "rebuild_threads": config.live.rebuild_threads}

    # 1. memory under a stream of 1-document writes, with readers
    s = Setup(live_cls, config, embedder, docs)
    try:
        for q in queries[:5]:
            s.pipeline.search(q, 10)
        for d in new_docs(5):  # warm-up: the write path's encoder exists before the first reading
            s.live.upsert([d])
        stop = threading.Event()
        errors: list[BaseException] = []
        reads = [0]
        peak = [vm_rss_mib()]

        def reader(r: int) -> None:
            i = r
            try:
                while not stop.is_set():
                    s.pipeline.search(queries[i % len(queries)], 10)
                    reads[0] += 1
                    i += args.readers
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        def sampler() -> None:
            while not stop.wait(0.25):
                peak[0] = max(peak[0], vm_rss_mib())

        threads = [threading.Thread(target=reader, args=(r,)) for r in range(args.readers)]
        threads.append(threading.Thread(target=sampler))
        rss_before = vm_rss_mib()
        for t in threads:
            t.start()
        lat: list[float] = []
        t_end = time.monotonic() + args.max_seconds
        try:
            for d in new_docs(args.rss_writes):
                if time.monotonic() > t_end:
                    break
                t = time.perf_counter()
                s.live.upsert([d])
                lat.append((time.perf_counter() - t) * 1000)
        finally:
            stop.set()
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
        rss_after = vm_rss_mib()
        view = s.live.view
        a = np.asarray(lat)
        result["memory"] = {
            "writes": len(lat), "writes_asked": args.rss_writes, "readers": args.readers, "queries": reads[0],
            "seconds": round(float(a.sum()) / 1000, 1), "buffered": int(view.buffered),
            "rss_before_mib": round(rss_before, 1), "rss_after_mib": round(rss_after, 1),
            "rss_peak_mib": round(peak[0], 1), "rss_growth_mib": round(rss_after - rss_before, 1),
            "buffer_array_mib": round(buffer_bytes(view) / 2**20, 1),
            "buffer_bytes_per_doc": round(buffer_bytes(view) / max(1, view.buffered)),
            "upsert_p50_ms": round(float(np.percentile(a, 50)), 1), "upsert_p95_ms": round(float(np.percentile(a, 95)), 1),
            "last_100_p50_ms": round(float(np.percentile(a[-100:], 50)), 1),
        }
        if hasattr(view.state, "segments"):
            result["memory"]["segments"] = len(view.state.segments)
    finally:
        s.close()
    m = result["memory"]
    print(f"memory: {m['writes']} one-document upserts ({m['seconds']} s) with {args.readers} readers "
          f"({m['queries']} queries): VmRSS {m['rss_before_mib']} -> {m['rss_after_mib']} MiB (peak "
          f"{m['rss_peak_mib']}), buffer arrays {m['buffer_array_mib']} MiB for {m['buffered']} documents",
          file=sys.stderr)

    # 2. latency of a 1-document upsert against the buffered-document count
    s = Setup(live_cls, config, embedder, docs)
    levels = [int(x) for x in args.levels.split(",") if x]
    rows = []
    try:
        for d in new_docs(3):
            s.live.upsert([d])
        for level in levels:
            while s.live.view.buffered < level:
                s.live.upsert(new_docs(min(250, level - s.live.view.buffered)))
            lat = []
            for d in new_docs(args.samples):
                t = time.perf_counter()
                s.live.upsert([d])
                lat.append((time.perf_counter() - t) * 1000)
            a = np.asarray(lat)
            rows.append({"buffered": level, "p50_ms": round(float(np.percentile(a, 50)), 1),
                         "p95_ms": round(float(np.percentile(a, 95)), 1), "n": len(lat)})
            print(f"  buffered {level:>5}: p50 {rows[-1]['p50_ms']:>8.1f} ms  p95 {rows[-1]['p95_ms']:>8.1f} ms",
                  file=sys.stderr)
    finally:
        s.close()
    result["upsert_latency"] = rows

    print(f"\n{'buffered docs':>13} | {'p50 ms':>8} | {'p95 ms':>8}")
    for r in rows:
        print(f"{r['buffered']:>13} | {r['p50_ms']:>8.1f} | {r['p95_ms']:>8.1f}")
    print(f"RSS: {m['rss_before_mib']} -> {m['rss_after_mib']} MiB (peak {m['rss_peak_mib']}) over {m['writes']} "
          f"one-document upserts with {args.readers} readers")
    if args.json:
        write_result(args.json, "write_load", {"label": args.label, "levels": args.levels, "samples": args.samples,
                                               "rss_writes": args.rss_writes, "readers": args.readers,
                                               "max_seconds": args.max_seconds}, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
