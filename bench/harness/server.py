"""The processes a benchmark measures, started and stopped in one place: a ``hybridrag serve`` server (and its
HTTP door), the ``hybridrag front`` (nginx) before it, a ``hybridrag engine`` (Qdrant's local engine over REST) and
a redis-server. Each on a free loopback port, its output in a log file (a pipe could fill), waited for until it
answers, stopped at the end (SIGTERM, then SIGKILL). Client and server never share a GIL: every server is a
subprocess (``python -m hybridrag serve``) with the embedded LLM server off unless asked for.

    with served(index, config_path, log_dir) as server:
        ... server.target ...

Also: ``GetIndexStatus`` of a target (what was measured) and the CPU seconds of a process tree.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retrieval.generation.embedded import free_port  # the one free-port helper (also tests.helpers')

REPO = Path(__file__).resolve().parent.parent.parent
API_KEY_ENV = "HYBRIDRAG_API_KEY"


def api_key() -> str:
    """The API key a benchmark client sends (``HYBRIDRAG_API_KEY``; "" = none)."""
    return os.environ.get(API_KEY_ENV, "")


def grpc_metadata(key: str) -> tuple[tuple[str, str], ...]:
    return (("x-api-key", key),) if key else ()


@dataclass
class Process:
    """A spawned process with its log file."""

    proc: subprocess.Popen
    log_path: Path
    name: str = "process"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(f"the {self.name} exited with code {self.proc.returncode}:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 30.0, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def spawn(cmd: list[str], log_dir: Path, name: str, env: Mapping[str, str] | None = None) -> Process:
    log_path = Path(log_dir) / f"{name}-{int(time.time() * 1000)}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=dict(env or os.environ))
    return Process(proc, log_path, name)


# ---------------------------------------------------------------------------------------------- hybridrag serve


@dataclass
class Server(Process):
    """A spawned ``hybridrag serve``: its gRPC target, and its HTTP door's base URL when it has one."""

    target: str = ""
    http_url: str = ""


def server_env(extra: Mapping[str, str] | None = None, *, llm: bool = False) -> dict[str, str]:
    """The spawned server's environment: the caller's (a variable the caller set wins over the defaults here),
    no embedded llama.cpp server competing for the CPU unless ``llm`` (Retrieve does not need it), ``/metrics``
    on a free port rather than the fixed default (a server already running here would make the spawned one
    fail), then ``extra``."""
    env = dict(os.environ)
    env.setdefault("HYBRIDRAG_GENERATION__EMBEDDED__ENABLED", "true" if llm else "false")
    env.setdefault("HYBRIDRAG_METRICS__PORT", "0")
    env.update(extra or {})
    return env


def spawn_server(index: Path | str | None, log_dir: Path, *, config: str | Path | None = None, threads: int = 0,
                 http: bool = False, env: Mapping[str, str] | None = None, llm: bool = False,
                 args: tuple[str, ...] = ()) -> Server:
    """``python -m hybridrag serve`` on a free loopback port (and, with ``http``, its HTTP door on another).
    ``index`` None: the configuration's backend serves without a snapshot. Not waited for: see
    :func:`wait_serving` (or use :func:`served`)."""
    port = free_port()
    cmd = [sys.executable, "-m", "hybridrag", "serve", "--port", str(port), "--host", "127.0.0.1"]
    if index is not None:
        cmd += ["--index", str(Path(index).resolve())]
    http_port = free_port() if http else 0
    if http:
        cmd += ["--http-port", str(http_port)]
    if config:
        cmd += ["--config", str(Path(config).resolve())]
    if threads:
        cmd += ["--threads", str(threads)]
    cmd += list(args)
    p = spawn(cmd, log_dir, f"hybridrag-serve-{port}", server_env(env, llm=llm))
    return Server(p.proc, p.log_path, "server", f"127.0.0.1:{port}", f"http://127.0.0.1:{http_port}" if http else "")


