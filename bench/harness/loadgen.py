"""Load generators: closed loop (C callers, request after request) and open loop (requests on a schedule,
whatever the completions) against a server over gRPC or its HTTP door; closed loops in process (asyncio callers
of an async function, or threads of a blocking one); and the per-level summaries every benchmark reports.

Over the network (:class:`LevelSpec`): the raw generated stub (no retry), so every refusal is counted by its status
code name; a request counts when it completes inside the measured window (after ``warmup``); the client's CPU
(and the server's, given its pid) is sampled over that window. ``run_level(spec, procs)`` spreads the callers over
``procs`` client processes (each its own event loop and channels; results merged).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bench.harness.server import grpc_metadata, proc_cpu_seconds
from bench.harness.stats import ms_since, percentiles, ratio

# ---------------------------------------------------------------------------------------------- what is sent


@dataclass(frozen=True)
class RequestSpec:
    """What each request asks (picklable: it travels to client processes)."""

    top_k: int = 10
    stages: tuple[str, ...] = ()
    bypass_cache: bool = True
    timeout_s: float = 10.0
    api_key: str = ""


@dataclass(frozen=True)
class LevelSpec:
    target: str
    queries: tuple[tuple[str, str], ...]
    concurrency: int
    duration: float
    warmup: float
    request: RequestSpec = RequestSpec()
    rpc: str = "retrieve"  # or "health": the client's ceiling (a call that does nothing on the server)
    channels: int = 4
    transport: str = "grpc"  # or "http": the same calls through the HTTP door (target = its base URL)
    query_offset: int = 0
    server_pid: int | None = None


@dataclass
class Samples:
    """Raw outcomes of one measured window (merged across client processes)."""

    ok_ms: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    degraded: int = 0
    cache_hits: int = 0
    stage_sum: Counter = field(default_factory=Counter)
    stage_n: Counter = field(default_factory=Counter)
    run: dict[str, dict[str, float]] = field(default_factory=dict)
    cpu_s: float = 0.0
    wall_s: float = 0.0
    server_cpu_s: float | None = None

    def merge(self, other: Samples) -> None:
        self.ok_ms += other.ok_ms
        self.errors.update(other.errors)
        self.degraded += other.degraded
        self.cache_hits += other.cache_hits
        self.stage_sum.update(other.stage_sum)
        self.stage_n.update(other.stage_n)
        for q, docs in other.run.items():
            self.run.setdefault(q, docs)
        self.cpu_s += other.cpu_s
        self.wall_s = max(self.wall_s, other.wall_s)
        if other.server_cpu_s is not None:
            self.server_cpu_s = other.server_cpu_s

    def record_ok(self, response: Any, latency_ms: float) -> None:
        self.ok_ms.append(latency_ms)
        self.degraded += bool(response.degraded)
        self.cache_hits += bool(response.cache_hit)
        for k, v in response.timings_ms.items():
            self.stage_sum[k] += v
            self.stage_n[k] += 1


def served_run(passages: Sequence[Any]) -> dict[str, float]:
    """Ranked doc ids -> rank-based scores (n, n-1, ...): evaluation sees exactly the served order (a reranked
    head and the tail below it carry scores of different stages, which must not be re-sorted).

    >>> from types import SimpleNamespace as P
    >>> served_run([P(doc_id="a"), P(doc_id="b")])
    {'a': 2.0, 'b': 1.0}
    """
    n = len(passages)
    return {p.doc_id: float(n - r) for r, p in enumerate(passages)}


# ---------------------------------------------------------------------------------------------- clients


class HttpStatus(Exception):
    """A non-200 answer of the HTTP door, named by the error's gRPC status (the door's JSON says it)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class _HttpPassage:
    doc_id: str


@dataclass
class _HttpAnswer:
    """What the samples read of an answer (the fields of RetrieveResponse the bench uses), from its JSON."""

    passages: list[_HttpPassage]
    degraded: bool
    cache_hit: bool
    timings_ms: dict[str, float]


