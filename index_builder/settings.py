"""The offline layer's settings: the configuration sections of the models (ONNX runtime, embedder, cross-encoder,
late-interaction token encoder), chunking, BM25 analysis and the build; :class:`ConfigError`; and the way every
section of the configuration declares its checks (:class:`Section`, :func:`bounded`, :func:`one_of`).

A settings module: dataclasses and their checks only, importing nothing heavier than the standard library (no
model runtime, tokenizer, stemmer or index library), so that loading a configuration (``retrieval/config.py``)
costs milliseconds. The modules that use these sections re-export their names (``index_builder.models.encoders``,
``index_builder.models.runner``, ``index_builder.models.token_encoders``, ``index_builder.documents.analysis``,
``index_builder.documents.chunking``, ``index_builder.build.builder``).

Each default says why in one line and names the report that measured it (``docs/results/``); the figures live
in the reports, and ``docs/configuration.md`` lists every key.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from index_builder.errors import ConfigError

T = TypeVar("T")
Limit = int | float | str | None  # a number, the name of another field of the section (its value), or no bound

# ---------------------------------------------------------------------- declared checks


class FieldError(ConfigError):
    """A field outside what its declaration allows. The message names the key, what is allowed and the value;
    the loader (``retrieval/config.py``) puts the section's place in the configuration before the key."""

    def __init__(self, section: str, name: str, allowed: str, value: Any) -> None:
        self.section, self.name, self.allowed, self.value = section, name, allowed, value
        super().__init__(f"{section + '.' if section else ''}{name} must be {allowed}, got {value!r}")

    def within(self, section: str) -> FieldError:
        return FieldError(section, self.name, self.allowed, self.value)

    def __reduce__(self) -> tuple[Any, ...]:  # across processes (Ray tasks, reader processes) with its fields
        return FieldError, (self.section, self.name, self.allowed, self.value)


def _is_number(value: Any, integer: bool) -> bool:
    return not isinstance(value, bool) and isinstance(value, int if integer else int | float)


def _show(limit: Limit, section: object) -> str:
    if isinstance(limit, str):
        return f"{limit} ({getattr(section, limit)!r})"
    return str(int(limit)) if isinstance(limit, float) and limit.is_integer() else str(limit)


@dataclass(frozen=True)
class Bound:
    """A number from ``lo`` to ``hi`` (either may be None; ``lo`` excluded when ``open_lo``); a limit given as a
    field's name is that field's value. ``note``: what special values mean ("0 = off").

    >>> Bound(1, 64).allowed(None, 0, True), Bound(0, open_lo=True).allowed(None, "x", False)
    ('in [1, 64]', 'a number > 0')
    """

    lo: Limit = None
    hi: Limit = None
    open_lo: bool = False
    note: str = ""

    def admits(self, value: Any, section: object, integer: bool) -> bool:
        if not _is_number(value, integer):
            return False
        lo = getattr(section, self.lo) if isinstance(self.lo, str) else self.lo
        hi = getattr(section, self.hi) if isinstance(self.hi, str) else self.hi
        return (lo is None or (value > lo if self.open_lo else value >= lo)) and (hi is None or value <= hi)

    def allowed(self, section: object, value: Any, integer: bool) -> str:
        lo, hi = _show(self.lo, section), _show(self.hi, section)
        if self.lo is not None and self.hi is not None:
            rule = f"in {'(' if self.open_lo else '['}{lo}, {hi}]"
        elif self.lo is not None:
            rule = f"{'>' if self.open_lo else '>='} {lo}"
        else:
            rule = f"<= {hi}"
        if not _is_number(value, integer):
            rule = f"{'an integer' if integer else 'a number'} {rule}"
        return f"{rule} ({self.note})" if self.note else rule


@dataclass(frozen=True)
class OneOf:
    """One of ``options``."""

    options: tuple[str, ...]

    def admits(self, value: Any, section: object, integer: bool) -> bool:
        return value in self.options

    def allowed(self, section: object, value: Any, integer: bool) -> str:
        return f"one of {', '.join(self.options)}"


