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

``--index`` starts ``python -m hybridrag serve`` as a subprocess (so client and server do not share a GIL; the
embedded LLM server is switched off in it and ``/metrics`` takes a free port) on a free port, waits for health
SERVING and stops it at the end (SIGTERM). With ``--index`` the baseline runs before the server starts.
``HYBRIDRAG_API_KEY`` is sent as the API key when set.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import write_result
from retrieval.serving.http_common import TIMEOUT_HEADER

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CE_ONNX = REPO.parent / "shared" / "models" / "ce-minilm-l6-beir-train"
HEADROOM_WARN = 3.0
CPU_WARN = 0.75
BASELINE_NOTE = ("the baseline answers one query after another: its QPS and latency are the same at every level; "
                 "for C > 1 its latency is a lower bound (a sequential server would queue the C concurrent requests)")


# ---------------------------------------------------------------------------------------------- the target


@dataclass
class SpawnedServer:
    proc: subprocess.Popen
    target: str
    log_path: Path
    http_url: str = ""

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_server(index: Path, config: str | None, threads: int, log_dir: Path, http: bool = False) -> SpawnedServer:
    """``python -m hybridrag serve`` on a free loopback port (and, with ``http``, its HTTP door on another), its
    output in a log file (a pipe could fill)."""
    port = free_port()
    cmd = [sys.executable, "-m", "hybridrag", "serve", "--index", str(index), "--port", str(port),
           "--host", "127.0.0.1"]
    http_port = free_port() if http else 0
    if http:
        cmd += ["--http-port", str(http_port)]
    if config:
        cmd += ["--config", str(Path(config).resolve())]
    if threads:
        cmd += ["--threads", str(threads)]
    log_path = log_dir / f"hybridrag-serve-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=server_env())
    return SpawnedServer(proc, f"127.0.0.1:{port}", log_path, f"http://127.0.0.1:{http_port}" if http else "")


def spawn_front(target: str, limit: int, workdir: Path) -> tuple[subprocess.Popen, str]:
    """``hybridrag front`` (nginx, retrieval/serving/front.py) before a server at ``target``, ``limit`` reads in
    flight, on a free loopback port: the process and the front's gRPC address (stop with ``stop_front``)."""
    from retrieval.serving.front import FrontConfig, start_front

    port = free_port()
    return start_front(FrontConfig(grpc_backends=(target,), port=port, max_in_flight=limit), workdir / "front"), \
        f"127.0.0.1:{port}"


def server_env() -> dict[str, str]:
    """The spawned server's environment (a variable the caller set wins): no embedded llama.cpp server competing
    for the CPU (Retrieve does not need it), and ``/metrics`` on a free port rather than the fixed default, so a
    server already running here does not make the spawned one fail."""
    import dataclasses

    from retrieval.config import AppConfig

    env = dict(os.environ)
    env.setdefault("HYBRIDRAG_GENERATION__EMBEDDED__ENABLED", "false")
    if "metrics" in {f.name for f in dataclasses.fields(AppConfig)}:
        env.setdefault("HYBRIDRAG_METRICS__PORT", "0")
    return env