def make_channels(spec: LevelSpec, n: int) -> list[Any]:
    """n gRPC channels (each its own TCP connection), or n HTTP clients whose keep-alive pools hold the level's
    callers (HTTP/1.1: one request at a time per connection)."""
    if spec.transport == "http":
        import httpx

        per = max(1, -(-spec.concurrency // n))
        return [httpx.AsyncClient(base_url=spec.target, timeout=spec.request.timeout_s,
                                  limits=httpx.Limits(max_connections=per, max_keepalive_connections=per))
                for _ in range(n)]
    import grpc

    # a local subchannel pool: each channel its own TCP connection (by default equal channels share one)
    return [grpc.aio.insecure_channel(spec.target, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(n)]


async def close_channels(spec: LevelSpec, channels: list[Any]) -> None:
    for c in channels:
        await (c.aclose() if spec.transport == "http" else c.close())


def _http_callables(clients: list[Any], spec: LevelSpec) -> list[Callable[[str], Awaitable[Any]]]:
    from retrieval.serving.http.door import TIMEOUT_HEADER

    r = spec.request
    headers = {"authorization": f"Bearer {r.api_key}"} if r.api_key else {}
    headers[TIMEOUT_HEADER] = str(int(r.timeout_s * 1000))

    def make(client: Any) -> Callable[[str], Awaitable[Any]]:
        async def call(text: str) -> Any:
            if spec.rpc == "health":
                resp = await client.get("/healthz")
                if resp.status_code != 200:
                    raise HttpStatus(f"HTTP_{resp.status_code}")
                return resp
            body: dict[str, Any] = {"query": text, "top_k": r.top_k, "bypass_cache": r.bypass_cache}
            if r.stages:
                body["options"] = {"stages": list(r.stages)}
            resp = await client.post("/v1/retrieve", json=body, headers=headers)
            data = resp.json()
            if resp.status_code != 200:
                raise HttpStatus(data.get("error", {}).get("status") or f"HTTP_{resp.status_code}")
            return _HttpAnswer([_HttpPassage(p["doc_id"]) for p in data["passages"]], data["degraded"],
                               data["cache_hit"], data["timings_ms"])
        return call

    return [make(c) for c in clients]


def callables(channels: list[Any], spec: LevelSpec) -> list[Callable[[str], Awaitable[Any]]]:
    """One awaitable per channel: ``call(text)`` sends the RPC under test with the per-request deadline."""
    if spec.transport == "http":
        return _http_callables(channels, spec)
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from retrieval.api import retriever_pb2 as pb
    from retrieval.api import retriever_pb2_grpc as pb_grpc

    r = spec.request
    md = grpc_metadata(r.api_key)
    if spec.rpc == "health":
        req = health_pb2.HealthCheckRequest()
        def check(stub: Any) -> Callable[[str], Awaitable[Any]]:
            return lambda _text: stub.Check(req, timeout=r.timeout_s)

        return [check(health_pb2_grpc.HealthStub(c)) for c in channels]
    options = pb.StageOptions(stages=list(r.stages))

    def make(stub: Any) -> Callable[[str], Awaitable[Any]]:
        return lambda text: stub.Retrieve(pb.RetrieveRequest(query=text, top_k=r.top_k, options=options,
                                                             bypass_cache=r.bypass_cache), timeout=r.timeout_s, metadata=md)

    return [make(pb_grpc.RetrieverStub(c)) for c in channels]


def status_of(e: BaseException) -> str:
    """The status code name of a failed call: gRPC's, the HTTP door's, or the exception's type."""
    import grpc

    if isinstance(e, grpc.aio.AioRpcError):
        return e.code().name
    if isinstance(e, HttpStatus):
        return e.code
    return type(e).__name__


async def _cpu_window(start: float, end: float, server_pid: int | None, out: Samples) -> None:
    """Client (and spawned server) CPU seconds between two perf_counter instants."""
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    c0, w0, s0 = time.process_time(), time.perf_counter(), proc_cpu_seconds(server_pid)
    await asyncio.sleep(max(0.0, end - time.perf_counter()))
    c1, w1, s1 = time.process_time(), time.perf_counter(), proc_cpu_seconds(server_pid)
    out.cpu_s, out.wall_s = c1 - c0, w1 - w0
    out.server_cpu_s = None if s0 is None or s1 is None else s1 - s0


# ---------------------------------------------------------------------------------------------- closed loop


async def closed_loop(spec: LevelSpec) -> Samples:
    """C callers, request after request, for warmup + duration; outcomes completed in the window are counted."""
    channels = make_channels(spec, max(1, min(spec.concurrency, spec.channels)))
    calls = callables(channels, spec)
    out = Samples()
    counter = itertools.count(spec.query_offset)
    queries = spec.queries
    t0 = time.perf_counter()
    start, end = t0 + spec.warmup, t0 + spec.warmup + spec.duration

    async def caller(i: int) -> None:
        call = calls[i % len(calls)]
        while time.perf_counter() < end:
            qid, text = queries[next(counter) % len(queries)]
            t = time.perf_counter()
            try:
                response, code = await call(text), "OK"
            except Exception as e:  # noqa: BLE001  (counted by its status, never hidden)
                response, code = None, status_of(e)
            done = time.perf_counter()
            if response is not None and spec.rpc == "retrieve" and qid not in out.run:
                out.run[qid] = served_run(response.passages)
            if not start <= done <= end:
                continue
            if code != "OK":
                out.errors[code] += 1
            elif spec.rpc == "retrieve":
                out.record_ok(response, (done - t) * 1000)
            else:
                out.ok_ms.append((done - t) * 1000)

    try:
        await asyncio.gather(_cpu_window(start, end, spec.server_pid, out),
                             *(caller(i) for i in range(spec.concurrency)))
    finally:
        await close_channels(spec, channels)
    return out


def _child(spec: LevelSpec, barrier: Any, results: Any, index: int) -> None:
    """A client process: wait until every process is ready, run its share, send the samples back."""
    barrier.wait()
    results.put((index, asyncio.run(closed_loop(spec))))


def split_level(spec: LevelSpec, procs: int) -> list[LevelSpec]:
    """The callers spread over processes (the first ones take the remainder), each starting at its own place in
    the query list; only the first samples the server's CPU.

    >>> s = LevelSpec("t", (("a", "x"),) * 10, 5, 1.0, 0.0, server_pid=7)
    >>> [(p.concurrency, p.query_offset, p.server_pid) for p in split_level(s, 2)]
    [(3, 0, 7), (2, 5, None)]
    """
    n = len(spec.queries)
    shares = [spec.concurrency // procs + (i < spec.concurrency % procs) for i in range(procs)]
    return [replace(spec, concurrency=c, query_offset=spec.query_offset + i * n // procs,
                    server_pid=spec.server_pid if i == 0 else None) for i, c in enumerate(shares) if c > 0]


def run_level(spec: LevelSpec, procs: int = 1) -> Samples:
    """Run one level in this process, or spread over ``procs`` spawned processes (grpc does not survive fork)."""
    if procs <= 1 or spec.concurrency <= 1:
        return asyncio.run(closed_loop(spec))
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parts = split_level(spec, procs)
    barrier, results = ctx.Barrier(len(parts)), ctx.Queue()
    workers = [ctx.Process(target=_child, args=(p, barrier, results, i), daemon=True) for i, p in enumerate(parts)]
    for w in workers:
        w.start()
    got: list[tuple[int, Samples]] = []
    while len(got) < len(workers):
        try:
            got.append(results.get(timeout=1.0))
        except queue.Empty:
            failed = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"a client process failed (exit codes {failed})") from None
    merged = Samples()
    for _, samples in sorted(got, key=lambda x: x[0]):
        merged.merge(samples)
    for w in workers:
        w.join(timeout=30)
    return merged


def level_summary(s: Samples, concurrency: int, duration: float) -> dict[str, Any]:
    """One closed-loop level: QPS (OK completions / window), latency percentiles of the OK ones, errors by status,
    degraded answers, cache hits, mean per-stage server times, client (and server) CPU use."""
    ok = len(s.ok_ms)
    out: dict[str, Any] = {"concurrency": concurrency, "requests": ok + sum(s.errors.values()), "ok": ok,
                           "qps": round(ok / duration, 2), **percentiles(s.ok_ms), "errors": dict(s.errors),
                           "degraded": s.degraded, "cache_hits": s.cache_hits,
                           "stage_ms": {k: round(s.stage_sum[k] / s.stage_n[k], 3) for k in sorted(s.stage_sum)},
                           "client_cpu_util": ratio(s.cpu_s, s.wall_s)}
    if s.server_cpu_s is not None and s.wall_s:
        out["server_cpu_util"] = ratio(s.server_cpu_s, s.wall_s)
    return out


def measure_level(spec: LevelSpec, procs: int = 1, calibration_s: float = 0.0) -> tuple[dict[str, Any], Samples]:
    """One closed-loop level summarised; with ``calibration_s`` followed by the same client at the same C against
    the do-nothing health call: ``client_ceiling_qps``, ``client_headroom`` (ceiling / service QPS) and
    ``health_p50_ms`` (the door's own floor)."""
    samples = run_level(spec, procs)
    entry = level_summary(samples, spec.concurrency, spec.duration)
    if calibration_s > 0:
        cal = run_level(replace(spec, rpc="health", duration=calibration_s, warmup=min(spec.warmup, 0.5),
                                server_pid=None), procs)
        entry["client_ceiling_qps"] = round(len(cal.ok_ms) / calibration_s, 1)
        entry["client_headroom"] = ratio(entry["client_ceiling_qps"], entry["qps"], 1)
        entry["health_p50_ms"] = percentiles(cal.ok_ms)["p50_ms"]
    return entry, samples


def vs_reference(reference: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]]) -> dict[str, dict]:
    """Per level present in both: p50, p99 and QPS of ``other`` over ``reference``.

    >>> vs_reference({"1": {"p50_ms": 10.0, "p99_ms": 20.0, "qps": 100.0}},
    ...              {"1": {"p50_ms": 15.0, "p99_ms": 30.0, "qps": 50.0}})
    {'1': {'p50_ratio': 1.5, 'p99_ratio': 1.5, 'qps_ratio': 0.5}}
    """
    return {c: {"p50_ratio": ratio(e.get("p50_ms"), reference[c].get("p50_ms")),
                "p99_ratio": ratio(e.get("p99_ms"), reference[c].get("p99_ms")),
                "qps_ratio": ratio(e.get("qps"), reference[c].get("qps"))}
            for c, e in other.items() if c in reference}


async def answer_each(spec: LevelSpec) -> dict[str, dict[str, float]]:
    """Every query of ``spec`` once, one after another (no load): the served run (qid -> ranked doc ids), for the
    quality of a fixed query set that does not depend on how many queries a level got through."""
    channels = make_channels(spec, 1)
    call = callables(channels, spec)[0]
    run: dict[str, dict[str, float]] = {}
    try:
        for qid, text in spec.queries:
            try:
                run[qid] = served_run((await call(text)).passages)
            except Exception:  # noqa: BLE001  (an unanswered query scores 0)
                run[qid] = {}
    finally:
        await close_channels(spec, channels)
    return run


# ---------------------------------------------------------------------------------------------- open loop


def arrival_offsets(rate: float, warmup: float, duration: float, arrivals: str, seed: int) -> list[tuple[float, bool]]:
    """Send times (s from the start) and whether each is in the measured window: constant spacing 1/rate (the
    window then holds exactly duration x rate requests), or a Poisson process of that rate.

    >>> arrival_offsets(2.0, 1.0, 1.0, "fixed", 0)
    [(0.0, False), (0.5, False), (1.0, True), (1.5, True)]
    """
    if arrivals == "fixed":
        before = [(i / rate, False) for i in range(int(np.ceil(warmup * rate - 1e-9)))]
        return before + [(warmup + i / rate, True) for i in range(int(round(duration * rate)))]
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < warmup + duration:
        out.append((t, t >= warmup))
        t += rng.expovariate(rate)
    return out


def _rate(times: list[float]) -> float | None:
    """Events per second over the span of a sorted list of instants."""
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None


async def open_loop(spec: LevelSpec, rate: float, arrivals: str = "fixed", seed: int = 0) -> dict[str, Any]:
    """Fire requests on schedule whatever the completions; count those scheduled in the measured window."""
    channels = make_channels(spec, max(1, spec.channels))
    calls = callables(channels, spec)
    schedule = arrival_offsets(rate, spec.warmup, spec.duration, arrivals, seed)
    status: Counter = Counter()
    latency: dict[str, list[float]] = {}
    lateness: list[float] = []
    sent_at: list[float] = []
    due_at: list[float] = []
    outstanding = max_outstanding = 0
    cpu = Samples()

    async def one(i: int, measured: bool) -> None:
        nonlocal outstanding
        _qid, text = spec.queries[(spec.query_offset + i) % len(spec.queries)]
        t = time.perf_counter()
        try:
            await calls[i % len(calls)](text)
            code = "OK"
        except Exception as e:  # noqa: BLE001
            code = status_of(e)
        finally:
            outstanding -= 1
        if measured:
            status[code] += 1
            latency.setdefault(code, []).append(ms_since(t))

    t0 = time.perf_counter() + 0.05
    sampler = asyncio.create_task(_cpu_window(t0 + spec.warmup, t0 + spec.warmup + spec.duration, spec.server_pid, cpu))
    tasks = []
    try:
        for i, (off, measured) in enumerate(schedule):
            due = t0 + off
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if measured:
                now = time.perf_counter()
                lateness.append((now - due) * 1000)
                sent_at.append(now)
                due_at.append(due)
            outstanding += 1
            max_outstanding = max(max_outstanding, outstanding)
            tasks.append(asyncio.create_task(one(i, measured)))
        await asyncio.gather(*tasks)
        await sampler
    finally:
        await close_channels(spec, channels)
    return open_summary(rate, spec.duration, status, latency, lateness, (_rate(due_at), _rate(sent_at)),
                        max_outstanding, cpu)


def open_summary(rate: float, duration: float, status: Counter, latency: dict[str, list[float]], lateness: list[float],
                 send_rates: tuple[float | None, float | None], max_outstanding: int, cpu: Samples) -> dict[str, Any]:
    """``send_rates``: (scheduled, achieved) send rate over the measured window (Poisson: the realised schedule's)."""
    sent = sum(status.values())
    rejected = latency.get("RESOURCE_EXHAUSTED", [])
    rej = percentiles(rejected)
    late = percentiles(lateness or [0.0])
    scheduled, achieved = (None if r is None else round(r, 2) for r in send_rates)
    out = {"offered_rps": rate, "sent": sent, "scheduled_send_rps": scheduled, "achieved_send_rps": achieved,
           "ok_rps": round(status.get("OK", 0) / duration, 2), "status": dict(status),
           **percentiles(latency.get("OK", [])),
           "rejected_share": round(len(rejected) / sent, 4) if sent else 0.0,
           "rejected_p50_ms": rej["p50_ms"], "rejected_p99_ms": rej["p99_ms"], "max_outstanding": max_outstanding,
           "send_lateness_ms": {"p50": late["p50_ms"], "p99": late["p99_ms"], "max": late["max_ms"]},
           "client_cpu_util": ratio(cpu.cpu_s, cpu.wall_s)}
    if cpu.server_cpu_s is not None and cpu.wall_s:
        out["server_cpu_util"] = ratio(cpu.server_cpu_s, cpu.wall_s)
    return out


# ---------------------------------------------------------------------------------------------- in process


async def closed_loop_async(call: Callable[[str], Awaitable[Any]], queries: Sequence[str], concurrency: int,
                            duration: float) -> dict[str, Any]:
    """C asyncio callers of ``call(query)`` (e.g. ``Pipeline.search_async``, as the server calls it), the queries
    cycled, for ``duration`` s: QPS, latency percentiles, errors (any exception, counted)."""
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + duration
    counter = itertools.count()

    async def caller() -> None:
        nonlocal errors
        while time.perf_counter() < stop:
            q = queries[next(counter) % len(queries)]
            t = time.perf_counter()
            try:
                await call(q)
            except Exception:  # noqa: BLE001  (counted)
                errors += 1
                continue
            latencies.append(ms_since(t))

    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    return {"qps": round(len(latencies) / elapsed, 2), **percentiles(latencies), "requests": len(latencies),
            "errors": errors}


def closed_loop_threads(call: Callable[[str], Any], queries: Sequence[str], callers: int,
                        until: Callable[[], bool]) -> list[float]:
    """``callers`` threads calling ``call(query)`` one after another (caller c takes queries c, c + callers, ...)
    until ``until()``; every call's latency (ms)."""
    lat: list[float] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run(c: int) -> None:
        i = c
        try:
            while not until():
                t = time.perf_counter()
                call(queries[i % len(queries)])
                ms = ms_since(t)
                with lock:
                    lat.append(ms)
                i += callers
        except BaseException as e:  # noqa: BLE001  (raised below, in the caller's thread)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(c,)) for c in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return lat


def for_seconds(seconds: float) -> Callable[[], bool]:
    """An ``until`` for :func:`closed_loop_threads`: true once ``seconds`` have passed."""
    end = time.monotonic() + seconds
    return lambda: time.monotonic() > end
