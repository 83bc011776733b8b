"""The full cascade against the default path under load, two servers one after the other in one run (issue #26).

Runs ``bench.load`` (closed loop, gRPC, each with its compute floor) once per ``--config`` (the first is the
reference: the default path), into one JSON, then reports each configuration's p50 at every level and QPS as
ratios of the reference's from the same run: the issue's targets are the full cascade's p50 at one caller
<= 2x the default's and its QPS at 16 callers >= 0.4x. Usage::

    python -m bench.cascade_load --index indexes/scifact --dataset ../shared/data/beir/scifact \\
        --config default=configs/default.toml --config cascade=configs/cascade.toml --json results/cascade-load.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness import write_result
from bench.load import main as load_main


def ratios(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per closed-loop level: p50, p99 and QPS of ``other`` over ``reference``.

    >>> ratios({"1": {"p50_ms": 10.0, "p99_ms": 20.0, "qps": 100.0}}, {"1": {"p50_ms": 15.0, "p99_ms": 30.0, "qps": 50.0}})
    {'1': {'p50_ratio': 1.5, 'p99_ratio': 1.5, 'qps_ratio': 0.5}}
    """
    def r(a: float | None, b: float | None) -> float | None:
        return None if not a or b is None else round(b / a, 3)

    return {c: {"p50_ratio": r(reference[c].get("p50_ms"), e.get("p50_ms")),
                "p99_ratio": r(reference[c].get("p99_ms"), e.get("p99_ms")),
                "qps_ratio": r(reference[c].get("qps"), e.get("qps"))}
            for c, e in other.items() if c in reference}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    fronts = dict(f.partition("=")[::2] for f in args.front)
    known = {c.partition("=")[0] for c in args.config}
    for name in fronts:  # a front run of a new name: the reference's server configuration, behind the front
        if name not in known:
            args.config.append(f"{name}={args.config[0].partition('=')[2]}")
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="hybridrag-cascade-load-") as tmp:
        for spec in args.config:
            name, _, toml = spec.partition("=")
            out = Path(tmp) / f"{name}.json"
            cmd = ["--index", args.index, "--dataset", args.dataset, "--concurrency", args.concurrency,
                   "--duration", str(args.duration), "--warmup", str(args.warmup), "--no-baseline",
                   "--floor-queries", str(args.floor_queries), "--json", str(out), *extra]
            if toml:
                cmd += ["--config", toml]
            if name in fronts:
                cmd += ["--front", fronts[name]]
            print(f"== {name} ({toml or 'defaults'})", file=sys.stderr)
            if load_main(cmd) != 0:
                return 2
            (entry,) = json.loads(out.read_text())["load"].values()
            runs[name] = {"config_file": toml, "front": int(fronts.get(name) or 0),
                          "closed_loop": entry["closed_loop"], "floor": entry["floor"],
                          "ndcg@10": entry["ndcg@10"], "server": entry["server"]}
    ref_name = args.config[0].partition("=")[0]
    ref = runs[ref_name]["closed_loop"]
    print(f"\nagainst {ref_name}, same run:")
    for name, run in runs.items():
        run["vs_reference"] = ratios(ref, run["closed_loop"])
        for c, r in run["vs_reference"].items():
            e = run["closed_loop"][c]
            print(f"{name:12} C={c:<3} QPS {e['qps']:7.1f} p50 {e['p50_ms']:7.1f} ms  p50 x{r['p50_ratio']}  "
                  f"QPS x{r['qps_ratio']}  p50/floor {e.get('p50_over_floor')}  nDCG@10 {run['ndcg@10']}")
    write_result(args.json, "cascade_load", {"dataset": Path(args.dataset).name, "configs": args.config,
                                             "fronts": args.front, "concurrency": args.concurrency, "duration": args.duration},
                 {"reference": ref_name, "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
