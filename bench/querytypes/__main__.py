"""``python -m bench.querytypes --out DIR [--seed 0]``: write the query-type suite (see :mod:`bench.querytypes`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.querytypes.common import write_suite

BEIR = Path("/work/shared/data/beir")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.querytypes", description=__doc__)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parts", default="debdocs,scifact,nfcorpus", help="comma-separated folders to write")
    p.add_argument("--beir", type=Path, default=BEIR, help="where the BEIR datasets are")
    p.add_argument("--docs", type=int, default=2500, help="debdocs: documents")
    p.add_argument("--max-chars", type=int, default=2000, help="debdocs: a document's characters at most")
    p.add_argument("--per-type", type=int, default=400, help="queries per type at most (both halves)")
    p.add_argument("--man-root", default="/usr/share/man", help="'' for none")
    p.add_argument("--doc-root", default="/usr/share/doc", help="'' for none")
    p.add_argument("--all-packages", action="store_true", help="debdocs: also files of packages no Debian archive "
                                                               "has (default: left out where dpkg and apt are here)")
    args = p.parse_args(argv)
    report = {}
    for part in args.parts.split(","):
        t0 = time.perf_counter()
        if part == "debdocs":
            from bench.querytypes.debdocs import generate

            rows, queries, qrels, groups, info = generate(
                args.docs, args.seed, n_identifiers=args.per_type, n_phrases=args.per_type,
                max_chars=args.max_chars, man_root=Path(args.man_root) if args.man_root else None,
                doc_root=Path(args.doc_root) if args.doc_root else None, debian_only=not args.all_packages)
            summary = write_suite(args.out / part, queries, qrels, args.seed, corpus_rows=rows, info=info,
                                  groups=groups)
        else:
            from bench.querytypes.beir import generate as beir_generate

            corpus, queries, qrels, groups, info = beir_generate(args.beir / part, args.seed, per_type=args.per_type)
            summary = write_suite(args.out / part, queries, qrels, args.seed, corpus=corpus, info=info,
                                  groups=groups)
        summary["seconds"] = round(time.perf_counter() - t0, 1)
        (args.out / part / "suite.json").write_text(json.dumps(summary, indent=1) + "\n")
        report[part] = summary
        print(json.dumps({part: summary}), file=sys.stderr)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