def wait_serving(target: str, timeout_s: float = 300.0, process: Process | None = None) -> float:
    """Poll grpc.health.v1 Check until SERVING (a server listens at once and turns SERVING once loaded); the
    seconds it took. Fails at once when ``process`` exits."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    t0 = time.monotonic()
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < t0 + timeout_s:
            if process is not None:
                process.check_alive()
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return round(time.monotonic() - t0, 2)
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    tail = f":\n{process.log_tail()}" if process is not None else ""
    raise RuntimeError(f"{target} was not SERVING after {timeout_s:.0f} s{tail}")


def wait_http(url: str, timeout_s: float = 60.0, process: Process | None = None) -> float:
    """Poll ``GET url`` until 200; the seconds it took."""
    import httpx

    t0 = time.monotonic()
    while time.monotonic() < t0 + timeout_s:
        if process is not None:
            process.check_alive()
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return round(time.monotonic() - t0, 2)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer 200 in {timeout_s:.0f} s")


@contextlib.contextmanager
def served(index: Path | str | None, log_dir: Path, *, timeout_s: float = 300.0, **options: Any) -> Iterator[Server]:
    """A spawned server (:func:`spawn_server` options), SERVING, stopped on leaving."""
    server = spawn_server(index, log_dir, **options)
    try:
        wait_serving(server.target, timeout_s, server)
        yield server
    finally:
        server.stop()


def server_status(target: str, key: str = "") -> dict[str, Any]:
    """GetIndexStatus of the target, the parts that identify what was measured."""
    import grpc

    from retrieval.api import retriever_pb2 as pb
    from retrieval.api import retriever_pb2_grpc as pb_grpc

    with grpc.insecure_channel(target) as channel:
        s = pb_grpc.RetrieverStub(channel).GetIndexStatus(pb.GetIndexStatusRequest(), timeout=10.0,
                                                         metadata=grpc_metadata(key))
    return {"generation": s.generation, "documents": s.documents, "chunks": s.chunks, "models": dict(s.models),
            "dense_available": s.dense_available, "late_interaction_available": s.late_interaction_available,
            "snapshot_path": s.snapshot_path}


# ---------------------------------------------------------------------------------------------- other processes


@dataclass
class Front:
    """``hybridrag front`` (nginx, retrieval/serving/front.py) before a server: its gRPC address."""

    proc: subprocess.Popen
    target: str

    def stop(self) -> None:
        from retrieval.serving.front import stop_front

        stop_front(self.proc)


def spawn_front(backend: str, limit: int, workdir: Path) -> Front:
    """The front before the server at ``backend``, ``limit`` reads in flight, on a free loopback port; returns
    once nginx listens."""
    from retrieval.serving.front import FrontConfig, start_front

    port = free_port()
    folder = Path(workdir) / f"front-{port}"
    folder.mkdir(parents=True, exist_ok=True)
    return Front(start_front(FrontConfig(grpc_backends=(backend,), port=port, max_in_flight=limit), folder),
                 f"127.0.0.1:{port}")


@contextlib.contextmanager
def fronted(backend: str, limit: int, workdir: Path) -> Iterator[str]:
    """The target to send load to: the front at ``limit`` before ``backend``, or ``backend`` itself (limit 0)."""
    if not limit:
        yield backend
        return
    front = spawn_front(backend, limit, workdir)
    try:
        yield front.target
    finally:
        front.stop()


@dataclass
class Engine(Process):
    """``hybridrag engine``: Qdrant's local engine behind its REST API (the development host)."""

    url: str = ""


@contextlib.contextmanager
def engine(log_dir: Path, location: str = ":memory:", timeout_s: float = 60.0) -> Iterator[Engine]:
    port = free_port()
    p = spawn([sys.executable, "-m", "hybridrag", "engine", "--location", location, "--port", str(port)], log_dir,
              f"hybridrag-engine-{port}")
    e = Engine(p.proc, p.log_path, "engine", f"http://127.0.0.1:{port}")
    try:
        wait_http(f"{e.url}/healthz", timeout_s, e)
        yield e
    finally:
        e.stop()


def run_cli(args: list[str], log_dir: Path, name: str, timeout_s: float = 3600.0) -> float:
    """``python -m hybridrag ARGS`` to completion (e.g. ``migrate``); its seconds. Fails with its log's tail."""
    p = spawn([sys.executable, "-m", "hybridrag", *args], log_dir, name)
    t = time.perf_counter()
    try:
        rc = p.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.stop()
        raise RuntimeError(f"hybridrag {args[0]} took over {timeout_s:.0f} s") from None
    if rc != 0:
        raise RuntimeError(f"hybridrag {args[0]} exited with {rc}:\n{p.log_tail()}")
    return round(time.perf_counter() - t, 2)


def run_measured(cmd: list[str], log_dir: Path, name: str, timeout_s: float = 3600.0,
                 env: Mapping[str, str] | None = None, sample_s: float = 0.2) -> dict[str, Any]:
    """A command to completion in its own process, measured alone: its seconds, exit code, peak resident memory
    (the child's own ``ru_maxrss`` from ``wait4``, not the largest of all children), the peaks of its anonymous
    and file-backed resident memory sampled every ``sample_s`` (memory-mapped files count in RSS while their pages
    are mapped, and the kernel may drop them; anonymous memory it cannot) and CPU seconds; fails with its log's
    tail on a non-zero exit."""
    from bench.harness.stats import proc_memory_mib

    p = spawn(cmd, log_dir, name, env)
    t = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    peak = {"anon": 0.0, "file": 0.0}
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            p.proc.kill()
            os.wait4(p.pid, 0)
            raise RuntimeError(f"{name} took over {timeout_s:.0f} s:\n{p.log_tail()}")
        mem = proc_memory_mib(p.pid)
        for k in peak:
            if mem[k] == mem[k]:  # not NaN (the process may be gone)
                peak[k] = max(peak[k], mem[k])
        time.sleep(sample_s)
    p.proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = round(time.perf_counter() - t, 2)
    if p.proc.returncode != 0:
        raise RuntimeError(f"{name} exited with {p.proc.returncode}:\n{p.log_tail()}")
    return {"seconds": seconds, "returncode": p.proc.returncode, "peak_rss_mib": round(usage.ru_maxrss / 1024.0, 1),
            "peak_anon_mib": round(peak["anon"], 1), "peak_file_mib": round(peak["file"], 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "log": str(p.log_path)}


@dataclass
class Redis(Process):
    port: int = 0
    folder: Path = field(default_factory=Path)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


@contextlib.contextmanager
def redis_server(binary: str, log_dir: Path, timeout_s: float = 10.0) -> Iterator[Redis]:
    """A throw-away redis-server (no persistence) on a free loopback port."""
    import tempfile

    import redis

    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="hybridrag-redis-"))
    p = spawn([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir",
               str(folder)], log_dir, f"redis-{port}")
    r = Redis(p.proc, p.log_path, "redis-server", port, folder)
    try:
        client = redis.Redis(port=port)
        deadline = time.monotonic() + timeout_s
        while True:
            r.check_alive()
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield r
    finally:
        r.stop(timeout_s=10)
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- CPU


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
