"""``bench`` and ``train``: the repository's packages (never in the wheel), found in a checkout, or one line saying
what to install."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHECKOUT_ONLY = ("the wheel ships the service (index_builder, rerank, retrieval, hybridrag); bench/ and training/ "
                 "live in the repository: clone it and run 'bash scripts/setup.sh --bench' there (pip install -e "
                 "'.[bench]')")


def checkout_only(name: str, what: str) -> Callable[[Any], None]:
    """The subcommand ``name`` where its package (``bench``, ``training``) is not installed (a wheel, not the
    checkout's editable install): it takes any arguments and says, in one line, what to install."""

    def add(sub: Any) -> None:
        p = sub.add_parser(name, add_help=False, help=f"{what} (needs the repository checkout)")
        p.set_defaults(func=cmd_checkout_only, verbose=False, bench_args=[])

    return add


def cmd_checkout_only(args: argparse.Namespace) -> int:
    print(f"hybridrag {args.command}: needs the repository checkout: {CHECKOUT_ONLY}", file=sys.stderr)
    return 2


def checkout_module(name: str) -> Any:
    """``bench`` or ``training`` (the repository's, never in the wheel), imported; None outside a checkout. An
    editable install maps only the product's packages, so when the import fails the checkout is looked for where
    this package lives: its root holds them (as the reader processes and the Ray runtime find it)."""
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:  # it is there, and something it imports is missing: say so as it is
            raise
    root = Path(__file__).resolve().parents[2]
    if not (root / name / "__init__.py").is_file():
        return None
    sys.path.append(str(root))
    return importlib.import_module(name)


def cmd_bench(args: argparse.Namespace) -> int:
    """A benchmark or tuning study (``bench.SCRIPTS``): its own options follow ``bench NAME``."""
    import importlib

    from bench import SCRIPTS

    module = importlib.import_module(SCRIPTS[args.bench_command][0])
    if args.bench_command == "load":
        return module.main(args.bench_args, prog="hybridrag bench load")
    return module.main(args.bench_args)