def bounded(default: T, lo: Limit = None, hi: Limit = None, *, open_lo: bool = False, note: str = "") -> T:
    """A numeric field with its range, checked when the section is made: ``x: int = bounded(3, 1, 64)``."""
    return field(default=default, metadata={"check": Bound(lo, hi, open_lo, note)})


def one_of(default: T, options: Sequence[str]) -> T:
    """A field that takes one of ``options``: ``exporter: str = one_of("none", EXPORTERS)``."""
    return field(default=default, metadata={"check": OneOf(tuple(options))})


_DECLARED: dict[type, tuple[tuple[str, Bound | OneOf, bool], ...]] = {}


def _declared(cls: type) -> tuple[tuple[str, Bound | OneOf, bool], ...]:
    """(name, rule, annotated int) of each field of ``cls`` that declares a rule (worked out once per class)."""
    if cls not in _DECLARED:
        hints = typing.get_type_hints(cls)
        _DECLARED[cls] = tuple((f.name, f.metadata["check"], hints[f.name] is int)
                               for f in dataclasses.fields(cls) if "check" in f.metadata)
    return _DECLARED[cls]


def check_fields(section: Section) -> None:
    """Every declared rule of ``section``'s fields; :class:`FieldError` for the first one broken."""
    for name, rule, integer in _declared(type(section)):
        value = getattr(section, name)
        if not rule.admits(value, section, integer):
            raise FieldError(section.SECTION, name, rule.allowed(section, value, integer), value)


@dataclass(frozen=True)
class Section:
    """A section of the configuration: when made (by the loader, by hand or by ``dataclasses.replace``) its
    fields' declared rules are checked (:func:`bounded`, :func:`one_of`), then :meth:`check`."""

    SECTION: ClassVar[str] = ""  # its place in the configuration, for messages; "" for a shape used in several

    def __post_init__(self) -> None:
        check_fields(self)
        self.check()

    def check(self) -> None:
        """Rules a field declaration cannot say (between fields, patterns); raise :meth:`fail`."""

    def fail(self, name: str, allowed: str) -> FieldError:
        return FieldError(self.SECTION, name, allowed, getattr(self, name))


# ---------------------------------------------------------------------- models

CPU = "CPUExecutionProvider"
GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
GRAPH_OPTIMIZATIONS = ("disable", "basic", "extended", "all")  # onnx_runner maps them to ONNX Runtime's levels
BUNDLED = "bundled"  # the offline default model (index_builder.models.encoders.bundled_minilm)
CE_PRECISIONS = ("auto", "int8", "fp32")  # [cross_encoder] precision (index_builder/models/int8.py)
STORAGES = ("float16", "int8")  # the plain storages; a stateless codec spec (CodecSpec) is one too
# the token codecs' words (index_builder/snapshot/token_codes.py codes and scores them)
QUANTS = ("int8", "int4", "bin", "bins", "res1", "res2")
DEFAULT_CENTROIDS = 1024
POOL_METHODS = ("ward", "colbert")  # index_builder/snapshot/token_pooling.py
DENSE_INDEXES = ("auto", "hnsw", "hnsw_sq8", "ivf_pq")  # index_builder/snapshot/dense_index.py


@dataclass(frozen=True)
class RuntimeConfig(Section):
    """How ONNX Runtime runs a model (``[embedder.runtime]``, ``[late_interaction.runtime]``,
    ``[cross_encoder.runtime]``).

    ``providers``: in order of preference; CPU is always appended as the last resort.
    ``trt_cache_dir``: where TensorRT keeps built engines (first run on a GPU builds them: minutes).
    Threads stop spinning when a run returns (``session.force_spinning_stop``), so they do not hold the cores
    through the stages that follow (docs/results/scale.md).
    """

    providers: tuple[str, ...] = (CPU,)
    intra_op_threads: int = bounded(0, 0, note="0 = onnxruntime's default: all physical cores")
    inter_op_threads: int = bounded(0, 0, note="0 = onnxruntime's default")
    trt_fp16: bool = True
    trt_cache_dir: str = ""
    graph_optimization: str = one_of("all", GRAPH_OPTIMIZATIONS)
    # the arena keeps the largest batch's activations for the session's life; off for rarely run sessions (the
    # live index's rebuild encoder sets it: docs/results/hardening.md)
    cpu_mem_arena: bool = True
    # false for a model that runs between others: its spinning threads take their cores
    # (docs/results/interactive-cascade.md)
    allow_spinning: bool = True


