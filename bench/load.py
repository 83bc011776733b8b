"""Load benchmark of the gRPC service: closed-loop QPS and latency per concurrency, open-loop behaviour past
saturation, quality of what was served, and a naive baseline on the same queries in the same run.

What is measured:

- **Closed loop**, per concurrency level C: C asyncio callers on ``grpc.aio`` (spread round-robin over a few
  channels, each its own connection) send ``Retrieve`` after ``Retrieve`` for ``--duration`` seconds after a
  ``--warmup`` that is not counted. A request counts when it completes inside the measured window: QPS = OK
  completions / window seconds; p50/p95/p99/mean over the OK ones; errors by status code name (the raw generated
  stub is used, with no retry, so every refusal is counted); degraded answers, cache hits, and the mean of every
  ``timings_ms`` stage over the OK answers. ``bypass_cache`` is set unless ``--cache``: the queries cycle, and
  repeats would otherwise be semantic-cache hits.
- **Client check** (the client must not be the bottleneck): the client's CPU time over the window
  (``client_cpu_util``, 1.0 = one core busy), and a calibration at the same C with the same client machinery
  against the gRPC health ``Check`` RPC (trivial work on the server) for ``--calibration-seconds``:
  ``client_ceiling_qps``, and ``client_headroom`` = ceiling / service QPS (a warning below 3). ``--client-procs N``
  spreads the callers over N processes (each with its own event loop and channels; results merged).
- **Open loop** (``--open-loop-rates``): requests fired on a fixed schedule (``--arrivals fixed``: constant
  inter-arrival; ``poisson``: exponential inter-arrivals, seeded by ``--seed``) whatever the completions, each
  its own task with the per-request deadline. Counted: the requests scheduled in the measured window, each with
  its outcome. Per rate: achieved OK throughput, OK latency percentiles, counts by status, the latency of the
  RESOURCE_EXHAUSTED rejections (admission control: they should be fast), the most requests outstanding at the
  client, and how late the client sent against its schedule (a warning when it fell behind).
- **Quality**: nDCG@10 of the service over the queries it answered (the first OK answer per query id), and of
  the service and the baseline on the baseline's query subset.
- **Baseline** (``bench/naive_baseline.py``: rank-bm25 + sentence-transformers exact dense search + a
  CrossEncoder over the top 100, one query after another; needs torch): run on the first ``--baseline-queries``
  queries, never at the same time as the service (before the spawned server starts, or after the service levels
  against ``--target``). It is sequential, so its figures are the same at every level; for C > 1 its latency is a
  lower bound (a sequential server would queue the C concurrent requests).

Usage::

    python -m bench.load --index /tmp/idx/scifact --dataset ../shared/data/beir/scifact [--config cfg.toml] \\
        [--concurrency 1,4,16,64] [--duration 20] [--open-loop-rates 5,10,20,40] [--baseline-queries 50] \\
        [--json results/bench.json] [--plots results/]
    hybridrag bench load --target 127.0.0.1:50051 --dataset ../shared/data/beir/scifact --no-baseline

``--index`` starts ``python -m hybridrag serve`` as a subprocess (:mod:`bench.harness.server`: client and server
do not share a GIL; the embedded LLM server is off in it and ``/metrics`` takes a free port) on a free port, waits
for health SERVING and stops it at the end (SIGTERM). With ``--index`` the baseline runs before the server starts.
``HYBRIDRAG_API_KEY`` is sent as the API key when set. The load itself is :mod:`bench.harness.loadgen`'s; this
script chooses the levels, adds the floor, the baseline and the quality, and reports.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.harness import floats, ints, names, query_list, ratio, write_result
from bench.harness import plots as plotting
from bench.harness.loadgen import LevelSpec, RequestSpec, Samples, answer_each, measure_level, open_loop
from bench.harness.server import api_key, fronted, server_status, spawn_server, wait_serving

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CE_ONNX = REPO.parent / "shared" / "models" / "ce-minilm-l6-beir-train"
HEADROOM_WARN = 3.0
CPU_WARN = 0.75
BASELINE_NOTE = ("the baseline answers one query after another: its QPS and latency are the same at every level; "
                 "for C > 1 its latency is a lower bound (a sequential server would queue the C concurrent requests)")


class LoadError(RuntimeError):
    """A run that cannot go on (its message is the one line printed)."""


# ---------------------------------------------------------------------------------------------- baseline, quality


def baseline_missing() -> str:
    """Why the naive baseline cannot run here ("" when it can): its module and the libraries it imports."""
    import importlib.util

    for name in ("bench.naive_baseline", "torch", "sentence_transformers", "rank_bm25"):
        try:
            if importlib.util.find_spec(name) is None:
                return f"no module {name}"
        except ImportError as e:
            return str(e)
    return ""


def run_baseline(args: argparse.Namespace, queries: list[tuple[str, str]]) -> dict[str, Any]:
    from bench.naive_baseline import NaiveBaseline

    subset = dict(queries[: args.baseline_queries])
    print(f"baseline: {len(subset)} queries, one after another (slow)...", file=sys.stderr)
    base = NaiveBaseline(Path(args.dataset), ce_onnx=Path(args.ce_onnx),
                         cache_dir=Path(args.baseline_cache) if args.baseline_cache else None,
                         candidates=args.baseline_candidates, threads=args.baseline_threads,
                         ce_max_length=args.baseline_ce_max_length)
    result = base.run(subset, k=args.top_k, warmup=min(3, len(subset)))
    result.update(candidates=args.baseline_candidates, ce_max_length=base.ce_max_length, setup_s=base.setup_s,
                  ce_check={k: base.ce_check.get(k) for k in ("max_abs_diff_logits", "max_abs_diff_cross_encoder_predict")})
    print(f"baseline: {result['qps']:.3f} QPS, p50 {result['p50_ms']:.0f} ms", file=sys.stderr)
    return result


def quality(qrels: dict, service_run: dict, baseline_run: dict | None,
            first_n: dict | None = None) -> dict[str, Any]:
    """nDCG@10 of what was served: every query answered under load (its first OK answer), the first N queries
    asked one by one (``--quality-queries``: the same set whatever the throughput), and the baseline's."""
    from retrieval.evaluate import evaluate

    def ndcg(run: dict) -> dict[str, Any]:
        r = evaluate(qrels, run) if run else {"ndcg@10": None, "queries": 0}
        return {"ndcg@10": r["ndcg@10"], "queries": r["queries"]}

    out: dict[str, Any] = {"service_all": ndcg(service_run)}
    if first_n is not None:
        out["service_first_n"] = ndcg(first_n)
    if baseline_run is not None:
        subset = set(baseline_run) & set(service_run)
        out["service_on_baseline_subset"] = ndcg({q: service_run[q] for q in subset})
        out["baseline"] = ndcg({q: baseline_run[q] for q in subset})
        out["baseline_all"] = ndcg(baseline_run)
    return out


