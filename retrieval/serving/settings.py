"""The serving room's settings: ``[server]`` (the process and its gRPC door), ``[http]`` (the HTTP door),
``[metrics]`` (the Prometheus port) and ``[front]`` (the nginx shedding front).

A settings module: dataclasses and their checks only (no grpc, FastAPI or uvicorn), so that loading a configuration
(``retrieval/config.py``) imports no server. The modules that use them re-export their names
(``grpc_service.ServerConfig``, ``http.HttpConfig``, ``front.FrontConfig``, ``metrics.MetricsConfig``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from index_builder.errors import ConfigError
from index_builder.settings import Section, bounded

_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


@dataclass(frozen=True)
class ServerConfig(Section):
    """``max_in_flight``: requests served at once; more are refused with RESOURCE_EXHAUSTED (no queue).
    ``api_keys_file``: JSON ``{"key": ["tenant", ...]}`` (``"*"`` = every tenant); empty = no authentication.
    Keys live outside the repository (a file path from config or ``HYBRIDRAG_SERVER__API_KEYS_FILE``)."""

    SECTION = "server"
    host: str = "127.0.0.1"
    port: int = bounded(50051, 0, 65535, note="0 = any free port")
    # the closed loop's knee on 2 cores is lower: size it to the machine (docs/results/load-metrics-tracing.md)
    max_in_flight: int = bounded(64, 1)
    # writes encode their documents (model CPU): a budget of their own, so a flood of them leaves the cores to queries
    max_writes_in_flight: int = bounded(2, 1)
    grace_s: float = bounded(10.0, 0)
    tls_cert: str = ""
    tls_key: str = ""
    api_keys_file: str = ""
    max_message_mb: int = 16
    # the GIL's hand-over interval (sys.setswitchinterval, process-wide): the gRPC loop's callbacks wait less behind
    # the compute threads, so refusals stay fast past saturation (docs/results/load-metrics-tracing.md)
    switch_interval_ms: float = bounded(0.5, 0, 100, note="0 = Python's 5 ms")
    # the nice value of the compute threads (retrieval/serving/priority.py): past saturation the event loop, which
    # admits and refuses calls, gets the cores first (docs/results/interactive-cascade.md)
    compute_nice: int = bounded(10, 0, 19, note="0 = off")
    # server processes over one memory-mapped snapshot on one port (SO_REUSEPORT); a document store (--store) has
    # one writer, so it needs one process (docs/results/interactive-cascade.md)
    processes: int = bounded(1, 1, 64)
    # set by the supervisor in each of its processes (retrieval/app.py): listen beside the others on this port
    reuse_port: bool = False

    def check(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("server.tls_cert and server.tls_key go together (both or neither)")


@dataclass(frozen=True)
class HttpConfig(Section):
    """``[http]``: ``port`` -1 = no HTTP door (the default), 0 = any free port (logged). ``max_body_mb``: larger
    request bodies get 413 unread. ``playground``: serve the page at ``/playground``.

    Browsers (:mod:`retrieval.serving.http.guard`): ``allowed_origins``: the other origins (``scheme://host:port``)
    whose pages may call the API (none by default: the playground is same-origin; ``"*"`` = any, with CORS);
    ``allowed_hosts``: the ``Host`` names answered (none = loopback names when listening on a loopback address,
    any name otherwise; ``"*"`` = any).

    Slow clients (:mod:`retrieval.serving.http.timeouts`): ``header_timeout_s`` for the request line and headers;
    ``body_timeout_s`` then ``body_min_rate`` bytes/s on average for the body; ``send_timeout_s`` for a client
    that stops reading its answer; ``keepalive_timeout_s`` for an idle keep-alive connection."""

    SECTION = "http"
    host: str = "127.0.0.1"
    port: int = bounded(-1, -1, 65535, note="-1 = off, 0 = any free port")
    max_body_mb: float = bounded(16.0, 0, 1024, open_lo=True)
    playground: bool = True
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    header_timeout_s: float = bounded(10.0, 0, 3600, open_lo=True, note="seconds")
    body_timeout_s: float = bounded(10.0, 0, 3600, open_lo=True, note="seconds")
    body_min_rate: int = bounded(1024, 0, note="bytes/s")
    send_timeout_s: float = bounded(30.0, 0, 3600, open_lo=True, note="seconds")
    keepalive_timeout_s: int = bounded(30, 0, 3600, open_lo=True, note="seconds")

    def check(self) -> None:
        for origin in self.allowed_origins:
            if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
                raise ValueError(f"http.allowed_origins: {origin!r} is not an origin (scheme://host[:port], "
                                 "no path) or '*'")

    @property
    def enabled(self) -> bool:
        return self.port >= 0


@dataclass(frozen=True)
class MetricsConfig(Section):
    """``/metrics`` over HTTP. ``port``: -1 = no HTTP endpoint (the metrics are still kept), 0 = any free port."""

    SECTION = "metrics"
    host: str = "127.0.0.1"
    port: int = bounded(9464, -1, 65535, note="-1 = off, 0 = any free port")


@dataclass(frozen=True)
class FrontConfig(Section):
    """``[front]``: where the front listens, the replicas behind it, and its limits (see the module's docstring).

    ``grpc_backends`` / ``http_backends``: ``HOST:PORT`` of each replica's gRPC and HTTP doors. ``http_port`` -1: no
    HTTP front. ``max_in_flight`` / ``max_writes_in_flight``: reads and writes in flight through the front, all
    replicas together. ``stream_timeout_s``: the longest a replica may stay silent inside a call (streamed answers
    included). ``workers``: nginx worker processes (1 leaves the cores to the servers; one worker serves thousands of
    connections).

    Slow clients, with the HTTP door's defaults (:mod:`retrieval.serving.http.timeouts`): ``header_timeout_s``
    (nginx ``client_header_timeout``: the request's headers, on both doors), ``body_timeout_s``
    (``client_body_timeout``: the longest pause between two reads of a body), ``send_timeout_s`` (``send_timeout``:
    the longest pause of a client reading its answer), ``keepalive_timeout_s`` (an idle connection, HTTP/1.1 or
    HTTP/2)."""

    SECTION = "front"
    grpc_backends: tuple[str, ...] = ("127.0.0.1:50051",)
    http_backends: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = bounded(50050, 1, 65535, note="nginx takes no 'any free port'")
    http_port: int = -1
    max_in_flight: int = bounded(64, 1)
    max_writes_in_flight: int = bounded(2, 1)
    max_body_mb: int = bounded(16, 1)
    stream_timeout_s: int = bounded(3600, 1)
    workers: int = bounded(1, 1)
    nginx: str = "nginx"
    header_timeout_s: int = bounded(10, 1, 3600, note="seconds")
    body_timeout_s: int = bounded(10, 1, 3600, note="seconds")
    send_timeout_s: int = bounded(30, 1, 3600, note="seconds")
    keepalive_timeout_s: int = bounded(75, 1, 3600, note="seconds")

    def check(self) -> None:
        if not self.grpc_backends:
            raise self.fail("grpc_backends", "a list of at least one replica's gRPC door (HOST:PORT)")
        for name in ("grpc_backends", "http_backends"):
            for address in getattr(self, name):
                if not _ADDRESS.match(address) or not 1 <= int(address.rsplit(":", 1)[1]) <= 65535:
                    raise ConfigError(f"front.{name}: {address!r} is not HOST:PORT with a port in [1, 65535]")
        if self.http_port != -1 and not 1 <= self.http_port <= 65535:
            raise self.fail("http_port", "-1 (off) or in [1, 65535]")
        if self.http_port != -1 and not self.http_backends:
            raise ConfigError("front.http_port is set but front.http_backends is empty: give each replica's HTTP door")
        if not re.fullmatch(r"[A-Za-z0-9_.:\[\]-]+", self.host):
            raise ConfigError(f"front.host: {self.host!r} is not an address")
