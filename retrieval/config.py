"""Configuration: one frozen dataclass per component, assembled into :class:`AppConfig` at the edge.

Sources, later ones winning: the defaults below, a TOML file (``--config``), environment variables
``HYBRIDRAG_<SECTION>__<KEY>`` (e.g. ``HYBRIDRAG_FUSION__K=40``; lists comma-separated:
``HYBRIDRAG_EMBEDDER__RUNTIME__PROVIDERS=CUDAExecutionProvider,CPUExecutionProvider``), then CLI flags.
Only :func:`load_config` reads files or the environment; everything below it receives values.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from index_builder.analysis import AnalyzerConfig
from index_builder.build import BM25Config, BuildConfig, HNSWConfig
from index_builder.chunking import ChunkConfig
from index_builder.errors import ConfigError
from index_builder.models import CrossEncoderConfig, EmbedderConfig
from index_builder.token_encoders import TokenEncoderConfig
from retrieval.generation.backend import GenerationConfig
from retrieval.observability.tracing import TracingConfig
from retrieval.search.batching import BatcherConfig
from retrieval.search.dense import DenseConfig
from retrieval.search.semantic_cache import SemanticCacheConfig
from retrieval.serving.metrics import MetricsConfig

ENV_PREFIX = "HYBRIDRAG_"


@dataclass(frozen=True)
class FusionConfig:
    """RRF: ``score = sum_r w_r / (k + rank_r)``. Chosen on SciFact train + NFCorpus dev (see README)."""

    k: float = 10.0
    bm25_weight: float = 1.0
    dense_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.k <= 0 or self.bm25_weight < 0 or self.dense_weight < 0:
            raise ValueError(f"fusion needs k > 0 and weights >= 0, got {self}")


@dataclass(frozen=True)
class FirstStageConfig:
    """``candidates``: top-N taken from each retriever before fusion; ``max_k``/``max_candidates``: request limits."""

    candidates: int = 100
    max_k: int = 100
    max_candidates: int = 1000
    max_query_chars: int = 2048
    parallel: bool = True  # BM25 and dense search run concurrently in the worker pool
    workers: int = 4
    # BLAS threads for the pipeline's numpy work (MaxSim): its small matrix products gain nothing from threads,
    # and OpenBLAS's idle threads spin and steal the encoder's cores (pipeline p50 on SciFact: 48 ms with the
    # default threads, 24 ms with 1). 0 leaves the process setting alone.
    blas_threads: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.candidates <= self.max_candidates:
            raise ValueError(f"candidates must be in [1, {self.max_candidates}], got {self.candidates}")


@dataclass(frozen=True)
class RerankConfig:
    """The cascade after fusion: late interaction (MaxSim over stored token vectors) reorders the top
    ``li_top_k``, then the cross-encoder reorders the top ``ce_top_k``. ``max_top_k``: the largest K a request
    may ask for.

    Defaults from the tuning splits (SciFact train, NFCorpus dev; README: Results): late interaction with the
    embedder's own token vectors raised the fused list on both (+0.006, +0.009), so it is on; the shipped
    cross-encoder lowered the late-interaction list on NFCorpus dev, so it is off.

    Deadlines: a stage is skipped (and the result marked degraded) when the time left before the request's
    deadline is below that stage's recent p95 latency (over the last ``latency_window`` runs); the cross-encoder
    goes first, then late interaction. ``budget_ms`` > 0 gives requests without a deadline one.

    ``li_weight`` / ``ce_weight``: the stage's share in its head's new order; below 1 the stage's scores are blended
    with the order it received (:mod:`rerank.interpolation`; ``hybridrag train`` reports the best weight on dev).
    1 = the stage alone.
    """

    late_interaction: bool = True
    li_top_k: int = 20
    li_weight: float = 1.0
    cross_encoder: bool = False
    ce_top_k: int = 5
    ce_weight: float = 1.0
    max_top_k: int = 100
    budget_ms: float = 0.0
    latency_window: int = 200

    def __post_init__(self) -> None:
        for name in ("li_top_k", "ce_top_k"):
            if not 1 <= getattr(self, name) <= self.max_top_k:
                raise ValueError(f"{name} must be in [1, {self.max_top_k}], got {getattr(self, name)}")
        if self.budget_ms < 0 or self.latency_window < 1:
            raise ValueError("budget_ms must be >= 0 and latency_window >= 1")
        for name in ("li_weight", "ce_weight"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1] (1 = the stage alone), got {getattr(self, name)}")


@dataclass(frozen=True)
class BatchingConfig:
    """Cross-request dynamic batching, one batcher per model role (see retrieval/search/batching.py)."""

    embed: BatcherConfig = field(default_factory=lambda: BatcherConfig(max_batch_size=32, max_wait_ms=2.0))
    query_tokens: BatcherConfig = field(default_factory=lambda: BatcherConfig(max_batch_size=32, max_wait_ms=2.0))
    cross_encoder: BatcherConfig = field(default_factory=lambda: BatcherConfig(max_batch_size=64, max_wait_ms=2.0))
    model_workers: int = 4  # threads running model batches (and unbatched model calls)

    def __post_init__(self) -> None:
        if self.model_workers < 1:
            raise ValueError(f"model_workers must be >= 1, got {self.model_workers}")


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

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535 or self.max_in_flight < 1 or self.max_writes_in_flight < 1 or self.grace_s < 0:
            raise ValueError("server needs 0 <= port <= 65535, max_in_flight >= 1, max_writes_in_flight >= 1 and "
                             "grace_s >= 0")
        if not 0 <= self.switch_interval_ms <= 100:
            raise ValueError(f"server.switch_interval_ms must be in [0, 100], got {self.switch_interval_ms}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("server.tls_cert and server.tls_key go together")


@dataclass(frozen=True)
class LiveConfig:
    """Background rebuilds of the live index: when this many writes are buffered, or the oldest buffered write
    is this old (0 = never by that rule); checked every ``check_interval_s``."""

    rebuild_after_writes: int = 1000
    rebuild_after_s: float = 600.0
    check_interval_s: float = 1.0
    # ONNX threads of the rebuild's own encoder: fewer than the cores leaves the rest to the queries being served
    # while a rebuild runs (0 = the serving encoder's setting). bench/live.py measures the effect.
    rebuild_threads: int = 1
    # Nice value of the rebuild thread (Linux: per thread): the scheduler gives the rebuild the CPU the queries
    # leave over, so serving latency stays steady (bench/live.py measures it). 0 = normal priority.
    rebuild_nice: int = 19
    # The write buffer's bound between rebuilds (live documents): an upsert that would pass it is refused at once
    # (RESOURCE_EXHAUSTED, "write buffer full") and starts the rebuild. MAXBUF_COMMENT
    max_buffered_docs: int = 20_000

    def __post_init__(self) -> None:
        if self.rebuild_after_writes < 0 or self.rebuild_after_s < 0 or self.check_interval_s <= 0 \
                or self.rebuild_threads < 0 or not 0 <= self.rebuild_nice <= 19 or self.max_buffered_docs < 1:
            raise ValueError("live needs rebuild_after_writes >= 0, rebuild_after_s >= 0, check_interval_s > 0, "
                             "rebuild_threads >= 0, 0 <= rebuild_nice <= 19, max_buffered_docs >= 1")


@dataclass(frozen=True)
class IndexConfig:
    verify_checksums: bool = True  # sha256 every snapshot file at load (seconds for GBs of token vectors)


@dataclass(frozen=True)
class BuildOptions:
    token_vectors: bool = True
    keep_snapshots: int = 3


@dataclass(frozen=True)
class AppConfig:
    embedder: EmbedderConfig = field(default_factory=EmbedderConfig)
    chunking: ChunkConfig = field(default_factory=ChunkConfig)
    analyzer: AnalyzerConfig = field(default_factory=AnalyzerConfig)
    bm25: BM25Config = field(default_factory=BM25Config)
    hnsw: HNSWConfig = field(default_factory=HNSWConfig)
    build: BuildOptions = field(default_factory=BuildOptions)
    dense: DenseConfig = field(default_factory=DenseConfig)
    fusion: FusionConfig = field(default_factory=FusionConfig)
    first_stage: FirstStageConfig = field(default_factory=FirstStageConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    rerank: RerankConfig = field(default_factory=RerankConfig)
    late_interaction: TokenEncoderConfig = field(default_factory=TokenEncoderConfig)
    cross_encoder: CrossEncoderConfig = field(default_factory=CrossEncoderConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    live: LiveConfig = field(default_factory=LiveConfig)
    cache: SemanticCacheConfig = field(default_factory=SemanticCacheConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)

    def build_config(self) -> BuildConfig:
        return BuildConfig(embedder=self.embedder, chunking=self.chunking, analyzer=self.analyzer, bm25=self.bm25,
                           hnsw=self.hnsw, token_vectors=self.build.token_vectors,
                           token_encoder=self.late_interaction, keep_snapshots=self.build.keep_snapshots)


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """Convert a TOML or environment value to the annotated type (strings from the environment are parsed)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return _from_dict(tp, value, where)
    if origin in (tuple, list):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (inner, *_) = typing.get_args(tp) or (str,)
        return tuple(_coerce(inner, v, where) for v in value)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _coerce(args[0], value, where)
    try:
        if tp is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            if not isinstance(value, bool):
                raise ValueError(value)
            return value
        if tp is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)
            return int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        if tp is str:
            if not isinstance(value, str):
                raise ValueError(value)
            return value
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}") from None
    return value


def _from_dict(cls: Any, data: Mapping[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"{where or 'config'}: unknown key(s) {sorted(unknown)}; known: {sorted(names)}")
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}" if where else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ConfigError(f"{where or 'config'}: {e}") from None


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out.get(k, {}), v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """``HYBRIDRAG_A__B=v`` -> ``{"a": {"b": "v"}}``; ``HF_HUB_OFFLINE=1`` -> embedder.hf_offline."""
    out: dict[str, Any] = {}
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX) and "__" in key:
            path = key[len(ENV_PREFIX):].lower().split("__")
            node = out
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = value
    if environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        out = _merge(out, {"embedder": {"hf_offline": "true"}})
    return out


def load_config(path: str | Path | None = None, *, environ: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> AppConfig:
    """Defaults <- TOML file <- environment <- explicit overrides (CLI flags), validated into an AppConfig."""
    data: dict[str, Any] = {}
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    data = _merge(data, env_overrides(os.environ if environ is None else environ))
    data = _merge(data, overrides or {})
    return _from_dict(AppConfig, data, "")
