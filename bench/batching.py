"""Cross-request batching: QPS and latency with the model batchers on against off, same run, same queries.

Closed loop in process (:func:`bench.harness.loadgen.closed_loop_async`): C concurrent callers (asyncio tasks
calling ``Pipeline.search_async``, like the gRPC server does) each send the dataset's queries one after another for
``--duration`` seconds. The modes alternate per concurrency level and round (off, window, on, off, ...) so a shift in
machine load hits them alike; each mode keeps its best round (QPS). "Off" is the same configuration with every
batcher disabled (``[batching.*] enabled = false``): each request makes its own model calls. "Window" is batching
with the policy before issue 26 (``idle_dispatch = false``: every batch waits out its ``max_wait_ms`` window, even
when the model is idle); "on" is the default (an idle model takes a call at once). Each mode is its own pipeline,
opened as the server opens it (``retrieval.app.open_pipeline``) from the configuration with that change. What a
bigger batch saves at all per model (the ceiling of what batching can give): ``bench.gpu_check --providers
CPUExecutionProvider --batches 1,4,16``. Usage::

    python -m bench.batching --index /tmp/idx/scifact --dataset ../shared/data/beir/scifact \\
        [--config cfg.toml] [--stages bm25,dense,late_interaction] [--concurrency 1,16] [--duration 20] \\
        [--rounds 2] [--json results/bench.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Any

from bench.harness import alternate, ints, names, query_list, ratio, write_result
from bench.harness.loadgen import closed_loop_async
from bench.harness.pipelines import opened, with_sections

MODES = ("off", "window", "on")


def with_batching(config: Any, mode: str) -> Any:
    """``config`` with every model batcher off, on with waiting windows, or on with idle dispatch (the default).

    >>> from retrieval.config import load_config
    >>> c = with_batching(load_config(environ={}), "window")
    >>> c.batching.embed.enabled, c.batching.embed.idle_dispatch, c.batching.cross_encoder.idle_dispatch
    (True, False, False)
    """
    b = config.batching
    over = {"enabled": mode != "off", "idle_dispatch": mode == "on"}
    return with_sections(config, batching={"embed": dataclasses.replace(b.embed, **over),
                                           "query_tokens": dataclasses.replace(b.query_tokens, **over),
                                           "cross_encoder": dataclasses.replace(b.cross_encoder, **over)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.batching", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--dataset", required=True, help="BEIR folder whose queries are sent")
    ap.add_argument("--split", default="test")
    ap.add_argument("--config")
    ap.add_argument("--stages", default="", help="comma-separated stages (default: as configured)")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per level, mode and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="only the first N queries")
    ap.add_argument("--json", help="merge the result into this JSON file")
    args = ap.parse_args(argv)

    from retrieval.config import load_config

    config = load_config(args.config)
    queries = [t for _, t in query_list(args.dataset, args.split, args.limit)[0]]
    results: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        pipelines = {mode: stack.enter_context(opened(args.index, with_batching(config, mode))) for mode in MODES}
        stages = names(args.stages) or pipelines["on"].default_stages()
        for p in pipelines.values():  # warm-up: sessions, caches, the stages' latency windows
            for q in queries[:5]:
                p.search(q, 10, stages=stages, use_cache=False)

        def mode_run(mode: str, c: int):
            p = pipelines[mode]

            def run() -> dict[str, Any]:
                before = p.batcher_stats()
                r = asyncio.run(closed_loop_async(lambda q: p.search_async(q, 10, stages=stages, use_cache=False),
                                                  queries, c, args.duration))
                after = p.batcher_stats()
                r["mean_batch_size"] = {name: round((after[name]["items"] - before[name]["items"])
                                                    / max(after[name]["batches"] - before[name]["batches"], 1), 2)
                                        for name in after}
                print(f"concurrency {c:3d} batching {mode:6s}: {r['qps']:7.2f} QPS  p50 {r['p50_ms']} ms  "
                      f"p99 {r['p99_ms']} ms  batch sizes {r['mean_batch_size']}", file=sys.stderr)
                return r
            return run

        for c in ints(args.concurrency):
            best, rounds = alternate({mode: mode_run(mode, c) for mode in MODES}, args.rounds,
                                     lambda new, old: new["qps"] > old["qps"])
            results[str(c)] = {**best, "qps_ratio": ratio(best["on"]["qps"], best["off"]["qps"], 2),
                               "p50_on_over_window": ratio(best["on"]["p50_ms"], best["window"]["p50_ms"]),
                               "qps_on_over_window": ratio(best["on"]["qps"], best["window"]["qps"]),
                               "rounds": rounds}

    print(f"\n{'callers':>8} {'off QPS':>9} {'window QPS':>10} {'on QPS':>9} {'on/off':>6} {'off p50':>9} "
          f"{'window p50':>10} {'on p50':>9} {'on/window p50':>13} {'on p99':>9}")
    for level, r in results.items():
        print(f"{level:>8} {r['off']['qps']:9.2f} {r['window']['qps']:10.2f} {r['on']['qps']:9.2f} {r['qps_ratio']} "
              f"{r['off']['p50_ms']} {r['window']['p50_ms']} {r['on']['p50_ms']} {r['p50_on_over_window']} "
              f"{r['on']['p99_ms']}")
    if args.json:
        cfg = {"dataset": Path(args.dataset).name, "stages": list(stages), "duration": args.duration,
               "rounds": args.rounds, "late_interaction_model": config.late_interaction.model or "embedder",
               "cross_encoder": config.cross_encoder.model, "batching": dataclasses.asdict(config.batching)}
        write_result(args.json, "batching", cfg, {"levels": results, "queries": len(queries)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
