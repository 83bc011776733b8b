"""Out-of-domain query sets built from a BEIR dataset's own judgments: the check that the cascade's defaults travel
to a task type they were not tuned on (issue #23). ``doc-query``: a judged document becomes the query, the other
documents judged relevant to the same original query its relevant documents
(:func:`retrieval.evaluate.doc_queries`). The result is a BEIR folder (``queries.jsonl``, ``qrels/<split>.tsv``,
the corpus linked, ``ood.json``) that ``hybridrag eval`` and ``bench.studies.cascade_robustness`` take as it is.

Usage::

    python -m bench.studies.ood --dataset ../shared/data/beir/nfcorpus --split dev --out /tmp/nfcorpus-docq-dev
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from retrieval.evaluate import OOD_KINDS, build_ood_set


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.studies.ood", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True, type=Path)
    p.add_argument("--split", default="test")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--kind", default="doc-query", choices=OOD_KINDS)
    p.add_argument("--max-queries", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    info = build_ood_set(args.dataset, args.split, args.out, kind=args.kind, max_queries=args.max_queries,
                         seed=args.seed)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
