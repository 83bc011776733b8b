"""The shedding front: nginx before one or more ``hybridrag serve`` replicas, refusing what is past its in-flight
limits in native code, so that a burst's excess gets its answer in milliseconds (``hybridrag front``).

Why a front: the server's own admission control runs in Python, on the event loop that also receives the admitted
calls and shares the GIL with the compute threads. Under a 200-call burst sent by a native client (h2load, all 200
on the wire within a millisecond) a server that refuses every call but one still answers the refusals at 24-35 ms
p50 from the burst's start, and a burst of do-nothing health checks comes back at 16-20 ms p50: the Python gRPC
server's per-call cost, not our handler's (docs/results/interactive-cascade.md). nginx refuses in its own worker,
before a call reaches Python: 1.4-5 ms p50 for the same burst. It costs one loopback hop on every admitted call
(within the noise at one caller on SciFact, ~0.1 ms).

What the front does, for both doors:

- reads (gRPC ``Retrieve``/``Generate``/``ListDocuments``; HTTP ``/v1/retrieve``, ``/v1/generate``,
  ``/v1/chat/completions``, ``/v1/embeddings``, ``/v1/rerank`` and ``GET /v1/documents``) share ``max_in_flight``
  slots, writes (``Upsert``/``Delete``/``Rebuild``, ``POST|DELETE /v1/documents``, ``/v1/rebuild``) their own
  ``max_writes_in_flight``, as the server's budgets do (nginx's ``limit_conn`` counts each HTTP/2 stream, each
  in-flight request, as one "connection"). ``/v1/documents`` is one path for both: the request's method picks the
  budget (a listing charged to the writes would let a listing loop starve every tenant's upserts);
- a refusal is what the server would answer: gRPC ``RESOURCE_EXHAUSTED`` (a trailers-only response: HTTP/2 headers
  with ``grpc-status: 8``), HTTP 429 with the service's JSON error and ``Retry-After``;
- a replica that does not answer (connection refused, reset) becomes gRPC ``UNAVAILABLE`` / HTTP 503 with a message
  that says so; everything else (health, reflection, status, metrics, the playground) passes through unchanged;
- several replicas are balanced per call by fewest calls in flight (``least_conn``), with kept-alive upstream
  connections; streamed answers (gRPC streams, SSE) pass through unbuffered.

The servers keep their own admission control as the backstop (calls that bypass the front). Set the front's
limits to the sum of its replicas' ``server.max_in_flight`` (or below), so that the servers never need to refuse.
The configuration is plain nginx (``hybridrag front --print-config``): a deployment can take it as it is into its
own nginx or port the two limits to Envoy (``max_requests`` circuit breaker).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from retrieval.serving.settings import FrontConfig  # noqa: F401  (re-exported: its section)

SERVICE = "hybridrag.v1.Retriever"
GRPC_READS = ("Retrieve", "Generate", "ListDocuments")
GRPC_WRITES = ("Upsert", "Delete", "Rebuild")
HTTP_READS = ("/v1/retrieve", "/v1/generate", "/v1/chat/completions", "/v1/embeddings", "/v1/rerank")
HTTP_WRITES = ("/v1/rebuild",)
HTTP_DOCUMENTS = "/v1/documents"  # GET lists (a read), POST / DELETE write
HTTP_READ_METHODS = ("GET", "HEAD", "OPTIONS")


class FrontError(RuntimeError):
    """The front could not start (no nginx, a configuration nginx refuses, a port taken)."""


def _refusal(kind: str, limit: int) -> str:
    what = "requests" if kind == "read" else "writes"
    return f"overloaded: {limit} {what} in flight at the front (max {limit})"


def _http_error(status: int, grpc_status: str, message: str, error_type: str) -> str:
    """The service's JSON error (retrieval/serving/http/errors.py ``error_body``), quoted for nginx's ``return``."""
    body = json.dumps({"error": {"code": status, "status": grpc_status, "message": message, "type": error_type},
                       "request_id": ""}, separators=(",", ":"))
    return "'" + body.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _upstream(name: str, backends: tuple[str, ...]) -> list[str]:
    """Replicas balanced by fewest calls in flight, over kept-alive connections."""
    return [f"  upstream {name} {{", "    least_conn;", *(f"    server {b};" for b in backends), "    keepalive 64;",
            "    keepalive_requests 1000000;", "  }"]


def _location(pattern: str, budget: str, reads: int, writes: int, refused: str, unavailable: str,
              upstream_codes: str, pass_to: str) -> list[str]:
    """The paths ``pattern`` under one budget: ``budget`` is ``read``, ``write``, or a variable that names one per
    request (``$hybridrag_documents_budget``: by method). The location sets ``$hybridrag_budget``; each zone's key
    is empty (not counted, nginx's rule) unless the budget is the zone's, so a call counts in exactly one. Past its
    limit, the named location ``@{refused}_{budget}``; a replica that does not answer (nginx's own
    ``upstream_codes``) goes to ``@{unavailable}``."""
    return [f"    location ~ ^{pattern}$ {{", f"      set $hybridrag_budget {budget};",
            f"      limit_conn hybridrag_reads {reads};", f"      limit_conn hybridrag_writes {writes};",
            f"      error_page 429 = @{refused}_$hybridrag_budget;",
            f"      error_page {upstream_codes} = @{unavailable};", f"      {pass_to};", "    }"]


def _grpc_server(config: FrontConfig) -> list[str]:
    """The gRPC listener: the reads' and writes' paths under their budgets, a refusal as a trailers-only response."""
    reads, writes = config.max_in_flight, config.max_writes_in_flight
    grpc_pass = "grpc_pass grpc://hybridrag_grpc"
    lines = [
        *_upstream("hybridrag_grpc", config.grpc_backends),
        "  server {",
        f"    listen {config.host}:{config.port} http2;",
        "    http2_max_concurrent_streams 1024;",
        f"    grpc_read_timeout {config.stream_timeout_s}s;",
        f"    grpc_send_timeout {config.stream_timeout_s}s;",
        *_location(f"/{re.escape(SERVICE)}/({'|'.join(GRPC_READS)})", "read", reads, writes, "grpc_exhausted",
                   "grpc_unavailable", "502 503 504", grpc_pass),
        *_location(f"/{re.escape(SERVICE)}/({'|'.join(GRPC_WRITES)})", "write", reads, writes, "grpc_exhausted",
                   "grpc_unavailable", "502 503 504", grpc_pass),
        "    location / {",
        "      error_page 502 503 504 = @grpc_unavailable;",
        f"      {grpc_pass};",
        "    }",
    ]
    # A gRPC status without a message body: a trailers-only response (HTTP/2 headers that end the stream).
    for name, status, message in (("grpc_exhausted_read", 8, _refusal("read", reads)),
                                  ("grpc_exhausted_write", 8, _refusal("write", writes)),
                                  ("grpc_unavailable", 14, "no hybridrag replica answered the front")):
        lines += [f"    location @{name} {{",
                  "      default_type application/grpc;",
                  f"      add_header grpc-status {status} always;",
                  f'      add_header grpc-message "{message}" always;',
                  "      return 204;",
                  "    }"]
    lines.append("  }")
    return lines


def _http_server(config: FrontConfig) -> list[str]:
    """The HTTP listener: the same budgets by path (``/v1/documents`` by method), a refusal as the service's JSON
    error."""
    reads, writes = config.max_in_flight, config.max_writes_in_flight
    http_pass = "proxy_pass http://hybridrag_http"
    lines = [
        *_upstream("hybridrag_http", config.http_backends),
        "  server {",
        f"    listen {config.host}:{config.http_port};",
        "    proxy_http_version 1.1;",
        '    proxy_set_header Connection "";',
        "    proxy_set_header Host $http_host;",
        "    proxy_buffering off;   # SSE: each event as the replica writes it",
        "    proxy_request_buffering off;",
        f"    proxy_read_timeout {config.stream_timeout_s}s;",
        f"    proxy_send_timeout {config.stream_timeout_s}s;",
        *_location(f"({'|'.join(re.escape(p) for p in HTTP_READS)})", "read", reads, writes, "http_exhausted",
                   "http_unavailable", "502 504", http_pass),
        *_location(f"({'|'.join(re.escape(p) for p in HTTP_WRITES)})", "write", reads, writes, "http_exhausted",
                   "http_unavailable", "502 504", http_pass),
        *_location(re.escape(HTTP_DOCUMENTS), "$hybridrag_documents_budget", reads, writes, "http_exhausted",
                   "http_unavailable", "502 504", http_pass),
        "    location / {",
        "      error_page 502 504 = @http_unavailable;",
        f"      {http_pass};",
        "    }",
    ]
    for name, status, grpc_status, message, error_type in (
            ("http_exhausted_read", 429, "RESOURCE_EXHAUSTED", _refusal("read", reads), "rate_limit_error"),
            ("http_exhausted_write", 429, "RESOURCE_EXHAUSTED", _refusal("write", writes), "rate_limit_error"),
            ("http_unavailable", 503, "UNAVAILABLE", "no hybridrag replica answered the front", "server_error")):
        lines += [f"    location @{name} {{",
                  "      default_type application/json;",
                  *(["      add_header retry-after 1 always;"] if status == 429 else []),
                  f"      return {status} {_http_error(status, grpc_status, message, error_type)};",
                  "    }"]
    lines.append("  }")
    return lines


def render(config: FrontConfig, workdir: Path) -> str:
    """The nginx configuration of the front (temporary files and the pid under ``workdir``).

    >>> conf = render(FrontConfig(grpc_backends=("10.0.0.1:50051", "10.0.0.2:50051"), max_in_flight=32), Path("/tmp"))
    >>> "limit_conn hybridrag_reads 32;" in conf and "server 10.0.0.2:50051;" in conf and "least_conn;" in conf
    True
    """
    lines = [
        "# hybridrag front (retrieval/serving/front.py): made by `hybridrag front`; edit the [front] config instead",
        "daemon off;",
        f"worker_processes {config.workers};",
        f"pid {workdir / 'nginx.pid'};",
        "error_log stderr warn;",
        "events { worker_connections 16384; }",
        "http {",
        "  access_log off;",
        *(f"  {kind}_temp_path {workdir / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")),
        "  # one key for every listener: both doors share the budgets, as the server's doors do. A location sets",
        "  # $hybridrag_budget (read or write); the other zone's key is empty there, and nginx counts no empty key",
        '  map $hybridrag_budget $hybridrag_read_key { read "front"; default ""; }',
        '  map $hybridrag_budget $hybridrag_write_key { write "front"; default ""; }',
        "  # /v1/documents is both: GET lists (a read), POST and DELETE write",
        "  map $request_method $hybridrag_documents_budget {",
        *(f"    {m} read;" for m in HTTP_READ_METHODS),
        "    default write;",
        "  }",
        "  limit_conn_zone $hybridrag_read_key zone=hybridrag_reads:1m;",
        "  limit_conn_zone $hybridrag_write_key zone=hybridrag_writes:1m;",
        "  limit_conn_status 429;",
        "  limit_conn_log_level info;",
        f"  client_max_body_size {config.max_body_mb}m;",
        "  keepalive_requests 1000000;",
        "  # slow clients are cut off (the HTTP door's own timeouts, the same defaults)",
        f"  client_header_timeout {config.header_timeout_s}s;",
        f"  client_body_timeout {config.body_timeout_s}s;",
        f"  send_timeout {config.send_timeout_s}s;",
        f"  keepalive_timeout {config.keepalive_timeout_s}s;",
        *_grpc_server(config),
    ]
    if config.http_port != -1:
        lines += _http_server(config)
    lines.append("}")
    return "\n".join(lines) + "\n"


def nginx_binary(config: FrontConfig) -> str:
    path = shutil.which(config.nginx)
    if path is None and config.nginx == "nginx" and os.access("/usr/sbin/nginx", os.X_OK):
        path = "/usr/sbin/nginx"  # Debian's place, off an ordinary user's PATH
    if path is None:
        raise FrontError(f"nginx not found ({config.nginx!r}; [front] nginx): install it (Debian: apt-get install "
                         "nginx-light) or point front.nginx at the binary")
    return path


def write_config(config: FrontConfig, workdir: Path) -> Path:
    """Write the configuration and its temporary folders under ``workdir``; check it with ``nginx -t``."""
    binary = nginx_binary(config)
    workdir.mkdir(parents=True, exist_ok=True)
    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (workdir / kind).mkdir(exist_ok=True)
        os.chmod(workdir / kind, 0o777)  # nginx's workers drop to 'nobody' when it runs as root
    conf = workdir / "nginx.conf"
    conf.write_text(render(config, workdir))
    check = subprocess.run([binary, "-t", "-q", "-e", "stderr", "-p", str(workdir), "-c", str(conf)],
                           capture_output=True, text=True)
    if check.returncode != 0:
        raise FrontError(f"nginx refused the front's configuration ({conf}): {check.stderr.strip()}")
    return conf


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the process that started the front dies, even by SIGKILL, so
    that no nginx outlives its ``hybridrag front``."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_front(config: FrontConfig, workdir: Path, timeout_s: float = 10.0) -> subprocess.Popen:
    """Start nginx as the front (in the foreground of the returned process) and return once it listens: nginx
    writes its pid file after it has bound every port. A port it cannot bind ends it (after nginx's own retries,
    about 2.5 s) with its message. Stop it with :func:`stop_front`."""
    conf = write_config(config, workdir)
    pid_file = workdir / "nginx.pid"
    pid_file.unlink(missing_ok=True)
    proc = subprocess.Popen([nginx_binary(config), "-e", "stderr", "-p", str(workdir), "-c", str(conf)],
                            stderr=subprocess.PIPE, text=True, errors="replace", preexec_fn=_die_with_parent)
    deadline = time.monotonic() + timeout_s
    while not (pid_file.is_file() and pid_file.read_text().strip() == str(proc.pid)):
        if proc.poll() is not None:
            raise FrontError(f"nginx exited ({proc.returncode}): {proc.stderr.read().strip() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            stop_front(proc, graceful=False)
            raise FrontError(f"the front did not start listening within {timeout_s:.0f} s")
        time.sleep(0.02)
    return proc


def stop_front(proc: subprocess.Popen, graceful: bool = True, timeout_s: float = 10.0) -> int:
    """Stop the front: SIGQUIT lets calls in flight finish (nginx's graceful stop), SIGTERM cuts them."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGQUIT if graceful else signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()
    return proc.returncode