def wait_serving(target: str, timeout_s: float, server: SpawnedServer | None = None) -> None:
    """Poll grpc.health.v1 Check until SERVING (the server listens at once and turns SERVING once loaded)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if server is not None and server.proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {server.proc.returncode}:\n{server.log_tail()}")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    tail = f":\n{server.log_tail()}" if server is not None else ""
    raise RuntimeError(f"{target} was not SERVING after {timeout_s:.0f} s{tail}")


def stop_server(server: SpawnedServer, timeout_s: float = 30.0) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


def server_status(target: str, api_key: str) -> dict[str, Any]:
    """GetIndexStatus of the target, the parts that identify what was measured."""
    import grpc

    from retrieval.api import retriever_pb2 as pb
    from retrieval.api import retriever_pb2_grpc as pb_grpc

    with grpc.insecure_channel(target) as channel:
        s = pb_grpc.RetrieverStub(channel).GetIndexStatus(pb.GetIndexStatusRequest(), timeout=10.0,
                                                         metadata=_metadata(api_key))
    return {"generation": s.generation, "documents": s.documents, "chunks": s.chunks, "models": dict(s.models),
            "dense_available": s.dense_available, "late_interaction_available": s.late_interaction_available,
            "snapshot_path": s.snapshot_path}


def proc_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process and its descendants (Linux /proc: a server with several processes
    counts them all), None when unknown."""
    if pid is None:
        return None

    def own(p: int) -> tuple[int, float]:  # (parent pid, CPU seconds)
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    try:
        _, total = own(pid)
    except (OSError, IndexError, ValueError):
        return None
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)], cpu[int(entry.name)] = own(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue  # exited meanwhile
    frontier = [pid]
    while frontier:
        children = [c for c, parent in parents.items() if parent in frontier]
        total += sum(cpu[c] for c in children)
        frontier = children
    return total


def _metadata(api_key: str) -> tuple[tuple[str, str], ...]:
    return (("x-api-key", api_key),) if api_key else ()


# ---------------------------------------------------------------------------------------------- closed loop


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
    request: RequestSpec
    rpc: str = "retrieve"  # or "health": the calibration
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

    def record_ok(self, qid: str, response: Any, latency_ms: float) -> None:
        self.ok_ms.append(latency_ms)
        self.degraded += bool(response.degraded)
        self.cache_hits += bool(response.cache_hit)
        for k, v in response.timings_ms.items():
            self.stage_sum[k] += v
            self.stage_n[k] += 1


def _run_entry(response: Any) -> dict[str, float]:
    """Ranked doc ids -> rank-based scores (n, n-1, ...): evaluation sees exactly the served order (a reranked
    head and the tail below it carry scores of different stages, which must not be re-sorted)."""
    n = len(response.passages)
    return {p.doc_id: float(n - r) for r, p in enumerate(response.passages)}


def _make_channels(spec: LevelSpec, n: int) -> list[Any]:
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


async def _close_channels(spec: LevelSpec, channels: list[Any]) -> None:
    for c in channels:
        await (c.aclose() if spec.transport == "http" else c.close())


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


def _http_callables(clients: list[Any], spec: LevelSpec):
    r = spec.request
    headers = {"authorization": f"Bearer {r.api_key}"} if r.api_key else {}
    headers[TIMEOUT_HEADER] = str(int(r.timeout_s * 1000))

    def make(client):
        async def call(text: str):
            if spec.rpc == "health":
                resp = await client.get("/healthz")
                if resp.status_code != 200:
                    raise HttpStatus(f"HTTP_{resp.status_code}")
                return resp
            body = {"query": text, "top_k": r.top_k, "bypass_cache": r.bypass_cache}
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


def _callables(channels: list[Any], spec: LevelSpec):
    """One awaitable per channel: ``call(text)`` sends the RPC under test with the per-request deadline."""
    if spec.transport == "http":
        return _http_callables(channels, spec)
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from retrieval.api import retriever_pb2 as pb
    from retrieval.api import retriever_pb2_grpc as pb_grpc

    r = spec.request
    md = _metadata(r.api_key)
    if spec.rpc == "health":
        stubs = [health_pb2_grpc.HealthStub(c) for c in channels]
        req = health_pb2.HealthCheckRequest()
        return [lambda _text, s=s: s.Check(req, timeout=r.timeout_s) for s in stubs]
    stubs = [pb_grpc.RetrieverStub(c) for c in channels]
    options = pb.StageOptions(stages=list(r.stages))

    def make(stub):
        return lambda text: stub.Retrieve(pb.RetrieveRequest(query=text, top_k=r.top_k, options=options,
                                                             bypass_cache=r.bypass_cache), timeout=r.timeout_s, metadata=md)

    return [make(s) for s in stubs]


async def _cpu_window(start: float, end: float, server_pid: int | None, out: Samples) -> None:
    """Client (and spawned server) CPU seconds between two perf_counter instants."""
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    c0, w0, s0 = time.process_time(), time.perf_counter(), proc_cpu_seconds(server_pid)
    await asyncio.sleep(max(0.0, end - time.perf_counter()))
    c1, w1, s1 = time.process_time(), time.perf_counter(), proc_cpu_seconds(server_pid)
    out.cpu_s, out.wall_s = c1 - c0, w1 - w0
    out.server_cpu_s = None if s0 is None or s1 is None else s1 - s0


async def closed_loop(spec: LevelSpec) -> Samples:
    """C callers, request after request, for warmup + duration; outcomes completed in the window are counted."""
    import grpc

    channels = _make_channels(spec, max(1, min(spec.concurrency, spec.channels)))
    calls = _callables(channels, spec)
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
                response = await call(text)
                code = "OK"
            except grpc.aio.AioRpcError as e:
                response, code = None, e.code().name
            except HttpStatus as e:
                response, code = None, e.code
            except Exception as e:  # noqa: BLE001  (counted, never hidden)
                response, code = None, type(e).__name__
            done = time.perf_counter()
            if response is not None and spec.rpc == "retrieve" and qid not in out.run:
                out.run[qid] = _run_entry(response)
            if not start <= done <= end:
                continue
            if code == "OK":
                if spec.rpc == "retrieve":
                    out.record_ok(qid, response, (done - t) * 1000)
                else:
                    out.ok_ms.append((done - t) * 1000)
            else:
                out.errors[code] += 1

    try:
        await asyncio.gather(_cpu_window(start, end, spec.server_pid, out),
                             *(caller(i) for i in range(spec.concurrency)))
    finally:
        await _close_channels(spec, channels)
    return out


def _child(spec: LevelSpec, barrier: Any, results: Any, index: int) -> None:
    """A client process: wait until every process is ready, run its share, send the samples back."""
    barrier.wait()
    results.put((index, asyncio.run(closed_loop(spec))))


def _split(spec: LevelSpec, procs: int) -> list[LevelSpec]:
    """The callers spread over processes (the first ones take the remainder), each starting at its own place in
    the query list; only the first samples the server's CPU."""
    from dataclasses import replace

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
    parts = _split(spec, procs)
    barrier, results = ctx.Barrier(len(parts)), ctx.Queue()
    workers = [ctx.Process(target=_child, args=(p, barrier, results, i), daemon=True) for i, p in enumerate(parts)]
    for w in workers:
        w.start()
    merged = Samples()
    got = []
    while len(got) < len(workers):
        try:
            got.append(results.get(timeout=1.0))
        except queue.Empty:
            failed = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"a client process failed (exit codes {failed})") from None
    for _, samples in sorted(got, key=lambda x: x[0]):
        merged.merge(samples)
    for w in workers:
        w.join(timeout=30)
    return merged