def with_baseline(entry: dict[str, Any], base: dict[str, Any] | None) -> None:
    if not base:
        return
    entry["baseline"] = {k: base[k] for k in ("qps", "p50_ms", "p95_ms", "p99_ms", "mean_ms") if k in base}
    entry["baseline"]["sequential"] = True
    entry["qps_ratio"] = ratio(entry["qps"], base.get("qps"), 2)
    entry["p50_ratio"] = ratio(base.get("p50_ms"), entry["p50_ms"], 2)
    entry["p99_ratio"] = ratio(base.get("p99_ms"), entry["p99_ms"], 2)


# ---------------------------------------------------------------------------------------------- measuring


def measure_service(args: argparse.Namespace, target: str, queries: list[tuple[str, str]],
                    server_pid: int | None, http_url: str = "") -> tuple[dict[str, dict], dict[str, dict], Samples,
                                                                       dict[str, dict], dict | None]:
    """Every closed-loop level (each followed by its client calibration) on each door (gRPC first, then HTTP at the
    same level: both see the same machine state), then every open-loop rate (gRPC), then the first
    ``--quality-queries`` one by one. Returns the gRPC levels, the open loop, the samples, the HTTP door's levels
    with their overhead against gRPC at the same level, and the one-by-one run (None when not asked)."""
    request = RequestSpec(top_k=args.top_k, stages=names(args.stages), bypass_cache=not args.cache,
                          timeout_s=args.timeout_ms / 1000, api_key=api_key())
    base = LevelSpec(target, tuple(queries), 1, args.duration, args.warmup, request, channels=args.channels,
                     server_pid=server_pid)
    transports = _transports(args.transports)
    closed: dict[str, dict] = {}
    closed_http: dict[str, dict] = {}
    everything = Samples()
    for c in ints(args.concurrency):
        for transport in transports:
            spec = replace(base, concurrency=c) if transport == "grpc" else \
                replace(base, concurrency=c, transport="http", target=http_url)
            entry, samples = measure_level(spec, args.client_procs, args.calibration_seconds)
            if transport == "grpc":
                everything.merge(samples)
            (closed if transport == "grpc" else closed_http)[str(c)] = entry
            print(f"{transport:4s} C={c:<3d} {entry['qps']:8.2f} QPS  p50 {_f(entry['p50_ms'])} ms  "
                  f"p99 {_f(entry['p99_ms'])} ms  errors {entry['errors']}  "
                  f"client cpu {_f(entry['client_cpu_util'], '.2f')}  headroom {_f(entry.get('client_headroom'))}",
                  file=sys.stderr)
    for level, h in closed_http.items():
        if level in closed:
            h["overhead_vs_grpc"] = http_overhead(closed[level], h)
    opened: dict[str, dict] = {}
    if "grpc" in transports:
        for rate in floats(args.open_loop_rates):
            r = asyncio.run(open_loop(base, rate, args.arrivals, args.seed))
            opened[f"{rate:g}"] = r
            print(f"open loop {rate:g}/s: OK {r['ok_rps']:.1f}/s p99 {_f(r['p99_ms'])} ms  status {r['status']}  "
                  f"max outstanding {r['max_outstanding']}", file=sys.stderr)
    first_n = None
    if args.quality_queries > 0:
        first_n = asyncio.run(answer_each(replace(base, queries=tuple(queries[: args.quality_queries]))))
    return closed, opened, everything, closed_http, first_n


