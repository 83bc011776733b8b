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

_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


@dataclass(frozen=True)
class ServerConfig:
    """``max_in_flight``: requests served at once; more are refused with RESOURCE_EXHAUSTED (no queue).
    ``api_keys_file``: JSON ``{"key": ["tenant", ...]}`` (``"*"`` = every tenant); empty = no authentication.
    Keys live outside the repository (a file path from config or ``HYBRIDRAG_SERVER__API_KEYS_FILE``)."""

    host: str = "127.0.0.1"
    port: int = 50051
    max_in_flight: int = 64
    # Writes (Upsert, Delete, Rebuild) have their own budget: each write encodes its documents (model CPU), so
    # a flood of them would otherwise take the cores from queries; past it writes get RESOURCE_EXHAUSTED.
    max_writes_in_flight: int = 2
    grace_s: float = 10.0
    tls_cert: str = ""
    tls_key: str = ""
    api_keys_file: str = ""
    max_message_mb: int = 16
    # How often a thread holding the GIL hands it over (sys.setswitchinterval, process-wide; 0 = Python's 5 ms).
    # The gRPC event loop is I/O work competing for the GIL with the pipeline's compute threads; at 5 ms each of
    # its callbacks can wait 5 ms per busy thread, so past saturation calls queue before admission control sees
    # them. 0.5 ms kept refusals fast and admitted latency bounded (bench.load open loop, README: Results).
    switch_interval_ms: float = 0.5
    # The nice value of the compute threads (models, BM25/faiss pools; retrieval/serving/priority.py): past
    # saturation the event loop, which admits and refuses calls, gets the cores first. 0 = off.
    compute_nice: int = 10
    # Server processes over one memory-mapped snapshot, all listening on the same port (SO_REUSEPORT: the kernel
    # spreads connections over them). 1 = one process, as before. More serve a read-only snapshot or an engine
    # backend; a document store (--store) has one writer, so it needs one process.
    processes: int = 1
    # Set by the supervisor in each of its processes: listen with SO_REUSEPORT beside the others on this port.
    reuse_port: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535 or self.max_in_flight < 1 or self.max_writes_in_flight < 1 or self.grace_s < 0:
            raise ValueError("server needs 0 <= port <= 65535, max_in_flight >= 1, max_writes_in_flight >= 1 and "
                             "grace_s >= 0")
        if not 1 <= self.processes <= 64:
            raise ValueError(f"server.processes must be in [1, 64], got {self.processes}")
        if not 0 <= self.compute_nice <= 19:
            raise ValueError(f"server.compute_nice must be in [0, 19] (0 = off), got {self.compute_nice}")
        if not 0 <= self.switch_interval_ms <= 100:
            raise ValueError(f"server.switch_interval_ms must be in [0, 100], got {self.switch_interval_ms}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("server.tls_cert and server.tls_key go together")


@dataclass(frozen=True)
class HttpConfig:
    """``[http]``: ``port`` -1 = no HTTP door (the default), 0 = any free port (logged). ``max_body_mb``: larger
    request bodies get 413 unread. ``playground``: serve the page at ``/playground``.

    Browsers (:mod:`retrieval.serving.http_guard`): ``allowed_origins``: the other origins (``scheme://host:port``)
    whose pages may call the API (none by default: the playground is same-origin; ``"*"`` = any, with CORS);
    ``allowed_hosts``: the ``Host`` names answered (none = loopback names when listening on a loopback address,
    any name otherwise; ``"*"`` = any).

    Slow clients (:mod:`retrieval.serving.http_timeouts`): ``header_timeout_s`` for the request line and headers;
    ``body_timeout_s`` then ``body_min_rate`` bytes/s on average for the body; ``send_timeout_s`` for a client
    that stops reading its answer; ``keepalive_timeout_s`` for an idle keep-alive connection."""

    host: str = "127.0.0.1"
    port: int = -1
    max_body_mb: float = 16.0
    playground: bool = True
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    body_min_rate: int = 1024
    send_timeout_s: float = 30.0
    keepalive_timeout_s: int = 30

    def __post_init__(self) -> None:
        if not -1 <= self.port <= 65535:
            raise ValueError(f"http.port must be -1 (off), 0 (any free port) or a port number, got {self.port}")
        if not 0 < self.max_body_mb <= 1024:
            raise ValueError(f"http.max_body_mb must be in (0, 1024], got {self.max_body_mb}")
        for name in ("header_timeout_s", "body_timeout_s", "send_timeout_s", "keepalive_timeout_s"):
            if not 0 < getattr(self, name) <= 3600:
                raise ValueError(f"http.{name} must be in (0, 3600] seconds, got {getattr(self, name)}")
        if self.body_min_rate < 0:
            raise ValueError(f"http.body_min_rate must be >= 0 bytes/s, got {self.body_min_rate}")
        for origin in self.allowed_origins:
            if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
                raise ValueError(f"http.allowed_origins: {origin!r} is not an origin (scheme://host[:port], "
                                 "no path) or '*'")

    @property
    def enabled(self) -> bool:
        return self.port >= 0


@dataclass(frozen=True)
class MetricsConfig:
    """``/metrics`` over HTTP. ``port``: -1 = no HTTP endpoint (the metrics are still kept), 0 = any free port."""

    host: str = "127.0.0.1"
    port: int = 9464

    def __post_init__(self) -> None:
        if not -1 <= self.port <= 65535:
            raise ValueError(f"metrics.port must be -1 (off), 0 (any free port) or a port number, got {self.port}")


@dataclass(frozen=True)
class FrontConfig:
    """``[front]``: where the front listens, the replicas behind it, and its limits (see the module's docstring).

    ``grpc_backends`` / ``http_backends``: ``HOST:PORT`` of each replica's gRPC and HTTP doors. ``http_port`` -1: no
    HTTP front. ``max_in_flight`` / ``max_writes_in_flight``: reads and writes in flight through the front, all
    replicas together. ``stream_timeout_s``: the longest a replica may stay silent inside a call (streamed answers
    included). ``workers``: nginx worker processes (1 leaves the cores to the servers; one worker serves thousands of
    connections).

    Slow clients, with the HTTP door's defaults (:mod:`retrieval.serving.http_timeouts`): ``header_timeout_s``
    (nginx ``client_header_timeout``: the request's headers, on both doors), ``body_timeout_s``
    (``client_body_timeout``: the longest pause between two reads of a body), ``send_timeout_s`` (``send_timeout``:
    the longest pause of a client reading its answer), ``keepalive_timeout_s`` (an idle connection, HTTP/1.1 or
    HTTP/2)."""

    grpc_backends: tuple[str, ...] = ("127.0.0.1:50051",)
    http_backends: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 50050
    http_port: int = -1
    max_in_flight: int = 64
    max_writes_in_flight: int = 2
    max_body_mb: int = 16
    stream_timeout_s: int = 3600
    workers: int = 1
    nginx: str = "nginx"
    header_timeout_s: int = 10
    body_timeout_s: int = 10
    send_timeout_s: int = 30
    keepalive_timeout_s: int = 75

    def __post_init__(self) -> None:
        if not self.grpc_backends:
            raise ConfigError("front.grpc_backends: give at least one replica's gRPC door (HOST:PORT)")
        for name in ("grpc_backends", "http_backends"):
            for address in getattr(self, name):
                if not _ADDRESS.match(address) or not 1 <= int(address.rsplit(":", 1)[1]) <= 65535:
                    raise ConfigError(f"front.{name}: {address!r} is not HOST:PORT with a port in [1, 65535]")
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"front.port must be in [1, 65535] (nginx takes no 'any free port'), got {self.port}")
        if self.http_port != -1 and not 1 <= self.http_port <= 65535:
            raise ConfigError(f"front.http_port must be -1 (off) or in [1, 65535], got {self.http_port}")
        if self.http_port != -1 and not self.http_backends:
            raise ConfigError("front.http_port is set but front.http_backends is empty: give each replica's HTTP door")
        if self.max_in_flight < 1 or self.max_writes_in_flight < 1:
            raise ConfigError(f"front.max_in_flight and front.max_writes_in_flight must be >= 1, got "
                              f"{self.max_in_flight} and {self.max_writes_in_flight}")
        if self.max_body_mb < 1 or self.stream_timeout_s < 1 or self.workers < 1:
            raise ConfigError("front.max_body_mb, front.stream_timeout_s and front.workers must be >= 1")
        for name in ("header_timeout_s", "body_timeout_s", "send_timeout_s", "keepalive_timeout_s"):
            if not 1 <= getattr(self, name) <= 3600:
                raise ConfigError(f"front.{name} must be in [1, 3600] seconds, got {getattr(self, name)}")
        if not re.fullmatch(r"[A-Za-z0-9_.:\[\]-]+", self.host):
            raise ConfigError(f"front.host: {self.host!r} is not an address")