def _pct(values_ms: list[float]) -> dict[str, float | None]:
    if not values_ms:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None, "mean_ms": None}
    a = np.asarray(values_ms)
    return {"p50_ms": round(float(np.percentile(a, 50)), 2), "p95_ms": round(float(np.percentile(a, 95)), 2),
            "p99_ms": round(float(np.percentile(a, 99)), 2), "mean_ms": round(float(a.mean()), 2)}


def level_summary(s: Samples, concurrency: int, duration: float) -> dict[str, Any]:
    ok = len(s.ok_ms)
    out: dict[str, Any] = {"concurrency": concurrency, "requests": ok + sum(s.errors.values()), "ok": ok,
                           "qps": round(ok / duration, 2), **_pct(s.ok_ms), "errors": dict(s.errors),
                           "degraded": s.degraded, "cache_hits": s.cache_hits,
                           "stage_ms": {k: round(s.stage_sum[k] / s.stage_n[k], 3) for k in sorted(s.stage_sum)},
                           "client_cpu_util": round(s.cpu_s / s.wall_s, 3) if s.wall_s else None}
    if s.server_cpu_s is not None and s.wall_s:
        out["server_cpu_util"] = round(s.server_cpu_s / s.wall_s, 3)
    return out


# ---------------------------------------------------------------------------------------------- open loop


def arrival_offsets(rate: float, warmup: float, duration: float, arrivals: str, seed: int) -> list[tuple[float, bool]]:
    """Send times (s from the start) and whether each is in the measured window: constant spacing 1/rate (the
    window then holds exactly duration x rate requests), or a Poisson process of that rate."""
    if arrivals == "fixed":
        before = [(i / rate, False) for i in range(int(np.ceil(warmup * rate - 1e-9)))]
        return before + [(warmup + i / rate, True) for i in range(int(round(duration * rate)))]
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < warmup + duration:
        out.append((t, t >= warmup))
        t += rng.expovariate(rate)
    return out