def http_overhead(grpc_entry: dict[str, Any], http_entry: dict[str, Any]) -> dict[str, float | None]:
    """The HTTP door against gRPC at one level: p50/p99 differences (ms), ratios of p50 and QPS, and the two
    doors' do-nothing calls (gRPC health Check, GET /healthz).

    >>> o = http_overhead({"p50_ms": 10.0, "p99_ms": 20.0, "qps": 100.0}, {"p50_ms": 11.0, "p99_ms": 23.0, "qps": 90.0})
    >>> o["p50_ms_delta"], o["p99_ms_delta"], o["p50_ratio"], o["qps_ratio"]
    (1.0, 3.0, 1.1, 0.9)
    """
    def diff(key: str) -> float | None:
        a, b = grpc_entry.get(key), http_entry.get(key)
        return None if a is None or b is None else round(b - a, 3)

    def over(key: str) -> float | None:
        return ratio(http_entry.get(key), grpc_entry.get(key))

    return {"p50_ms_delta": diff("p50_ms"), "p99_ms_delta": diff("p99_ms"), "p50_ratio": over("p50_ms"),
            "qps_ratio": over("qps"), "grpc_health_p50_ms": grpc_entry.get("health_p50_ms"),
            "http_health_p50_ms": http_entry.get("health_p50_ms")}


def _transports(text: str) -> list[str]:
    out = [t.strip() for t in text.split(",") if t.strip()]
    if not out or set(out) - {"grpc", "http"}:
        raise SystemExit(f"--transports must name grpc and/or http, got {text!r}")
    return sorted(set(out), key=["grpc", "http"].index)


