"""Server configurations side by side under load, one after the other in one run (issue #26; the backends too).

Runs ``bench.load`` (closed loop, gRPC, each with its compute floor) once per ``--config`` (the first is the
reference: the default path) and reports each configuration's p50 at every level and QPS as ratios of the
reference's from the same run: the issue's targets are the full cascade's p50 at one caller <= 2x the default's
and its QPS at 16 callers >= 0.4x. ``--front NAME=LIMIT`` measures NAME through ``hybridrag front``. Options this
script does not know go to ``bench.load`` as they are (e.g. ``--client-procs 4``, ``--limit 40``).
:func:`run_configs` is the same loop for other scripts (``bench.backends``). Usage::

    python -m bench.cascade_load --index indexes/scifact --dataset ../shared/data/beir/scifact \\
        --config default= --config cascade=bench/configs/cascade-fast.toml --json results/cascade-load.json
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import write_result
from bench.harness.loadgen import vs_reference


@dataclass(frozen=True)
class Run:
    """One configuration to measure: its name, server TOML ("" = the defaults), the front's limit (0 = direct),
    and extra ``bench.load`` options."""

    name: str
    toml: str = ""
    front: int = 0
    options: tuple[str, ...] = ()


def measure_config(index: str, dataset: str, run: Run, load_options: Sequence[str]) -> dict[str, Any]:
    """``bench.load`` on one configuration (no baseline, no JSON): what the side-by-side reports of it."""
    from bench import load

    argv = ["--index", index, "--dataset", dataset, "--no-baseline", *load_options, *run.options]
    if run.toml:
        argv += ["--config", run.toml]
    if run.front:
        argv += ["--front", str(run.front)]
    entry = load.measure(load.build_parser().parse_args(argv))
    return {"config_file": run.toml, "front": run.front, "closed_loop": entry["closed_loop"], "floor": entry["floor"],
            "ndcg@10": entry["ndcg@10"], "server": entry["server"]}


def run_configs(index: str, dataset: str, runs: Sequence[Run], load_options: Sequence[str],
                around: Callable[[Run], Any] | None = None) -> dict[str, dict[str, Any]]:
    """Each run measured in turn, then each one's closed-loop levels against the first's (``vs_reference``).
    ``around(run)``: a context manager entered around a run's measurement (a process it needs, e.g. an engine)."""
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        print(f"== {run.name} ({run.toml or 'defaults'}{f', front {run.front}' if run.front else ''})",
              file=sys.stderr)
        with around(run) if around else contextlib.nullcontext():
            out[run.name] = measure_config(index, dataset, run, load_options)
    ref = out[runs[0].name]["closed_loop"]
    for r in out.values():
        r["vs_reference"] = vs_reference(ref, r["closed_loop"])
    return out


def parse_runs(configs: list[str], fronts: list[str]) -> list[Run]:
    """``NAME=TOML`` configurations and ``NAME=LIMIT`` fronts; a front of a new name runs the first
    configuration's server behind the front.

    >>> [(r.name, r.toml, r.front) for r in parse_runs(["a=", "b=x.toml"], ["b=8", "c=4"])]
    [('a', '', 0), ('b', 'x.toml', 8), ('c', '', 4)]
    """
    limits = {name: int(limit or 0) for name, _, limit in (f.partition("=") for f in fronts)}
    runs = [Run(name, toml, limits.get(name, 0)) for name, _, toml in (c.partition("=") for c in configs)]
    known = {r.name for r in runs}
    runs += [Run(name, runs[0].toml, limit) for name, limit in limits.items() if name not in known]
    return runs


def print_ratios(runs: dict[str, dict[str, Any]], ref_name: str) -> None:
    print(f"\nagainst {ref_name}, same run:")
    for name, run in runs.items():
        for c, r in run["vs_reference"].items():
            e = run["closed_loop"][c]
            print(f"{name:12} C={c:<3} QPS {e['qps']:7.1f} p50 {e['p50_ms']:7.1f} ms  p50 x{r['p50_ratio']}  "
                  f"QPS x{r['qps_ratio']}  p50/floor {e.get('p50_over_floor')}  nDCG@10 {run['ndcg@10']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cascade_load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--config", action="append", required=True, metavar="NAME=TOML",
                    help="a named server configuration (repeatable; the first is the reference; NAME= alone: defaults)")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--floor-queries", type=int, default=300)
    ap.add_argument("--front", action="append", default=[], metavar="NAME=LIMIT",
                    help="measure the configuration NAME through `hybridrag front` (nginx) at LIMIT reads in flight "
                         "(bench.load --front); NAME may name a --config or a new run of the first's server config")
    ap.add_argument("--json", required=True)
    args, extra = ap.parse_known_args(argv)
    runs = parse_runs(args.config, args.front)
    options = ["--concurrency", args.concurrency, "--duration", str(args.duration), "--warmup", str(args.warmup),
               "--floor-queries", str(args.floor_queries), *extra]
    from bench.load import LoadError

    try:
        measured = run_configs(args.index, args.dataset, runs, options)
    except LoadError as e:
        print(f"bench.cascade_load: {e}", file=sys.stderr)
        return 2
    print_ratios(measured, runs[0].name)
    write_result(args.json, "cascade_load", {"dataset": Path(args.dataset).name, "configs": args.config,
                                             "fronts": args.front, "concurrency": args.concurrency,
                                             "duration": args.duration, "load_options": extra},
                 {"reference": runs[0].name, "runs": measured})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