async def open_loop(spec: LevelSpec, rate: float, arrivals: str, seed: int) -> dict[str, Any]:
    """Fire requests on schedule whatever the completions; count those scheduled in the measured window."""
    import grpc

    channels = _make_channels(spec, max(1, spec.channels))
    calls = _callables(channels, spec)
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
        except grpc.aio.AioRpcError as e:
            code = e.code().name
        except Exception as e:  # noqa: BLE001
            code = type(e).__name__
        finally:
            outstanding -= 1
        if measured:
            status[code] += 1
            latency.setdefault(code, []).append((time.perf_counter() - t) * 1000)

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
        await _close_channels(spec, channels)
    return open_summary(rate, spec.duration, status, latency, lateness, (_rate(due_at), _rate(sent_at)), max_outstanding,
                        cpu)


def _rate(times: list[float]) -> float | None:
    """Events per second over the span of a sorted list of instants."""
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None


def open_summary(rate: float, duration: float, status: Counter, latency: dict[str, list[float]], lateness: list[float],
                 send_rates: tuple[float | None, float | None], max_outstanding: int, cpu: Samples) -> dict[str, Any]:
    """``send_rates``: (scheduled, achieved) send rate over the measured window (Poisson: the realised schedule's)."""
    sent = sum(status.values())
    rejected = latency.get("RESOURCE_EXHAUSTED", [])
    rej = _pct(rejected)
    late = np.asarray(lateness) if lateness else np.zeros(1)
    scheduled, achieved = (None if r is None else round(r, 2) for r in send_rates)
    out = {"offered_rps": rate, "sent": sent, "scheduled_send_rps": scheduled, "achieved_send_rps": achieved,
           "ok_rps": round(status.get("OK", 0) / duration, 2), "status": dict(status), **_pct(latency.get("OK", [])),
           "rejected_share": round(len(rejected) / sent, 4) if sent else 0.0,
           "rejected_p50_ms": rej["p50_ms"], "rejected_p99_ms": rej["p99_ms"], "max_outstanding": max_outstanding,
           "send_lateness_ms": {"p50": round(float(np.percentile(late, 50)), 2),
                                "p99": round(float(np.percentile(late, 99)), 2), "max": round(float(late.max()), 2)},
           "client_cpu_util": round(cpu.cpu_s / cpu.wall_s, 3) if cpu.wall_s else None}
    if cpu.server_cpu_s is not None and cpu.wall_s:
        out["server_cpu_util"] = round(cpu.server_cpu_s / cpu.wall_s, 3)
    return out


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


def quality(qrels: dict, service_run: dict, baseline_run: dict | None) -> dict[str, Any]:
    from retrieval.evaluate import evaluate

    def ndcg(run: dict) -> dict[str, Any]:
        r = evaluate(qrels, run) if run else {"ndcg@10": None, "queries": 0}
        return {"ndcg@10": r["ndcg@10"], "queries": r["queries"]}

    out: dict[str, Any] = {"service_all": ndcg(service_run)}
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

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    entry["qps_ratio"] = ratio(entry["qps"], base.get("qps"))
    entry["p50_ratio"] = ratio(base.get("p50_ms"), entry["p50_ms"])
    entry["p99_ratio"] = ratio(base.get("p99_ms"), entry["p99_ms"])


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