@dataclass(frozen=True)
class EmbedderConfig(Section):
    """The dense embedder: mean pooling over the attention mask, then L2 normalisation."""

    SECTION = "embedder"
    model: str = BUNDLED
    max_length: int = bounded(256, 1)  # all-MiniLM-L6-v2 was trained at 256 word pieces
    batch_size: int = bounded(32, 1)
    hf_offline: bool = False
    cache_dir: str = ""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)


@dataclass(frozen=True)
class CrossEncoderConfig(Section):
    """A sequence-classification ONNX model (one logit per pair); ``model`` "" = none configured."""

    SECTION = "cross_encoder"
    model: str = ""
    # pair length in word pieces (the passage side cut): no worse than 256 at half the cost (docs/results/reranking.md)
    max_length: int = bounded(128, 1)
    batch_size: int = bounded(16, 1)
    hf_offline: bool = False
    cache_dir: str = ""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    # "auto": a dynamic int8 copy (index_builder/models/int8.py) on a CPU with an int8 dot-product extension
    # (VNNI, AMX), where it costs about half of fp32 at a small loss, the model as it is elsewhere;
    # "int8": the copy on any CPU; "fp32": never (docs/results/cross-encoder-defaults.md)
    precision: str = one_of("auto", CE_PRECISIONS)


@dataclass(frozen=True)
class TokenEncoderConfig(Section):
    """The late-interaction token model and its storage.

    ``model``: "" = the embedder's own token vectors; else a ColBERT ONNX folder (or Hugging Face id) with
    ``colbert_config.json``. ``query_maxlen`` / ``doc_maxlen``: 0 takes the model's own settings.
    """

    SECTION = "late_interaction"
    model: str = ""
    # a stateless codec of index_builder/snapshot/token_codes.py, or "int8" / "float16": tokens pooled 3 to 1, each
    # kept as its signs and a scale, a twentieth of int8's bytes at a small loss (docs/results/token-codes.md)
    storage: str = "pool3+bins"
    batch_size: int = bounded(32, 1)
    query_maxlen: int = bounded(0, 0, note="0 = the model's own")
    doc_maxlen: int = bounded(0, 0, note="0 = the model's own")
    hf_offline: bool = False
    cache_dir: str = ""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def check(self) -> None:
        object.__setattr__(self, "storage", check_storage(self.storage))


# ---------------------------------------------------------------------- token storage

