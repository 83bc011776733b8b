"""What the build's BM25 costs in memory (issue 41: a build whose peak does not grow with the corpus beyond the index
structures): the first N passages of a corpus analysed and added to :class:`index_builder.snapshot.bm25_files.BM25Builder`
as a build adds them, then ``finish`` (scoring into the CSC matrix) traced by ``tracemalloc``: the postings held
before it (the floor: what the build keeps per passage anyway) and the peak during it, per posting and per
passage, its time, and the size of the matrix it makes. Usage::

    python -m bench.studies.bm25_build_memory --corpus /work/data/scale/corpus-1000000.jsonl --passages 1000000
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.harness import ratio, write_result


def measure(corpus: str, passages: int, batch: int = 2048, spill: str = "") -> dict[str, Any]:
    from index_builder.documents.analysis import Analyzer
    from index_builder.settings import AnalyzerConfig
    from index_builder.snapshot import bm25_files as bm25_build
    from index_builder.snapshot.bm25_files import BM25Builder

    analyzer = Analyzer(AnalyzerConfig())
    t = time.perf_counter()
    batches, buf = [], []
    with open(corpus, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if passages and i >= passages:
                break
            d = json.loads(line)
            buf.append(f"{d.get('title') or ''} {d['text']}")
            if len(buf) == batch:
                batches.append(analyzer.batch(buf))
                buf = []
    if buf:
        batches.append(analyzer.batch(buf))
    n = sum(len(b) for b in batches)
    analyse_s = time.perf_counter() - t
    gc.collect()
    tracemalloc.start()
    builder = BM25Builder(spill=Path(spill) / "postings" if spill else None)
    for terms in batches:
        builder.add(terms)
    postings = builder.postings
    gc.collect()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    t = time.perf_counter()
    if spill:  # the build's way: postings on disk, the matrix written a range of terms at a time
        builder.write(Path(spill) / "bm25", 0.9, 0.4)
        matrix = sum((Path(spill) / "bm25" / bm25_build.FILES[k]).stat().st_size for k in ("data", "indices", "indptr"))
    else:
        bm = builder.finish(0.9, 0.4)
        matrix = sum(bm.scores[k].nbytes for k in ("data", "indices", "indptr"))
    finish_s = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"passages": n, "postings": postings, "analyse_s": round(analyse_s, 1), "finish_s": round(finish_s, 2),
            "held_mib": round(held / 2**20, 1), "finish_peak_mib": round(peak / 2**20, 1),
            "matrix_mib": round(matrix / 2**20, 1),
            "peak_bytes_per_posting": round(peak / max(postings, 1), 1),
            "peak_bytes_per_passage": round(peak / max(n, 1)),
            "held_bytes_per_passage": round(held / max(n, 1)),
            "peak_over_held": ratio(peak, held)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.studies.bm25_build_memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="JSONL passages (title, text): a scale corpus")
    ap.add_argument("--passages", type=int, default=100_000, help="the first N (0: all)")
    ap.add_argument("--spill", default="", help="a scratch folder: postings spilled there and the index written as "
                                                "a build does (BM25Builder.write); default: held in memory")
    ap.add_argument("--json", default="results/scale/bm25-build-memory.json")
    args = ap.parse_args(argv)
    out = measure(args.corpus, args.passages, spill=args.spill)
    print(f"{out['passages']} passages, {out['postings']} postings: held {out['held_mib']} MiB, finish peak "
          f"{out['finish_peak_mib']} MiB ({out['peak_bytes_per_posting']} B a posting, "
          f"{out['peak_bytes_per_passage']} B a passage), {out['finish_s']} s", file=sys.stderr)
    write_result(args.json, "bm25_build_memory", vars(args), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