def client_warnings(closed: dict[str, dict], opened: dict[str, dict]) -> list[str]:
    out = []
    for c, r in closed.items():
        if r.get("client_headroom") is not None and r["client_headroom"] < HEADROOM_WARN:
            out.append(f"C={c}: client headroom {r['client_headroom']} < {HEADROOM_WARN}: the client may limit QPS "
                       "(try --client-procs)")
        if r["client_cpu_util"] is not None and r["client_cpu_util"] > CPU_WARN:
            out.append(f"C={c}: the client used {r['client_cpu_util']:.2f} of a core")
    for rate, r in opened.items():
        late, sent, due = r["send_lateness_ms"]["p99"], r["achieved_send_rps"], r["scheduled_send_rps"]
        if late > max(10.0, 1000.0 / float(rate)) or (sent and due and sent < 0.95 * due):
            out.append(f"open loop {rate}/s: the client fell behind its schedule (p99 send lateness {late:.1f} ms, "
                       f"sent {_f(sent)}/s)")
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The whole run (baseline and floor first when the server is spawned, then the service), reported and, with
    ``--json``, written; returns the entry. Raises :class:`LoadError`."""
    queries, qrels = query_list(args.dataset, args.split, args.limit)
    if not queries:
        raise LoadError(f"no judged {args.split} queries in {args.dataset}")
    want_http = "http" in _transports(args.transports)
    if args.front and (not args.index or want_http):
        raise LoadError("--front needs --index (a spawned server) and the gRPC door alone")
    if want_http and args.target and not args.http_target:
        raise LoadError("--transports with http and --target need --http-target URL")
    baseline = None
    if not args.no_baseline:
        missing = baseline_missing()
        if missing:  # fail before anything runs, not after the service levels
            raise LoadError(f"the baseline is unavailable ({missing}); pass --no-baseline to run without it")
        if args.index:  # first: the spawned server does not exist yet, so the two never share the cores
            baseline = run_baseline(args, queries)
    floor = None
    if args.index and args.floor_queries > 0:  # also before the server: the stages' own compute, alone
        from bench.floor import floor_of_index

        floor = floor_of_index(args.index, args.config, [t for _, t in queries[: args.floor_queries]],
                               names(args.stages) or None)
        print(f"compute floor {floor['floor_ms']:.2f} ms/request, throughput floor {floor['throughput_floor_qps']} QPS "
              f"({floor['stage_p50_ms']})", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="hybridrag-load-") as tmp:
        server = None
        try:
            if args.index:
                server = spawn_server(args.index, Path(tmp), config=args.config, threads=args.server_threads,
                                      http=want_http)
                direct, http_url = server.target, server.http_url
                print(f"started the server (pid {server.pid}) on {direct}, waiting for SERVING...", file=sys.stderr)
                wait_serving(direct, args.server_timeout, server)
            else:
                direct, http_url = args.target, args.http_target or ""
                wait_serving(direct, args.server_timeout)
            with fronted(direct, args.front, Path(tmp)) as target:
                if args.front:
                    print(f"the load goes through the front (nginx, {args.front} in flight) on {target}",
                          file=sys.stderr)
                status = server_status(target, api_key())
                closed, opened, samples, closed_http, first_n = measure_service(
                    args, target, queries, server.pid if server else None, http_url)
        except RuntimeError as e:
            raise LoadError(str(e)) from None
        finally:
            if server is not None:
                server.stop()
    if not args.no_baseline and baseline is None:
        baseline = run_baseline(args, queries)
    return report(args, queries, qrels, status, closed, opened, samples, baseline, closed_http, floor, first_n)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog or "python -m bench.load").parse_args(argv)
    try:
        measure(args)
    except LoadError as e:
        print(f"bench load: {e}", file=sys.stderr)
        return 2
    return 0


# ---------------------------------------------------------------------------------------------- output


def _f(v: Any, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def print_tables(closed: dict[str, dict], opened: dict[str, dict]) -> None:
    if closed:
        print(f"\n{'C':>4} {'QPS':>8} {'p50':>8} {'p95':>8} {'p99':>8} {'errors':>7} {'degr':>5} {'cli cpu':>7} "
              f"{'headroom':>8} {'base QPS':>8} {'base p50':>9} {'QPS x':>7}")
        for c, r in closed.items():
            b = r.get("baseline", {})
            print(f"{c:>4} {r['qps']:8.2f} {_f(r['p50_ms']):>8} {_f(r['p95_ms']):>8} {_f(r['p99_ms']):>8} "
                  f"{sum(r['errors'].values()):7d} {r['degraded']:5d} {_f(r['client_cpu_util'], '.2f'):>7} "
                  f"{_f(r.get('client_headroom')):>8} {_f(b.get('qps'), '.3f'):>8} {_f(b.get('p50_ms'), '.0f'):>9} "
                  f"{_f(r.get('qps_ratio')):>7}")
    if opened:
        print(f"\n{'rate/s':>7} {'sent/s':>7} {'OK/s':>7} {'OK p50':>8} {'OK p95':>8} {'OK p99':>8} {'rejected':>8} "
              f"{'rej p50':>8} {'deadline':>8} {'max out':>7} {'late p99':>8}")
        for rate, r in opened.items():
            st = r["status"]
            print(f"{rate:>7} {_f(r['achieved_send_rps']):>7} {r['ok_rps']:7.1f} {_f(r['p50_ms']):>8} {_f(r['p95_ms']):>8} "
                  f"{_f(r['p99_ms']):>8} {st.get('RESOURCE_EXHAUSTED', 0):8d} {_f(r['rejected_p50_ms'], '.2f'):>8} "
                  f"{st.get('DEADLINE_EXCEEDED', 0):8d} {r['max_outstanding']:7d} "
                  f"{_f(r['send_lateness_ms']['p99']):>8}")


def print_http_overhead(closed_http: dict[str, dict]) -> None:
    print("\nHTTP door vs gRPC (same server, same level, interleaved):")
    print(f"{'C':>4} {'http QPS':>9} {'p50 ms':>8} {'p99 ms':>8} {'Δp50 ms':>8} {'p50 x':>6} {'QPS x':>6} "
          f"{'health gRPC/HTTP ms':>20}")
    for c, h in closed_http.items():
        o = h.get("overhead_vs_grpc", {})
        print(f"{c:>4} {h['qps']:9.1f} {_f(h['p50_ms']):>8} {_f(h['p99_ms']):>8} {_f(o.get('p50_ms_delta'), '.2f'):>8} "
              f"{_f(o.get('p50_ratio'), '.2f'):>6} {_f(o.get('qps_ratio'), '.2f'):>6} "
              f"{_f(o.get('grpc_health_p50_ms'), '.2f'):>9} / {_f(o.get('http_health_p50_ms'), '.2f')}")


def report(args: argparse.Namespace, queries: list[tuple[str, str]], qrels: dict, status: dict[str, Any],
           closed: dict[str, dict], opened: dict[str, dict], samples: Samples, baseline: dict | None,
           closed_http: dict[str, dict] | None = None, floor: dict[str, Any] | None = None,
           first_n: dict | None = None) -> dict[str, Any]:
    from bench.floor import against_floor

    for entry in closed.values():
        with_baseline(entry, baseline)
        if floor is not None:
            against_floor(entry, floor)
    for entry in (closed_http or {}).values():
        if floor is not None:
            against_floor(entry, floor)
    ndcg = quality(qrels, samples.run, baseline["run"] if baseline else None, first_n)
    warnings = client_warnings(closed, opened)
    print_tables(closed, opened)
    if floor is not None:
        print(f"\ncompute floor {floor['floor_ms']:.2f} ms ({floor['stage_p50_ms']}), throughput floor "
              f"{floor['throughput_floor_qps']} QPS on {floor['cores']} cores")
        for c, e in closed.items():
            print(f"C={c:<3} p50/floor {_f(e.get('p50_over_floor'), '.2f')}  QPS/floor {_f(e.get('qps_over_floor'), '.2f')}")
    if closed_http:
        print_http_overhead(closed_http)
    print(f"\nnDCG@10: {ndcg}")
    for w in warnings:
        print(f"WARNING: {w}", file=sys.stderr)
    dataset = Path(args.dataset).name
    plots_dir = Path(args.plots) if args.plots else (Path(args.json).parent if args.json else None)
    plots: list[Path] = []
    if plots_dir is not None and not plotting.available():
        print("plots: skipped (matplotlib is not installed: pip install -e '.[bench]')")
        plots_dir = None
    if plots_dir is not None:
        plots_dir.mkdir(parents=True, exist_ok=True)
        title = (f"{dataset}: {status['documents']} documents, generation {status['generation']}, top {args.top_k}, "
                 f"{'cache on' if args.cache else 'bypass_cache'}")
        if closed:
            plots.append(plots_dir / f"load_{dataset}.png")
            plotting.plot_closed(closed, plots[-1], title)
        if opened:
            plots.append(plots_dir / f"load_{dataset}_open.png")
            plotting.plot_open(opened, plots[-1], f"{title}; open loop, {args.arrivals} arrivals")
        print("plots: " + ", ".join(str(p) for p in plots))
    config = {"dataset": dataset, "split": args.split, "limit": args.limit,
              "server": f"spawned {Path(args.index).name}" if args.index else args.target,
              "server_config": Path(args.config).name if args.config else "", "concurrency": ints(args.concurrency),
              "duration": args.duration, "warmup": args.warmup, "top_k": args.top_k, "stages": args.stages,
              "cache": args.cache, "timeout_ms": args.timeout_ms, "client_procs": args.client_procs,
              "open_loop_rates": floats(args.open_loop_rates), "arrivals": args.arrivals,
              "transports": _transports(args.transports), "front": args.front,
              "quality_queries": args.quality_queries,
              "baseline_queries": 0 if args.no_baseline else args.baseline_queries}
    base_summary = {k: v for k, v in baseline.items() if k != "run"} if baseline else None
    result = {
        "server": status, "queries": len(queries), "closed_loop": closed, "open_loop": opened, "ndcg@10": ndcg,
        "closed_loop_http": closed_http or None, "floor": floor,
        "baseline": base_summary, "baseline_note": BASELINE_NOTE if baseline else None,
        "client_check": {"calibration": "the same client at the same C against grpc.health.v1 Check",
                         "calibration_seconds": args.calibration_seconds, "headroom_warn_below": HEADROOM_WARN,
                         "warnings": warnings},
        "open_loop_note": "counted: requests scheduled in the measured window; ok_rps = their OK answers / duration",
        "plots": [str(p) for p in plots]}
    if args.json:
        return write_result(args.json, "load", config, result)
    return {"config": config, **result}


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", help="HOST:PORT of a running server")
    where.add_argument("--index", help="start `hybridrag serve --index DIR` as a subprocess and measure it")
    ap.add_argument("--config", help="TOML configuration of the spawned server")
    ap.add_argument("--server-threads", type=int, default=0, help="--threads of the spawned server (0 = default)")
    ap.add_argument("--server-timeout", type=float, default=300.0, help="seconds to wait for health SERVING")
    ap.add_argument("--front", type=int, default=0, metavar="LIMIT", help="with --index: send the load through "
                    "`hybridrag front` (nginx) at LIMIT reads in flight before the spawned server (0 = direct)")
    ap.add_argument("--dataset", required=True, help="BEIR folder: the split's judged queries are sent, cycled")
    ap.add_argument("--split", default="test")
    ap.add_argument("--limit", type=int, default=0, help="only the first N queries")
    ap.add_argument("--concurrency", default="1,4,16,64", help="closed-loop levels ('' = none)")
    ap.add_argument("--duration", type=float, default=20.0, help="measured seconds per level and per open-loop rate")
    ap.add_argument("--warmup", type=float, default=3.0, help="uncounted seconds before each level / rate")
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--stages", default="", help="comma-separated stages (default: the server's)")
    ap.add_argument("--timeout-ms", type=float, default=10000.0, help="per-request gRPC deadline")
    ap.add_argument("--cache", action="store_true", help="let the semantic cache answer (default: bypass_cache)")
    ap.add_argument("--channels", type=int, default=4, help="gRPC channels per client process (closed loop: at most C)")
    ap.add_argument("--client-procs", type=int, default=1, help="spread closed-loop callers over N processes")
    ap.add_argument("--calibration-seconds", type=float, default=2.0,
                    help="client ceiling: seconds of health Check at each level (0 = skip)")
    ap.add_argument("--floor-queries", type=int, default=300, help="with --index: measure the compute floor "
                    "(bench/floor.py) on the first N queries before the server starts (0 = skip)")
    ap.add_argument("--transports", default="grpc", help="doors measured at each closed-loop level, interleaved: "
                    "grpc, http or grpc,http (the HTTP door's overhead over gRPC, same run, same server)")
    ap.add_argument("--http-target", help="base URL of the HTTP door of --target (with --transports ...http)")
    ap.add_argument("--open-loop-rates", default="", help="comma-separated requests/s for the open loop")
    ap.add_argument("--arrivals", choices=("fixed", "poisson"), default="fixed", help="open-loop inter-arrival times")
    ap.add_argument("--seed", type=int, default=0, help="Poisson arrivals seed")
    ap.add_argument("--quality-queries", type=int, default=0, help="after the load, ask the first N queries one by "
                    "one: nDCG@10 on a set that does not depend on throughput (ndcg@10.service_first_n; 0 = skip)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the naive baseline")
    ap.add_argument("--baseline-queries", type=int, default=50, help="the baseline runs the first N queries")
    ap.add_argument("--baseline-candidates", type=int, default=100, help="the baseline's cross-encoder depth")
    ap.add_argument("--baseline-threads", type=int, default=0, help="torch threads of the baseline (0 = default)")
    ap.add_argument("--baseline-cache", help="cache folder of the baseline's corpus embeddings")
    ap.add_argument("--baseline-ce-max-length", type=int, default=None,
                    help="the baseline cross-encoder's pair length (default: the model's own, 256)")
    ap.add_argument("--ce-onnx", default=str(DEFAULT_CE_ONNX), help="the baseline's cross-encoder model folder")
    ap.add_argument("--json", help="merge the result into this JSON file")
    ap.add_argument("--plots", help="folder for the PNG plots (default: next to --json)")
    return ap




if __name__ == "__main__":
    sys.exit(main())