@dataclass(frozen=True)
class CodecSpec:
    """What a codec does: ``quant`` (one of :data:`QUANTS`), ``pca`` (coded dims, 0 = no projection), ``pool``
    (pool factor at build, 1 = none; ``pool_method`` ``ward`` over the unit vectors, or ``colbert``: Stanford
    ColBERT's call, Ward over the rows of the cosine-distance matrix), ``centroids`` (``res*`` only).

    >>> s = CodecSpec.parse("res2+pool2+pca128")
    >>> str(s), s.centroids
    ('pool2+pca128+res2+k1024', 1024)
    >>> str(CodecSpec.parse("int8")), str(CodecSpec.parse("colpool3+bins"))
    ('int8', 'colpool3+bins')
    """

    quant: str = "int8"
    pca: int = 0
    pool: int = 1
    pool_method: str = "ward"
    centroids: int = 0

    def __post_init__(self) -> None:
        if self.quant not in QUANTS:
            raise ValueError(f"unknown quantiser {self.quant!r} (known: {', '.join(QUANTS)})")
        if self.pca < 0 or self.pool < 1 or self.centroids < 0:
            raise ValueError(f"bad codec spec {self!r}")
        if self.pool_method not in POOL_METHODS:
            raise ValueError(f"unknown pool method {self.pool_method!r} (known: {', '.join(POOL_METHODS)})")
        if self.quant.startswith("res") and not self.centroids:
            object.__setattr__(self, "centroids", DEFAULT_CENTROIDS)
        if not self.quant.startswith("res") and self.centroids:
            raise ValueError(f"centroids apply to res1/res2 only, not {self.quant}")

    @classmethod
    def parse(cls, text: str | CodecSpec) -> CodecSpec:
        if isinstance(text, CodecSpec):
            return text
        kw: dict[str, Any] = {}
        for part in (p.strip() for p in str(text).split("+") if p.strip()):
            if part in QUANTS:
                kw["quant"] = part
            elif part.startswith("pca") and part[3:].isdigit():
                kw["pca"] = int(part[3:])
            elif part.startswith("colpool") and part[7:].isdigit():
                kw["pool"], kw["pool_method"] = int(part[7:]), "colbert"
            elif part.startswith("pool") and part[4:].isdigit():
                kw["pool"] = int(part[4:])
            elif part.startswith("k") and part[1:].isdigit():
                kw["centroids"] = int(part[1:])
            else:
                raise ValueError(f"unknown codec step {part!r} in {text!r}")
        return cls(**kw)

    def __str__(self) -> str:
        parts = []
        if self.pool > 1:
            parts.append(f"{'colpool' if self.pool_method == 'colbert' else 'pool'}{self.pool}")
        if self.pca:
            parts.append(f"pca{self.pca}")
        parts.append(self.quant)
        if self.quant.startswith("res"):
            parts.append(f"k{self.centroids}")
        return "+".join(parts)


def is_stateless(spec: CodecSpec) -> bool:
    """A codec with nothing to fit (no projection, no centroids): pooling and the per-vector quantisers. Only
    these are index storages: a build codes each batch as it is embedded, with no pass over the corpus first."""
    return spec.pca == 0 and not spec.quant.startswith("res")


def check_storage(storage: str) -> str:
    """``storage`` as an index stores it (``[late_interaction] storage``): ``float16``, ``int8`` or a stateless codec
    spec (``pool3+bins``), normalised; ValueError naming the problem otherwise.

    >>> check_storage("bins+pool3"), check_storage("int8")
    ('pool3+bins', 'int8')
    """
    if storage in STORAGES:
        return storage
    try:
        spec = CodecSpec.parse(storage)
    except ValueError as e:
        raise ValueError(f"late_interaction.storage {storage!r}: {e} (float16, int8, or a codec such as "
                         f"pool3+bins: index_builder/snapshot/token_codes.py)") from None
    if not is_stateless(spec):
        raise ValueError(f"late_interaction.storage {storage!r} needs a codec fitted on the corpus (pca, res*): "
                         f"not an index storage; use float16, int8, int4, bin or bins, optionally poolN")
    return str(spec)


# ---------------------------------------------------------------------- text


@dataclass(frozen=True)
class ChunkConfig(Section):
    """``max_tokens``: word pieces of document text per chunk (the title is prepended on top);
    ``overlap``: word pieces shared by consecutive chunks; ``max_chunks_per_doc``: keep only a document's first
    N chunks (0 = all; 1 = truncate, as BEIR's published dense figures do), capping the cost of huge documents."""

    SECTION = "chunking"
    max_tokens: int = bounded(224, 16)
    overlap: int = bounded(48, 0)
    max_chunks_per_doc: int = bounded(0, 0, note="0 = all")

    def check(self) -> None:
        if self.overlap > self.max_tokens // 2:
            raise self.fail("overlap", f"in [0, {self.max_tokens // 2}] (half of max_tokens)")


@dataclass(frozen=True)
class AnalyzerConfig(Section):
    """``stemmer``: a PyStemmer algorithm ("porter", "english" = Porter2, ...) or "none". ``identifiers``: a term
    joined by ``_`` or ``-`` (``--preserve-root``, ``ERR_CONNECTION_RESET``, ``opts.worker_threads``) is also kept
    whole beside its parts, so the one passage that holds it exactly outranks passages with the parts scattered
    (index_builder/documents/analysis.py)."""

    SECTION = "analyzer"
    stemmer: str = "porter"
    stopwords: str = one_of("lucene", ("lucene", "none"))
    lowercase: bool = True
    identifiers: bool = True

    def check(self) -> None:
        if self.stemmer != "none":
            import Stemmer  # here, not at the top: the stemmer is needed to check a name, not to load a config

            if self.stemmer not in Stemmer.algorithms():
                raise self.fail("stemmer", f"'none' or one of {', '.join(Stemmer.algorithms())}")


