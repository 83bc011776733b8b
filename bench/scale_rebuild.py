"""The scale bench's rebuilds (:mod:`bench.scale`): ``--rebuild-writes N`` after a size's build (N documents
edited, the product's build run again into the same index: only they are embedded), and ``--rebuild-indexes``
over kept indexes (each build's time, peaks and memory per step, and the growth per passage between sizes); kept
apart from the size runs as recall (:mod:`bench.scale_recall`) and quality (:mod:`bench.scale_quality`) are. The
builds run through :func:`bench.scale.run_build`, passed in (a child process measured alone)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from index_builder.snapshot.format import current_snapshot_dir


def measure_rebuild(corpus: Path, index: Path, args: argparse.Namespace, log_dir: Path,
                    run_build: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """``--rebuild-writes N``: N documents of the corpus edited (a sentence appended, as a user's edit), then the
    product's build run again into the same index: only the edited passages are embedded (``cached`` vectors:
    the real model on every miss), the rest reused from the snapshot by chunk key; the index structures rebuilt."""
    edited = log_dir / f"edited-{index.name}.jsonl"
    nonce = time.time_ns()  # a text no earlier run recorded: the edits are embedded by the model, not the cache
    n = 0
    with open(corpus) as src, open(edited, "w") as dst:
        for line in src:
            if n < args.rebuild_writes:
                row = json.loads(line)
                row["text"] += f" Edited for the rebuild bench, revision {nonce}."
                line = json.dumps(row) + "\n"
            n += 1
            dst.write(line)
    out = run_build(edited, index, "cached", args, [Path(args.vectors_dir) / "debian"], log_dir, fresh=False)
    out["writes"] = min(args.rebuild_writes, n)
    print(f"  rebuilt after {out['writes']} writes in {out['wall_s']} s: {out.get('embedded')} passages embedded, "
          f"{out.get('reused')} reused; {out['timings']}", file=sys.stderr)
    return out


def rebuild_kept(args: argparse.Namespace, log_dir: Path, run_build: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """``--rebuild-indexes A,B``: each kept index rebuilt from its corpus with ``--rebuild-writes`` documents
    edited (:func:`measure_rebuild`): the build's time, split and peak memory (anonymous and file-backed) at each
    size, by the code as it is, with nothing but the edits embedded. The peaks' growth per passage between sizes is
    what the build holds per passage."""
    from bench.scale_corpus import ensure_corpus

    out: dict[str, Any] = {}
    for index in [Path(p) for p in args.rebuild_indexes.split(",") if p]:
        manifest = json.loads((current_snapshot_dir(index) / "manifest.json").read_text())
        size = int(manifest["counts"]["documents"])
        corpus, _ = ensure_corpus(Path(args.corpus_dir), size, args.seed)
        print(f"size {size}: {index}", file=sys.stderr)
        entry = measure_rebuild(corpus, index, args, log_dir, run_build)
        entry["passages"] = size
        print(f"  peak RSS {entry['peak_rss_mib']} MiB (anonymous {entry['peak_anon_mib']}, file-backed "
              f"{entry['peak_file_mib']}); anonymous as the assembly's steps end {entry.get('anon_mib_at')}",
              file=sys.stderr)
        out[str(size)] = entry
    sizes = sorted(int(n) for n in out)
    for a, b in zip(sizes, sizes[1:], strict=False):
        ea, eb = out[str(a)], out[str(b)]
        eb["anon_growth_per_passage_bytes"] = round((eb["peak_anon_mib"] - ea["peak_anon_mib"]) * 2**20 / (b - a), 1)
        at_a, at_b = ea.get("anon_mib_at") or {}, eb.get("anon_mib_at") or {}
        eb["held_growth_per_passage_bytes"] = {k: round((at_b[k] - at_a[k]) * 2**20 / (b - a), 1)
                                               for k in at_b if k in at_a}
    return out
