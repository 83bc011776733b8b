"""Several server processes on one port: ``server.processes`` workers, each one :func:`retrieval.app.serve` in a
fresh interpreter, sharing the gRPC (and HTTP) port with SO_REUSEPORT, under a supervisor that restarts a worker
that dies and drains them all on SIGTERM/SIGINT (:func:`serve_processes`). A worker ends when its supervisor does,
however it ends. Apart from :mod:`retrieval.app` because one serving process needs none of it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from index_builder.errors import ConfigError
from retrieval.app import serve
from retrieval.config import AppConfig
from retrieval.observability.logs import JsonLogFormatter

log = logging.getLogger(__name__)

RESTARTS_PER_MINUTE = 3  # a worker that dies more often than this is not restarted: the supervisor stops


def check_processes(app_config: AppConfig, store_path: Path | None) -> None:
    """Refuse a multi-process layout that cannot work: one document store has one writer (the live index owns
    its buffer and rebuilds), and Qdrant's local mode locks its folder to one process."""
    n = app_config.server.processes
    if n == 1:
        return
    if store_path is not None:
        raise ConfigError(f"server.processes = {n} serves a read-only snapshot (or an engine backend): a document "
                          "store (--store) has one writer, so serve it with processes = 1")
    b = app_config.backend
    if b.kind == "qdrant" and b.location not in ("", ":memory:") and "://" not in b.location:
        raise ConfigError(f"server.processes = {n}: Qdrant's local mode locks {b.location!r} to one process; "
                          "use a Qdrant server (an http(s):// location) or processes = 1")


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound, not listening, SO_REUSEPORT socket on ``host:port`` (0 = a free port): it holds the port number
    while the worker processes listen on it together. The kernel hands connections only to listening sockets."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e}") from None
    return sock


def worker_config(app_config: AppConfig, worker: int, grpc_port: int, http_port: int) -> AppConfig:
    """Worker ``worker``'s configuration: the shared ports with SO_REUSEPORT, one process each, and its own
    metrics port (``metrics.port + worker``; 0 stays any free port, -1 off): Prometheus scrapes each process."""
    server = dataclasses.replace(app_config.server, port=grpc_port, reuse_port=True, processes=1)
    http = dataclasses.replace(app_config.http, port=http_port)
    m = app_config.metrics
    metrics = dataclasses.replace(m, port=m.port + worker if m.port > 0 else m.port)
    models = {}
    per = worker_threads(app_config.server.processes)
    for name in ("embedder", "late_interaction", "cross_encoder"):  # 0 = "all cores" would oversubscribe them
        section = getattr(app_config, name)
        if section.runtime.intra_op_threads == 0:
            models[name] = dataclasses.replace(section, runtime=dataclasses.replace(section.runtime,
                                                                                    intra_op_threads=per))
    return dataclasses.replace(app_config, server=server, http=http, metrics=metrics, **models)


def worker_threads(processes: int) -> int:
    """Each worker's share of the cores: its models' runtimes and faiss's OpenMP threads where the configuration
    leaves them at 0 (all cores), so that N processes do not run N times the cores' threads."""
    return max(1, (os.cpu_count() or 1) // processes)


def _die_with_supervisor(supervisor: int) -> None:
    """SIGTERM to this worker (a graceful drain) when its supervisor dies, however it dies: SIGKILL and the OOM
    killer included. Without it the workers outlived a killed supervisor, unsupervised and still serving on the
    shared port, holding its pipes (a supervisor started again served beside them). ``PR_SET_PDEATHSIG`` follows
    the *thread* that started the worker: the supervisor starts and restarts them on its main thread only. A
    supervisor already gone before this call is caught by the parent check; without prctl (not Linux), a thread
    polls the parent each second."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        import threading

        def watch() -> None:
            while os.getppid() == supervisor:
                time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGTERM)
        threading.Thread(target=watch, name="hybridrag-supervisor-watch", daemon=True).start()
    if os.getppid() != supervisor:
        os.kill(os.getpid(), signal.SIGTERM)


def _worker_main(worker: int, workers: int, index_dir: Path | None, config: AppConfig,
                 api_keys: Mapping[str, frozenset[str]], log_level: int, log_json: bool, supervisor: int) -> None:
    _die_with_supervisor(supervisor)
    root = logging.getLogger()
    root.setLevel(log_level)
    handler = logging.StreamHandler()
    if log_json:
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s worker {worker} %(name)s: %(message)s"))
    root.handlers[:] = [handler]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor turns Ctrl-C into one SIGTERM each
    import faiss

    faiss.omp_set_num_threads(worker_threads(workers))
    asyncio.run(serve(index_dir, config, api_keys))


def serve_processes(index_dir: Path | None, app_config: AppConfig,
                    api_keys: Mapping[str, frozenset[str]] | None = None, store_path: Path | None = None, *,
                    log_json: bool = False) -> int:
    """``server.processes`` server processes over one snapshot (memory-mapped: the pages are shared), all on the
    same gRPC (and HTTP) port with SO_REUSEPORT; the kernel spreads connections over them. This process
    supervises: it restarts a worker that dies (at most RESTARTS_PER_MINUTE a minute), and on SIGTERM/SIGINT
    drains them all; a worker ends (SIGTERM) when its supervisor does, however it ends. Returns the exit code."""
    import multiprocessing

    check_processes(app_config, store_path)
    n = app_config.server.processes
    s, h = app_config.server, app_config.http
    held = [reserve_port(s.host, s.port)]
    grpc_port = held[0].getsockname()[1]
    http_port = h.port
    if h.enabled:
        held.append(reserve_port(h.host, h.port))
        http_port = held[1].getsockname()[1]
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter each: no forked runtime threads
    keys = dict(api_keys or {})
    level = logging.getLogger().getEffectiveLevel()
    stopping = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def start(i: int) -> Any:
        p = ctx.Process(target=_worker_main, name=f"hybridrag-worker-{i}", daemon=False,
                        args=(i, n, index_dir, worker_config(app_config, i, grpc_port, http_port), keys, level,
                              log_json, os.getpid()))
        p.start()
        return p

    workers = [start(i) for i in range(n)]
    log.info("hybridrag supervising %d server processes on %s:%d%s (SO_REUSEPORT; %d threads each where the "
             "configuration says 0; pids %s)", n, s.host, grpc_port, f", HTTP on {h.host}:{http_port}" if h.enabled
             else "", worker_threads(n), ", ".join(str(p.pid) for p in workers))
    deaths: list[float] = []
    code = 0
    try:
        while not stopping:
            time.sleep(0.2)
            for i, p in enumerate(workers):
                if p.is_alive() or stopping:
                    continue
                now = time.monotonic()
                deaths[:] = [t for t in deaths if now - t < 60.0] + [now]
                if len(deaths) > RESTARTS_PER_MINUTE:
                    log.error("worker %d (pid %d) exited with code %s: %d exits in a minute, stopping", i, p.pid,
                              p.exitcode, len(deaths))
                    stopping, code = True, 1
                    break
                log.warning("worker %d (pid %d) exited with code %s: restarting it", i, p.pid, p.exitcode)
                workers[i] = start(i)
    finally:
        log.info("hybridrag stopping %d server processes (grace %.1f s)", n, s.grace_s)
        for p in workers:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + s.grace_s + 30.0
        for p in workers:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.warning("worker pid %d did not stop in time: killed", p.pid)
                p.kill()
                p.join()
        for sock in held:
            sock.close()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return code
