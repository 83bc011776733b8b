"""``serve``, ``front`` and ``engine``: the long-running processes (the server, nginx before the replicas, the
development Qdrant host)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from hybridrag.commands.common import config_from, thread_overrides


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio

    from retrieval.app import serve
    from retrieval.processes import serve_processes
    from retrieval.serving.auth import load_api_keys

    overrides = thread_overrides(args)
    if args.port is not None:
        overrides["server"] = {"port": args.port}
    if args.host:
        overrides.setdefault("server", {})["host"] = args.host
    if args.processes is not None:
        overrides.setdefault("server", {})["processes"] = args.processes
    if args.metrics_port is not None:
        overrides["metrics"] = {"port": args.metrics_port}
    if args.http_port is not None:
        overrides["http"] = {"port": args.http_port}
    if args.host:
        overrides.setdefault("http", {})["host"] = args.host
    config = config_from(args, overrides)
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    if args.log_json:
        from retrieval.observability.logs import JsonLogFormatter

        for handler in root.handlers:
            handler.setFormatter(JsonLogFormatter())
    keys = load_api_keys(config.server.api_keys_file, os.environ.get("HYBRIDRAG_API_KEYS", ""))
    if not args.index and config.backend.kind == "local":
        print("hybridrag serve: give --index DIR (or configure an engine backend: [backend] kind = \"qdrant\")",
              file=sys.stderr)
        return 2
    index, store = Path(args.index) if args.index else None, Path(args.store) if args.store else None
    if config.server.processes > 1:  # a supervisor over N processes on one port (retrieval/processes.py)
        return serve_processes(index, config, keys, store, log_json=args.log_json)
    asyncio.run(serve(index, config, keys, store))
    return 0


def cmd_front(args: argparse.Namespace) -> int:
    import signal
    import tempfile

    from retrieval.serving.front import FrontError, render, start_front

    front: dict[str, Any] = {}
    for flag, key in (("grpc_backend", "grpc_backends"), ("http_backend", "http_backends")):
        if getattr(args, flag):
            front[key] = getattr(args, flag)
    for key in ("host", "port", "http_port", "max_in_flight"):
        if getattr(args, key) is not None:
            front[key] = getattr(args, key)
    try:
        config = config_from(args, {"front": front} if front else None).front
    except ValueError as e:  # ConfigError is one
        print(f"hybridrag front: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="hybridrag-front-") as tmp:
        if args.print_config:
            print(render(config, Path(tmp)), end="")
            return 0
        try:
            proc = start_front(config, Path(tmp))
        except FrontError as e:
            print(f"hybridrag front: {e}", file=sys.stderr)
            return 2
        doors = f"gRPC on {config.host}:{config.port}" + (
            f", HTTP on {config.host}:{config.http_port}" if config.http_port != -1 else "")
        print(f"hybridrag front (nginx, pid {proc.pid}): {doors}; {config.max_in_flight} reads and "
              f"{config.max_writes_in_flight} writes in flight, over {', '.join(config.grpc_backends)}",
              file=sys.stderr, flush=True)
        stopping: list[int] = []

        def stop(signum: int, _frame: Any) -> None:  # only signals here: the main thread is inside proc.wait()
            stopping.append(signum)
            if proc.poll() is None:  # the first: nginx's graceful stop (calls in flight finish); a second: at once
                proc.send_signal(signal.SIGQUIT if len(stopping) == 1 else signal.SIGTERM)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        code = proc.wait()
        if proc.stderr is not None and not stopping:
            sys.stderr.write(proc.stderr.read())
        return 0 if stopping else (code or 1)


def cmd_engine(args: argparse.Namespace) -> int:
    from retrieval.engines.qdrant.host import HostLimits, serve_host

    logging.getLogger().setLevel(logging.INFO)
    try:
        limits = HostLimits(header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
                            max_connections=args.max_connections, max_body_mb=args.max_body_mb,
                            allowed_hosts=tuple(args.allowed_host))
        serve_host(args.location, args.host, args.port, limits)
    except ValueError as e:
        print(f"hybridrag engine: {e}", file=sys.stderr)
        return 2
    return 0
