"""Refusals past saturation: how fast a burst's excess gets RESOURCE_EXHAUSTED (issue #26).

A spawned server (``hybridrag serve``, default ``max_in_flight`` 64) receives ``--calls`` Retrieve calls at
once, over ``--channels`` channels from one asyncio client, after a warm-up. Each call's latency is measured from
the burst's start (the moment the first call is sent), and from its own send. The figures that matter: the p50/p95
of the refused calls (RESOURCE_EXHAUSTED) from the burst's start, against the p50 of a do-nothing health Check sent
alone on the same connection (the transport's own floor), and how many calls were admitted. Usage::

    python -m bench.burst --index indexes/scifact --dataset ../shared/data/beir/scifact [--calls 200] [--bursts 5]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import machine, write_result
from bench.load import load_query_list, spawn_server, stop_server, wait_serving


def _pct(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"n": 0, "p50_ms": None, "p95_ms": None, "max_ms": None}
    a = np.asarray(xs)
    return {"n": len(xs), "p50_ms": round(float(np.percentile(a, 50)), 2),
            "p95_ms": round(float(np.percentile(a, 95)), 2), "max_ms": round(float(a.max()), 2)}


async def one_burst(stubs: list[Any], queries: list[str], calls: int, timeout_s: float) -> dict[str, Any]:
    import grpc

    from retrieval.api import retriever_pb2 as pb

    t0 = time.perf_counter()

    async def call(i: int) -> tuple[str, float, float]:
        sent = time.perf_counter()
        try:
            await stubs[i % len(stubs)].Retrieve(pb.RetrieveRequest(query=queries[i % len(queries)], top_k=10,
                                                                    bypass_cache=True), timeout=timeout_s)
            code = "OK"
        except grpc.aio.AioRpcError as e:
            code = e.code().name
        done = time.perf_counter()
        return code, (done - t0) * 1000.0, (done - sent) * 1000.0

    results = await asyncio.gather(*(call(i) for i in range(calls)))
    by_code: dict[str, list[tuple[float, float]]] = {}
    for code, from_start, own in results:
        by_code.setdefault(code, []).append((from_start, own))
    return {code: [r[0] for r in rs] for code, rs in by_code.items()} | {
        "_own": {code: [r[1] for r in rs] for code, rs in by_code.items()}}


async def run(target: str, queries: list[str], calls: int, bursts: int, channels: int, timeout_s: float,
              pause_s: float) -> dict[str, Any]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from retrieval.api import retriever_pb2 as pb
    from retrieval.api import retriever_pb2_grpc as pbg

    chans = [grpc.aio.insecure_channel(target) for _ in range(channels)]
    stubs = [pbg.RetrieverStub(c) for c in chans]
    health = health_pb2_grpc.HealthStub(chans[0])
    try:
        for q in queries[:20]:  # warm-up: connections, sessions
            await stubs[0].Retrieve(pb.RetrieveRequest(query=q, top_k=10, bypass_cache=True))
        idle = []
        for _ in range(50):
            t = time.perf_counter()
            await health.Check(health_pb2.HealthCheckRequest())
            idle.append((time.perf_counter() - t) * 1000.0)
        refused: list[float] = []
        refused_own: list[float] = []
        ok: list[float] = []
        other: dict[str, int] = {}
        admitted = []
        for _ in range(bursts):
            r = await one_burst(stubs, queries, calls, timeout_s)
            own = r.pop("_own")
            refused += r.get("RESOURCE_EXHAUSTED", [])
            refused_own += own.get("RESOURCE_EXHAUSTED", [])
            ok += r.get("OK", [])
            admitted.append(len(r.get("OK", [])))
            for code, xs in r.items():
                if code not in ("OK", "RESOURCE_EXHAUSTED"):
                    other[code] = other.get(code, 0) + len(xs)
            await asyncio.sleep(pause_s)
    finally:
        for c in chans:
            await c.close()
    return {"calls_per_burst": calls, "bursts": bursts, "channels": channels,
            "health_alone": _pct(idle), "refused_from_burst_start": _pct(refused),
            "refused_own_latency": _pct(refused_own), "ok_from_burst_start": _pct(ok),
            "admitted_per_burst": admitted, "other_codes": other}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", help="spawn `hybridrag serve --index DIR` and measure it")
    where.add_argument("--target", help="HOST:PORT of a running server")
    ap.add_argument("--dataset", required=True, help="BEIR folder: its test queries are sent")
    ap.add_argument("--config", help="TOML configuration of the spawned server")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--bursts", type=int, default=5)
    ap.add_argument("--channels", type=int, default=4)
    ap.add_argument("--timeout-s", type=float, default=30.0)
    ap.add_argument("--pause-s", type=float, default=2.0, help="idle seconds between bursts")
    ap.add_argument("--label", default="", help="names this run in the JSON (e.g. the server settings given by env)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    queries = [t for _, t in load_query_list(args.dataset, "test", 0)[0]]
    if args.target:
        result = asyncio.run(run(args.target, queries, args.calls, args.bursts, args.channels, args.timeout_s,
                                 args.pause_s))
    else:
        with tempfile.TemporaryDirectory(prefix="hybridrag-burst-") as tmp:
            server = spawn_server(Path(args.index).resolve(), args.config, 0, Path(tmp))
            try:
                wait_serving(server.target, 300.0, server)
                result = asyncio.run(run(server.target, queries, args.calls, args.bursts, args.channels,
                                         args.timeout_s, args.pause_s))
            finally:
                stop_server(server)
    r, h = result["refused_from_burst_start"], result["health_alone"]
    print(f"health alone p50 {h['p50_ms']} ms; refused {r['n']} (p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms from the "
          f"burst's start; own p50 {result['refused_own_latency']['p50_ms']} ms); admitted per burst "
          f"{result['admitted_per_burst']}; OK p50 {result['ok_from_burst_start']['p50_ms']} ms; other "
          f"{result['other_codes']}")
    if args.json:
        write_result(args.json, f"burst_{Path(args.dataset).name}",
                     {k: v for k, v in vars(args).items() if k != "json"}, result | {"machine": machine()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
