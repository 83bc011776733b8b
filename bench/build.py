"""The build against its floor, the encoder alone, on the same passages in the same run (issue 41: the build's
throughput at or above 0.9x the encoder's own), then a rebuild after writes (a small fraction of a full build).

1. **encoder**: the corpus chunked (not timed), then ``Embedder.encode`` over every passage in groups of
   ``build.embed_batch``, with the token vectors (the same pass): the model alone, what the build cannot avoid.
   Storing the token vectors (pooling and coding them, ``[late_interaction] storage``) is the build's cost.
2. **build**: ``build_snapshot`` from the same corpus into an empty folder (its own chunking, BM25, checkpoints,
   HNSW, the snapshot's arrays, checksums): passages/s and the ratio to (1); peak RSS of the build process.
3. **rebuild**: ``--changed N`` documents edited, then ``build_snapshot`` into the same folder: only those are
   embedded; its time as a fraction of (2).

Run each in its own process (a fresh Python, so peak RSS is the build's). Usage::

    python -m bench.build --corpus ../shared/data/beir/scifact [--limit 2000] [--changed 100] [--json F]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import machine, ratio, write_result


def _encoder_alone(corpus: str, limit: int) -> dict[str, Any]:
    from index_builder.documents.chunking import Chunker, chunk_passages
    from index_builder.documents.corpus import read_corpus
    from index_builder.models.encoders import Embedder
    from retrieval.config import load_config

    config = load_config().build_config()
    docs, _ = read_corpus(corpus)
    docs = docs[:limit] if limit else docs
    embedder = Embedder(config.embedder)
    passages = chunk_passages(docs, Chunker(embedder.files.tokenizer_path, config.chunking).chunk(docs))
    step = config.embed_batch
    t = time.perf_counter()
    for a in range(0, len(passages), step):
        embedder.encode(passages[a:a + step], with_tokens=config.token_vectors)
    seconds = time.perf_counter() - t
    return {"passages": len(passages), "seconds": round(seconds, 2),
            "passages_per_s": round(len(passages) / seconds, 1)}


def _build(corpus: str, limit: int, out: str, changed: int) -> dict[str, Any]:
    import resource

    from index_builder.build.builder import build_snapshot
    from index_builder.documents.corpus import read_corpus
    from index_builder.models.encoders import Embedder
    from retrieval.config import load_config

    config = load_config().build_config()
    docs, _ = read_corpus(corpus)
    docs = docs[:limit] if limit else docs
    if changed:
        docs = [dataclasses.replace(d, text=d.text + " (edited)") if i < changed else d for i, d in enumerate(docs)]
    embedder = Embedder(config.embedder)  # loaded before the clock starts, as for the encoder alone
    s = build_snapshot(docs, Path(out), config, embedder, total=len(docs))
    return {"documents": s.documents, "chunks": s.chunks, "seconds": round(s.seconds, 2),
            "passages_per_s": round(s.chunks / s.seconds, 1), "embedded": s.embedded, "reused": s.reused,
            "timings": {k: round(v, 2) for k, v in s.timings.items()}, "bytes": s.bytes_on_disk,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def _child(what: str, **kwargs: Any) -> dict[str, Any]:
    """Run one part in a fresh process; its JSON answer on stdout's last line."""
    cmd = [sys.executable, "-m", "bench.build", "--part", what, "--kwargs", json.dumps(kwargs)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode:
        raise RuntimeError(f"{what} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", help="JSONL corpus or BEIR folder")
    ap.add_argument("--limit", type=int, default=0, help="the first N documents only")
    ap.add_argument("--changed", type=int, default=0, help="then edit N documents and rebuild into the same folder")
    ap.add_argument("--json", help="merge the result into this JSON file")
    ap.add_argument("--part", help=argparse.SUPPRESS)
    ap.add_argument("--kwargs", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.part:  # a child: one part, its answer as JSON
        kwargs = json.loads(args.kwargs)
        print(json.dumps(_encoder_alone(**kwargs) if args.part == "encoder" else _build(**kwargs)))
        return 0
    if not args.corpus:
        ap.error("--corpus is required")
    with tempfile.TemporaryDirectory(prefix="hybridrag-bench-build-") as tmp:
        encoder = _child("encoder", corpus=args.corpus, limit=args.limit)
        build = _child("build", corpus=args.corpus, limit=args.limit, out=tmp + "/idx", changed=0)
        out: dict[str, Any] = {"encoder": encoder, "build": build,
                               "build_over_encoder": ratio(build["passages_per_s"], encoder["passages_per_s"])}
        if args.changed:
            rebuild = _child("build", corpus=args.corpus, limit=args.limit, out=tmp + "/idx", changed=args.changed)
            out["rebuild"] = rebuild
            out["rebuild_over_build"] = ratio(rebuild["seconds"], build["seconds"])
    print(f"encoder alone {encoder['passages_per_s']} passages/s; build {build['passages_per_s']} passages/s "
          f"(x{out['build_over_encoder']} of the encoder's), {build['seconds']} s, peak RSS {build['peak_rss_mib']} MiB"
          + (f"; rebuild after {args.changed} edits {out['rebuild']['seconds']} s (x{out['rebuild_over_build']} of "
             f"the build, {out['rebuild']['embedded']} passages embedded)" if args.changed else ""))
    if args.json:
        write_result(args.json, "build", {"corpus": Path(args.corpus).name, "limit": args.limit,
                                          "changed": args.changed, "machine": machine()["cpu"]}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