def plot_closed(closed: dict[str, dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    closed = dict(sorted(closed.items(), key=lambda kv: int(kv[0])))
    cs = [int(c) for c in closed]
    rows = list(closed.values())
    base = next((r["baseline"] for r in rows if r.get("baseline")), None)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    ax = axes[0]
    for key, color in (("p50_ms", "C0"), ("p95_ms", "C1"), ("p99_ms", "C3")):
        ax.plot(cs, [r[key] if r[key] is not None else np.nan for r in rows], "o-", color=color,
                label=f"service {key[:-3]}")
        if base and base.get(key):
            ax.axhline(base[key], color=color, ls="--", lw=1, label=f"baseline {key[:-3]} (sequential)")
    ax.set(yscale="log", xlabel="concurrent callers C", ylabel="latency (ms)", title="latency")
    _log2_x(ax, cs)
    _plain_log_y(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(cs, [r["qps"] for r in rows], "o-", color="C0", label="service")
    ceiling = [r.get("client_ceiling_qps") for r in rows]
    if any(ceiling):
        ax.plot(cs, [v or np.nan for v in ceiling], "s:", color="grey", label="client ceiling (health Check)")
    if base and base.get("qps"):
        ax.axhline(base["qps"], color="C3", ls="--", label="baseline (sequential)")
    ax.set(yscale="log", xlabel="concurrent callers C", ylabel="OK requests / s", title="throughput")
    _log2_x(ax, cs)
    _plain_log_y(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    _plot_stages(axes[2], closed)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _log2_x(ax: Any, cs: list[int]) -> None:
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.xaxis.set_minor_locator(NullLocator())


def _plain_log_y(ax: Any) -> None:
    """Log-scale y ticks as plain numbers (20, 50, 100), not powers of ten; denser when the data span little.
    Call after plotting (the span is read from the axis limits)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    lo, hi = ax.get_ylim()
    span = hi / lo if lo > 0 else 1000.0
    subs = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0) if span < 30 else (1.0, 2.0, 5.0) if span < 2000 else (1.0,)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _plot_stages(ax: Any, closed: dict[str, dict]) -> None:
    """Stacked mean stage times per level, the mean total as a marker: bm25 runs alongside embed + dense, so
    the stack can exceed the total; queue waits (``*_queue``) are inside their stage and not stacked."""
    stages = sorted({k for r in closed.values() for k in r["stage_ms"] if k != "total" and not k.endswith("_queue")})
    x = np.arange(len(closed))
    bottom = np.zeros(len(closed))
    for i, st in enumerate(stages):
        vals = np.array([r["stage_ms"].get(st, 0.0) for r in closed.values()])
        ax.bar(x, vals, bottom=bottom, color=f"C{i % 10}", label=st)
        bottom += vals
    totals = [r["stage_ms"].get("total", np.nan) for r in closed.values()]
    ax.scatter(x, totals, marker="_", s=1500, linewidths=2.5, color="black", zorder=3, label="total (server)")
    ax.set_xticks(x, list(closed))
    ax.set(xlabel="concurrent callers C", ylabel="mean ms per request", title="server stage times (bm25 ∥ embed+dense)")
    ax.legend(fontsize=7, markerscale=0.3)


def plot_open(opened: dict[str, dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    opened = dict(sorted(opened.items(), key=lambda kv: float(kv[0])))
    rates = [float(r) for r in opened]
    rows = list(opened.values())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    ax = axes[0]
    for key, color in (("p50_ms", "C0"), ("p95_ms", "C1"), ("p99_ms", "C3")):
        ax.plot(rates, [r[key] if r[key] is not None else np.nan for r in rows], "o-", color=color,
                label=f"OK {key[:-3]}")
    rej = [r["rejected_p50_ms"] if r["rejected_p50_ms"] is not None else np.nan for r in rows]
    if not all(np.isnan(rej)):
        ax.plot(rates, rej, "x--", color="grey", label="RESOURCE_EXHAUSTED p50")
    ax.set(yscale="log", xlabel="offered requests / s", ylabel="latency (ms)", title="latency of admitted requests")
    _plain_log_y(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.plot(rates, rates, ":", color="grey", label="offered")
    ax.plot(rates, [r["ok_rps"] for r in rows], "o-", color="C0", label="OK / s")
    ax.set(xlabel="offered requests / s", ylabel="requests / s", title="throughput and refusals")
    ax.grid(True, alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(rates, [100 * r["rejected_share"] for r in rows], "s--", color="C3", label="rejected %")
    ax2.set_ylabel("rejected (RESOURCE_EXHAUSTED) %")
    ax2.set_ylim(0, 100)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- main


def _levels(text: str) -> list[int]:
    return [int(c) for c in text.split(",") if c.strip()]


def _rates(text: str) -> list[float]:
    return [float(r) for r in text.split(",") if r.strip()]


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


def load_query_list(dataset: str, split: str, limit: int) -> tuple[list[tuple[str, str]], dict]:
    from retrieval.evaluate import judged_queries

    queries, qrels = judged_queries(Path(dataset), split, limit)
    return list(queries.items()), qrels


def measure_service(args: argparse.Namespace, target: str, queries: list[tuple[str, str]],
                    server_pid: int | None, http_url: str = "") -> tuple[dict[str, dict], dict[str, dict], Samples,
                                                                       dict[str, dict]]:
    """Every closed-loop level (each followed by its client calibration) on each door (gRPC first, then HTTP at the
    same level: both see the same machine state), then every open-loop rate (gRPC). Returns the gRPC levels, the
    open loop, the samples, and the HTTP door's levels with their overhead against gRPC at the same level."""
    request = RequestSpec(top_k=args.top_k, stages=tuple(s for s in args.stages.split(",") if s),
                          bypass_cache=not args.cache, timeout_s=args.timeout_ms / 1000,
                          api_key=os.environ.get("HYBRIDRAG_API_KEY", ""))
    base = LevelSpec(target, tuple(queries), 1, args.duration, args.warmup, request, channels=args.channels,
                     server_pid=server_pid)
    from dataclasses import replace

    transports = _transports(args.transports)
    closed: dict[str, dict] = {}
    closed_http: dict[str, dict] = {}
    everything = Samples()
    for c in _levels(args.concurrency):
        for transport in transports:
            spec = replace(base, concurrency=c) if transport == "grpc" else \
                replace(base, concurrency=c, transport="http", target=http_url)
            samples = run_level(spec, args.client_procs)
            if transport == "grpc":
                everything.merge(samples)
            entry = level_summary(samples, c, args.duration)
            if args.calibration_seconds > 0:
                cal = run_level(replace(spec, rpc="health", duration=args.calibration_seconds,
                                        warmup=min(args.warmup, 0.5), server_pid=None), args.client_procs)
                entry["client_ceiling_qps"] = round(len(cal.ok_ms) / args.calibration_seconds, 1)
                entry["client_headroom"] = round(entry["client_ceiling_qps"] / entry["qps"], 1) if entry["qps"] else None
                entry["health_p50_ms"] = _pct(cal.ok_ms)["p50_ms"]  # the door's own floor: a call that does nothing
            (closed if transport == "grpc" else closed_http)[str(c)] = entry
            print(f"{transport:4s} C={c:<3d} {entry['qps']:8.2f} QPS  p50 {_f(entry['p50_ms'])} ms  "
                  f"p99 {_f(entry['p99_ms'])} ms  errors {entry['errors']}  "
                  f"client cpu {_f(entry['client_cpu_util'], '.2f')}  headroom {_f(entry.get('client_headroom'))}",
                  file=sys.stderr)
    for c, h in closed_http.items():
        if c in closed:
            h["overhead_vs_grpc"] = http_overhead(closed[c], h)
    opened: dict[str, dict] = {}
    if "grpc" in transports:
        for rate in _rates(args.open_loop_rates):
            r = asyncio.run(open_loop(base, rate, args.arrivals, args.seed))
            opened[f"{rate:g}"] = r
            print(f"open loop {rate:g}/s: OK {r['ok_rps']:.1f}/s p99 {_f(r['p99_ms'])} ms  status {r['status']}  "
                  f"max outstanding {r['max_outstanding']}", file=sys.stderr)
    return closed, opened, everything, closed_http


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

    def ratio(key: str) -> float | None:
        a, b = grpc_entry.get(key), http_entry.get(key)
        return None if not a or b is None else round(b / a, 3)

    return {"p50_ms_delta": diff("p50_ms"), "p99_ms_delta": diff("p99_ms"), "p50_ratio": ratio("p50_ms"),
            "qps_ratio": ratio("qps"), "grpc_health_p50_ms": grpc_entry.get("health_p50_ms"),
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


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog or "python -m bench.load").parse_args(argv)
    queries, qrels = load_query_list(args.dataset, args.split, args.limit)
    if not queries:
        print(f"no judged {args.split} queries in {args.dataset}", file=sys.stderr)
        return 2
    baseline = None
    if not args.no_baseline:
        missing = baseline_missing()
        if missing:  # fail before anything runs, not after the service levels
            print(f"the baseline is unavailable ({missing}); pass --no-baseline to run without it", file=sys.stderr)
            return 2
        if args.index:  # first: the spawned server does not exist yet, so the two never share the cores
            baseline = run_baseline(args, queries)
    floor = None
    if args.index and args.floor_queries > 0:  # also before the server: the stages' own compute, alone
        from bench.floor import floor_of_index

        floor = floor_of_index(args.index, args.config, [t for _, t in queries[: args.floor_queries]],
                               tuple(s for s in args.stages.split(",") if s) or None)
        print(f"compute floor {floor['floor_ms']:.2f} ms/request, throughput floor {floor['throughput_floor_qps']} QPS "
              f"({floor['stage_p50_ms']})", file=sys.stderr)
    server = front = None
    want_http = "http" in _transports(args.transports)
    if args.front and (not args.index or want_http):
        print("bench load: --front needs --index (a spawned server) and the gRPC door alone", file=sys.stderr)
        return 2
    if want_http and args.target and not args.http_target:
        print("bench load: --transports with http and --target need --http-target URL", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="hybridrag-load-") as tmp:
        try:
            if args.index:
                server = spawn_server(Path(args.index).resolve(), args.config, args.server_threads, Path(tmp),
                                      http=want_http)
                target, http_url = server.target, server.http_url
                print(f"started the server (pid {server.proc.pid}) on {target}, waiting for SERVING...", file=sys.stderr)
                if args.front:
                    front, target = spawn_front(server.target, args.front, Path(tmp))
                    print(f"the load goes through the front (nginx, {args.front} in flight) on {target}",
                          file=sys.stderr)
            else:
                target, http_url = args.target, args.http_target or ""
            wait_serving(target, args.server_timeout, server)
            status = server_status(target, os.environ.get("HYBRIDRAG_API_KEY", ""))
            closed, opened, samples, closed_http = measure_service(args, target, queries,
                                                                   server.proc.pid if server else None, http_url)
        except RuntimeError as e:
            print(f"bench load: {e}", file=sys.stderr)
            return 2
        finally:
            if front is not None:
                from retrieval.serving.front import stop_front

                stop_front(front)
            if server is not None:
                stop_server(server)
    if not args.no_baseline and baseline is None:
        baseline = run_baseline(args, queries)
    report(args, queries, qrels, status, closed, opened, samples, baseline, closed_http, floor)
    return 0


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
           closed_http: dict[str, dict] | None = None, floor: dict[str, Any] | None = None) -> None:
    from bench.floor import against_floor

    for entry in closed.values():
        with_baseline(entry, baseline)
        if floor is not None:
            against_floor(entry, floor)
    for entry in (closed_http or {}).values():
        if floor is not None:
            against_floor(entry, floor)
    ndcg = quality(qrels, samples.run, baseline["run"] if baseline else None)
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
    plots = []
    try:
        import matplotlib  # noqa: F401  (the bench extra; the figures below do not need it)
    except ImportError:
        print("plots: skipped (matplotlib is not installed: pip install -e '.[bench]')")
        plots_dir = None
    if plots_dir is not None:
        plots_dir.mkdir(parents=True, exist_ok=True)
        title = (f"{dataset}: {status['documents']} documents, generation {status['generation']}, top {args.top_k}, "
                 f"{'cache on' if args.cache else 'bypass_cache'}")
        if closed:
            plots.append(plots_dir / f"load_{dataset}.png")
            plot_closed(closed, plots[-1], title)
        if opened:
            plots.append(plots_dir / f"load_{dataset}_open.png")
            plot_open(opened, plots[-1], f"{title}; open loop, {args.arrivals} arrivals")
        print("plots: " + ", ".join(str(p) for p in plots))
    if args.json:
        config = {"dataset": dataset, "split": args.split, "limit": args.limit,
                  "server": f"spawned {Path(args.index).name}" if args.index else args.target,
                  "server_config": Path(args.config).name if args.config else "", "concurrency": _levels(args.concurrency),
                  "duration": args.duration, "warmup": args.warmup, "top_k": args.top_k, "stages": args.stages,
                  "cache": args.cache, "timeout_ms": args.timeout_ms, "client_procs": args.client_procs,
                  "open_loop_rates": _rates(args.open_loop_rates), "arrivals": args.arrivals,
                  "transports": _transports(args.transports),
                  "baseline_queries": 0 if args.no_baseline else args.baseline_queries}
        base_summary = {k: v for k, v in baseline.items() if k != "run"} if baseline else None
        write_result(args.json, "load", config, {
            "server": status, "queries": len(queries), "closed_loop": closed, "open_loop": opened, "ndcg@10": ndcg,
            "closed_loop_http": closed_http or None, "floor": floor,
            "baseline": base_summary, "baseline_note": BASELINE_NOTE if baseline else None,
            "client_check": {"calibration": "the same client at the same C against grpc.health.v1 Check",
                             "calibration_seconds": args.calibration_seconds, "headroom_warn_below": HEADROOM_WARN,
                             "warnings": warnings},
            "open_loop_note": "counted: requests scheduled in the measured window; ok_rps = their OK answers / duration",
            "plots": [str(p) for p in plots]})


if __name__ == "__main__":
    sys.exit(main())
