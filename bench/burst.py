"""Refusals past saturation: how fast a burst's excess gets RESOURCE_EXHAUSTED (issue #26).

A spawned server (``hybridrag serve``, default ``max_in_flight`` 64), or ``hybridrag front`` (nginx) before it
(``--front LIMIT``), receives ``--calls`` calls at once over ``--channels`` connections, after a warm-up. Each
call's latency is measured from the burst's start (the moment the first call is sent) and from its own send. The
figures that matter: the p50/p95 of the refused calls from the burst's start, against the p50 of a do-nothing
health Check sent alone (the transport's own floor), and how many calls were admitted.

Two clients: ``python`` (one asyncio grpc client: it needs 65-70 ms on 2 cores just to send 200 calls and read
their answers, so its figures floor there whatever the server does) and ``h2load`` (nghttp2's native HTTP/2 load
generator, speaking gRPC's framing: all 200 calls are on the wire within a millisecond). h2load sees HTTP statuses,
not gRPC's trailers: through the front a refusal is HTTP 204 (nginx's trailers-only answer) and told apart; direct
to the server every call is HTTP 200, so only the distribution of all calls is reported (with ``max_in_flight``
1 nearly all of them are refusals: the Python server's own floor). ``--rpc health`` bursts do-nothing health
Checks instead: what the Python gRPC server costs per call before any handler of ours. Usage::

    python -m bench.burst --index indexes/scifact --dataset ../shared/data/beir/scifact [--calls 200] [--bursts 5]
        [--client python|h2load] [--front 64] [--rpc retrieve|health]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.harness import ms_since, percentiles, query_list, write_result
from bench.harness.loadgen import LevelSpec, RequestSpec, callables, close_channels, make_channels, status_of
from bench.harness.server import api_key, fronted, served


async def one_burst(calls: list[Any], queries: list[str], n: int) -> dict[str, Any]:
    """``n`` calls at once (``calls``: the harness's callables, Retrieve or health Check), each one's latency from
    the burst's start and from its own send, by status code."""
    t0 = time.perf_counter()

    async def call(i: int) -> tuple[str, float, float]:
        sent = time.perf_counter()
        try:
            await calls[i % len(calls)](queries[i % len(queries)])
            code = "OK"
        except Exception as e:  # noqa: BLE001  (counted by its status)
            code = status_of(e)
        return code, ms_since(t0), ms_since(sent)

    results = await asyncio.gather(*(call(i) for i in range(n)))
    by_code: dict[str, list[tuple[float, float]]] = {}
    for code, from_start, own in results:
        by_code.setdefault(code, []).append((from_start, own))
    return {code: [r[0] for r in rs] for code, rs in by_code.items()} | {
        "_own": {code: [r[1] for r in rs] for code, rs in by_code.items()}}


async def run(target: str, queries: list[str], calls: int, bursts: int, channels: int, timeout_s: float,
              pause_s: float, rpc: str = "retrieve") -> dict[str, Any]:
    spec = LevelSpec(target, tuple(("", q) for q in queries), calls, 0.0, 0.0,
                     RequestSpec(top_k=10, bypass_cache=True, timeout_s=timeout_s, api_key=api_key()),
                     channels=channels)
    chans = make_channels(spec, channels)
    retrieve = callables(chans, spec)
    health = callables(chans, replace(spec, rpc="health"))
    try:
        for q in queries[:20]:  # warm-up: connections, sessions
            await retrieve[0](q)
        idle = []
        for _ in range(50):
            t = time.perf_counter()
            await health[0]("")
            idle.append(ms_since(t))
        refused: list[float] = []
        refused_own: list[float] = []
        ok: list[float] = []
        other: dict[str, int] = {}
        admitted = []
        for _ in range(bursts):
            r = await one_burst(health if rpc == "health" else retrieve, queries, calls)
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
        await close_channels(spec, chans)
    return {"client": "python", "rpc": rpc, "calls_per_burst": calls, "bursts": bursts, "channels": channels,
            "health_alone": percentiles(idle), "refused_from_burst_start": percentiles(refused),
            "refused_own_latency": percentiles(refused_own), "ok_from_burst_start": percentiles(ok),
            "admitted_per_burst": admitted, "other_codes": other}


H2LOAD_REFUSED = 204  # nginx's trailers-only RESOURCE_EXHAUSTED (retrieval/serving/front.py); the server answers 200


def grpc_frame(message: Any) -> bytes:
    """A gRPC message on the wire: uncompressed flag, big-endian length, the bytes.

    >>> grpc_frame(type("M", (), {"SerializeToString": lambda self: b"ab"})())
    b'\\x00\\x00\\x00\\x00\\x02ab'
    """
    body = message.SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


def run_h2load(target: str, query: str, calls: int, bursts: int, channels: int, pause_s: float, rpc: str,
               workdir: Path) -> dict[str, Any]:
    """Bursts sent by h2load (native, HTTP/2, gRPC framing): every call on the wire within about a millisecond.
    One request body for every call (the first query; ``bypass_cache`` so that none is a cache hit)."""
    from grpc_health.v1 import health_pb2

    from retrieval.api import retriever_pb2 as pb

    binary = shutil.which("h2load")
    if binary is None:
        raise SystemExit("bench.burst --client h2load: h2load not found (Debian: apt-get install nghttp2-client)")
    if rpc == "health":
        path, message = "/grpc.health.v1.Health/Check", health_pb2.HealthCheckRequest()
    else:
        path, message = "/hybridrag.v1.Retriever/Retrieve", pb.RetrieveRequest(query=query, top_k=10,
                                                                              bypass_cache=True)
    body = workdir / "body.bin"
    body.write_bytes(grpc_frame(message))
    url = f"http://{target}{path}"
    common = ["-H", "content-type: application/grpc", "-H", "te: trailers", "-d", str(body)]
    subprocess.run([binary, "-n", "20", "-c", "1", *common, url], capture_output=True, check=True)  # warm-up
    alone = workdir / "alone.tsv"
    subprocess.run([binary, "-n", "50", "-c", "1", "--log-file", str(alone), *common, url], capture_output=True,
                   check=True)
    idle = [int(line.split("\t")[2]) / 1000.0 for line in alone.read_text().splitlines() if line]
    every: list[float] = []
    refused: list[float] = []
    passed: list[float] = []
    spread: list[float] = []
    refused_per_burst: list[int] = []
    for b in range(bursts):
        log = workdir / f"burst{b}.tsv"
        subprocess.run([binary, "-n", str(calls), "-c", str(channels), "-m", str(math.ceil(calls / channels)),
                        "--log-file", str(log), *common, url], capture_output=True, check=True)
        rows = [line.split("\t") for line in log.read_text().splitlines() if line]
        start = min(int(r[0]) for r in rows)
        spread.append((max(int(r[0]) for r in rows) - start) / 1000.0)
        n_refused = 0
        for r in rows:
            from_start = (int(r[0]) - start) / 1000.0 + int(r[2]) / 1000.0
            every.append(from_start)
            if int(r[1]) == H2LOAD_REFUSED:
                refused.append(from_start)
                n_refused += 1
            else:
                passed.append(from_start)
        refused_per_burst.append(n_refused)
        time.sleep(pause_s)
    return {"client": "h2load", "rpc": rpc, "calls_per_burst": calls, "bursts": bursts, "channels": channels,
            "alone": percentiles(idle), "all_from_burst_start": percentiles(every),
            "refused_by_front_from_burst_start": percentiles(refused), "passed_from_burst_start": percentiles(passed),
            "refused_by_front_per_burst": refused_per_burst, "send_spread_ms": percentiles(spread)}


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
    ap.add_argument("--client", choices=("python", "h2load"), default="python",
                    help="who sends the burst: one asyncio grpc client, or h2load (native; nghttp2-client)")
    ap.add_argument("--rpc", choices=("retrieve", "health"), default="retrieve",
                    help="what the burst calls: Retrieve, or the do-nothing health Check (the transport's floor)")
    ap.add_argument("--front", type=int, default=0, metavar="LIMIT",
                    help="with --index: burst `hybridrag front` (nginx) at LIMIT reads in flight before the server")
    ap.add_argument("--label", default="", help="names this run in the JSON (e.g. the server settings given by env)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.front and not args.index:
        ap.error("--front needs --index (the front is spawned before the spawned server)")
    queries = [t for _, t in query_list(args.dataset, "test", 0)[0]]

    def measure(target: str, workdir: Path) -> dict[str, Any]:
        if args.client == "h2load":
            return run_h2load(target, queries[0], args.calls, args.bursts, args.channels, args.pause_s, args.rpc,
                              workdir)
        return asyncio.run(run(target, queries, args.calls, args.bursts, args.channels, args.timeout_s,
                               args.pause_s, args.rpc))

    with tempfile.TemporaryDirectory(prefix="hybridrag-burst-") as tmp:
        if args.target:
            result = measure(args.target, Path(tmp))
        else:
            with served(args.index, Path(tmp), config=args.config) as server, \
                    fronted(server.target, args.front, Path(tmp)) as target:
                result = measure(target, Path(tmp))
    if args.client == "h2load":
        a, r = result["all_from_burst_start"], result["refused_by_front_from_burst_start"]
        print(f"h2load, {args.rpc}: alone p50 {result['alone']['p50_ms']} ms; all calls p50 {a['p50_ms']} ms, p95 "
              f"{a['p95_ms']} ms from the burst's start (sent within {result['send_spread_ms']['max_ms']} ms); "
              f"refused by the front {r['n']} (p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms), per burst "
              f"{result['refused_by_front_per_burst']}; passed p50 {result['passed_from_burst_start']['p50_ms']} ms")
    else:
        r, h = result["refused_from_burst_start"], result["health_alone"]
        print(f"health alone p50 {h['p50_ms']} ms; refused {r['n']} (p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms from "
              f"the burst's start; own p50 {result['refused_own_latency']['p50_ms']} ms); admitted per burst "
              f"{result['admitted_per_burst']}; OK p50 {result['ok_from_burst_start']['p50_ms']} ms; other "
              f"{result['other_codes']}")
    if args.json:
        write_result(args.json, f"burst_{Path(args.dataset).name}",
                     {k: v for k, v in vars(args).items() if k != "json"}, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