# ---------------------------------------------------------------------- the build


@dataclass(frozen=True)
class BM25Config(Section):
    """Lucene BM25 parameters; the defaults are Pyserini's for BEIR (k1=0.9, b=0.4)."""

    SECTION = "bm25"
    k1: float = bounded(0.9, 0, 10)
    b: float = bounded(0.4, 0, 1)


@dataclass(frozen=True)
class HNSWConfig(Section):
    """faiss HNSW build parameters (efSearch is a query-time setting: see retrieval's DenseConfig)."""

    SECTION = "hnsw"
    m: int = bounded(32, 4, 128)
    ef_construction: int = bounded(200, "m")


@dataclass(frozen=True)
class RayBuildConfig(Section):
    """``[build.ray]``: ``hybridrag build --ray ADDRESS`` (index_builder/build/ray_build.py). ``actors``: encoder
    actors (0: as many as the cluster's CPUs allow at ``actor_cpus`` each, or its GPUs at ``actor_gpus``); each
    loads the models once and runs ONNX with ``actor_cpus`` threads (CUDA/TensorRT providers as
    ``[embedder.runtime]`` says when ``actor_gpus`` > 0). ``prepare_cpus``: what a chunk-and-analyse task reserves
    (0: it runs beside the encoders). ``in_flight``: batches queued per actor (the driver waits beyond that:
    bounded memory)."""

    SECTION = "build.ray"
    actors: int = bounded(0, 0, note="0 = as many as the cluster allows")
    actor_cpus: float = bounded(1.0, 0, open_lo=True)
    actor_gpus: float = bounded(0.0, 0)
    prepare_cpus: float = bounded(0.0, 0)
    in_flight: int = bounded(2, 1)


@dataclass(frozen=True)
class BuildOptions(Section):
    """``[build]``: the build's own settings (the models, chunking and analysis have their own sections;
    :class:`BuildConfig` gathers what a build reads)."""

    SECTION = "build"
    token_vectors: bool = True  # store per-token vectors for the late-interaction stage
    keep_snapshots: int = bounded(3, 0, note="0 keeps all")  # generations kept on disk after a build
    # passages embedded at a time: one checkpoint of the build (a killed build resumes after its last one), and the
    # bound on what the build holds of model output at once (index_builder/build/builder.py)
    embed_batch: int = bounded(1024, 1, 65_536)
    # reuse the encodings the current snapshot, the write buffer and a killed build's checkpoints hold (by chunk
    # key: model files' sha256 and settings + passage); false embeds every passage again (to time a full build, or
    # after a runtime upgrade that changes the vectors the same model file makes)
    reuse: bool = True
    ray: RayBuildConfig = field(default_factory=RayBuildConfig)  # [build.ray]: a build on a Ray cluster


@dataclass(frozen=True)
class BuildConfig(BuildOptions):
    """What a build reads: the ``[build]`` options and the sections of the models, text and dense index it uses,
    gathered from an application configuration by ``retrieval.config.AppConfig.build_config``."""

    embedder: EmbedderConfig = field(default_factory=EmbedderConfig)
    chunking: ChunkConfig = field(default_factory=ChunkConfig)
    analyzer: AnalyzerConfig = field(default_factory=AnalyzerConfig)
    bm25: BM25Config = field(default_factory=BM25Config)
    hnsw: HNSWConfig = field(default_factory=HNSWConfig)
    token_encoder: TokenEncoderConfig = field(default_factory=TokenEncoderConfig)
    dense_index: str = one_of("auto", DENSE_INDEXES)  # [dense] index (index_builder/snapshot/dense_index.py)
