"""``hybridrag`` command line: build, sync, eval, search, serve, query, ask, quickstart, bench NAME.

The edge of the program: only here (with :mod:`hybridrag.parser`, the arguments, and :mod:`hybridrag.commands`, one
module per family of subcommands) are arguments parsed, config files and the environment read, and logging set.
"""

from __future__ import annotations

import logging
import sys

from hybridrag.parser import build_parser
from index_builder.errors import HybridRagError

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not hasattr(args, "bench_args"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if hasattr(args, "bench_args"):  # a benchmark parses its own options
        args.bench_args = extra
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import bm25s  # noqa: F401  (it sets its own logger to DEBUG when imported: import first, then quieten)

    logging.getLogger("bm25s").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return args.func(args)
    except HybridRagError as e:
        print(f"hybridrag {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
