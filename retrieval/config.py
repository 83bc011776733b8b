"""Configuration: one frozen dataclass per component, assembled into :class:`AppConfig` at the edge.

Sources, later ones winning: the defaults below, a TOML file (``--config``), environment variables
``HYBRIDRAG_<SECTION>__<KEY>`` (e.g. ``HYBRIDRAG_FUSION__K=40``; lists comma-separated:
``HYBRIDRAG_EMBEDDER__RUNTIME__PROVIDERS=CUDAExecutionProvider,CPUExecutionProvider``), then CLI flags.
Only :func:`load_config` reads files or the environment; everything below it receives values. Every section checks
its own fields when made (``index_builder.settings.Section``); the loader names the key's place. Keys that were
removed are refused with the reason (:data:`REMOVED`); docs/configuration.md lists every key and the removed ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from index_builder.settings import (
    AnalyzerConfig,
    BM25Config,
    BuildConfig,
    BuildOptions,
    ChunkConfig,
    ConfigError,
    CrossEncoderConfig,
    EmbedderConfig,
    FieldError,
    HNSWConfig,
    TokenEncoderConfig,
)
from retrieval.engines.settings import EngineConfig
from retrieval.generation.settings import GenerationConfig
from retrieval.live.settings import LiveConfig
from retrieval.observability.settings import TracingConfig
from retrieval.search.settings import (
    BatchingConfig,
    DenseConfig,
    FirstStageConfig,
    FusionConfig,
    IndexConfig,
    RerankConfig,
    SemanticCacheConfig,
)
from retrieval.serving.settings import FrontConfig, HttpConfig, MetricsConfig, ServerConfig

ENV_PREFIX = "HYBRIDRAG_"
# Each room defines its own config sections in its settings module (``<room>/settings.py``: dataclasses and their
# checks, nothing heavier), and this module imports only those (scripts/import_graph.py checks it), so that loading
# a configuration imports no model runtime, index library or server. It assembles them (and re-exports some for
# callers that build one by hand).
__all__ = ["AppConfig", "BatchingConfig", "BuildOptions", "DenseConfig", "FirstStageConfig", "FusionConfig",
           "HttpConfig", "IndexConfig", "LiveConfig", "RerankConfig", "ServerConfig", "load_config"]

# Keys taken out (issue 52), each with why: a file or variable that still sets one is refused with this reason
# rather than a bare "unknown key". docs/configuration.md ("Removed keys") lists the same.
_SPIN = ("measured worse: threads that spin on after a run hold the cores from the stages that follow; they now "
         "always stop when a run returns (docs/results/scale.md)")
REMOVED: dict[str, str] = {
    "rerank.li_score": ("measured, not better: token-standardised MaxSim (\"token_z\") lost to plain MaxSim on every "
                        "short-query tuning set (docs/results/cascade-robustness.md); late interaction scores MaxSim"),
    "embedder.runtime.spin_after_run": _SPIN,
    "late_interaction.runtime.spin_after_run": _SPIN,
    "cross_encoder.runtime.spin_after_run": _SPIN,
}


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
    backend: EngineConfig = field(default_factory=EngineConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    front: FrontConfig = field(default_factory=FrontConfig)

    def build_config(self) -> BuildConfig:
        """What a build reads: ``[build]`` with the sections of the models, text and dense index it uses."""
        options = {f.name: getattr(self.build, f.name) for f in dataclasses.fields(BuildOptions)}
        return BuildConfig(**options, embedder=self.embedder, chunking=self.chunking, analyzer=self.analyzer,
                           bm25=self.bm25, hnsw=self.hnsw, token_encoder=self.late_interaction,
                           dense_index=self.dense.index)


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
    for key in sorted(set(data) - names):
        path = f"{where}.{key}" if where else key
        if path in REMOVED:
            raise ConfigError(f"{path} was removed: {REMOVED[path]}. Delete it from the configuration "
                              "(docs/configuration.md#removed-keys)")
        close = difflib.get_close_matches(key, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{where or 'config'}: unknown key {key!r}; {hint}known: {', '.join(sorted(names))}")
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}" if where else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except FieldError as e:
        raise e.within(where) from None
    except ValueError as e:  # a section's own check; its message may name the key already
        message = str(e)
        raise ConfigError(message if where and message.startswith(f"{where}.") else f"{where or 'config'}: {message}") \
            from None


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
