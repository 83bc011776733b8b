"""The offline layer's settings: the configuration sections of the models (ONNX runtime, embedder, cross-encoder,
late-interaction token encoder), chunking, BM25 analysis and the build, and :class:`ConfigError`.

A settings module: dataclasses and their checks only, importing nothing heavier than the standard library (no
model runtime, tokenizer, stemmer or index library), so that loading a configuration (``retrieval/config.py``)
costs milliseconds. The modules that use these sections re-export their names (``index_builder.models.encoders``,
``index_builder.models.runner``, ``index_builder.models.token_encoders``, ``index_builder.documents.analysis``,
``index_builder.documents.chunking``, ``index_builder.build.builder``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from index_builder.errors import ConfigError  # noqa: F401  (re-exported: the error of a bad configuration)

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


@dataclass(frozen=True)
class RuntimeConfig:
    """How ONNX Runtime runs a model.

    ``providers``: in order of preference; CPU is always appended as the last resort.
    ``intra_op_threads`` / ``inter_op_threads``: 0 lets ONNX Runtime choose (all physical cores).
    ``trt_cache_dir``: where TensorRT keeps built engines (first run on a GPU builds them: minutes).
    """

    providers: tuple[str, ...] = (CPU,)
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    trt_fp16: bool = True
    trt_cache_dir: str = ""
    graph_optimization: str = "all"  # "disable" | "basic" | "extended" | "all"
    # ONNX Runtime's CPU arena keeps the largest batch's activations allocated for the session's lifetime (hundreds
    # of MB for 32 passages of 256 tokens); off for sessions that run rarely (the live index's rebuild encoder).
    cpu_mem_arena: bool = True
    # ONNX Runtime's intra-op threads spin for a while after each run, waiting for the next one: lower latency for
    # a model run back to back, but the spinning takes the cores from every other model in the process. Off for a
    # model that runs between others (the cross-encoder: docs/results/interactive-cascade.md).
    allow_spinning: bool = True
    # With spinning allowed, the threads also spin on after a run returns, waiting for the next one, and hold the
    # cores through the stages that follow (faiss, BM25, the rows read). ``spin_after_run = false`` (the default;
    # ``session.force_spinning_stop``) keeps the spinning inside a run and stops it when the run returns: served at
    # 1M passages the dense stage went 4.0-4.5 -> 3.0-3.3 ms, and neutral or better at 10k and in the cascade
    # (docs/results/scale.md, "ONNX Runtime's threads stop spinning when a run returns").
    spin_after_run: bool = False

    def __post_init__(self) -> None:
        if self.graph_optimization not in GRAPH_OPTIMIZATIONS:
            raise ValueError(f"graph_optimization must be one of {sorted(GRAPH_OPTIMIZATIONS)}, got "
                             f"{self.graph_optimization!r}")
        if self.intra_op_threads < 0 or self.inter_op_threads < 0:
            raise ValueError("thread counts must be >= 0 (0 = onnxruntime's default)")


@dataclass(frozen=True)
class EmbedderConfig:
    """The dense embedder: mean pooling over the attention mask, then L2 normalisation."""

    model: str = BUNDLED
    max_length: int = 256  # all-MiniLM-L6-v2 was trained at 256 word pieces
    batch_size: int = 32
    hf_offline: bool = False
    cache_dir: str = ""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)


@dataclass(frozen=True)
class CrossEncoderConfig:
    """A sequence-classification ONNX model (one logit per pair); ``model`` "" = none configured."""

    model: str = ""
    # Pair length in word pieces (passage side cut). 128 rather than 256: on NFCorpus dev (324 queries) the shipped
    # model scored 0.3362 at 128 against 0.3317 at 256, at half the latency (bench/studies/ce_levers.py, README).
    max_length: int = 128
    batch_size: int = 16
    hf_offline: bool = False
    cache_dir: str = ""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    # "auto": on the CPU provider of a CPU with an int8 dot-product extension (AVX-512 VNNI, AVX-VNNI, AMX), serve
    # a dynamic int8 copy of the model, made on first use and cached (index_builder/models/int8.py): 0.55-0.61x the fp32
    # cost, nDCG@10 -0.002 to -0.007 (docs/results/interactive-cascade.md); elsewhere the model as it is (int8
    # kernels without those instructions are slower than fp32). "int8": the copy on any CPU; "fp32": never.
    precision: str = "auto"

    def __post_init__(self) -> None:
        if self.precision not in CE_PRECISIONS:
            raise ValueError(f"cross_encoder precision must be one of {', '.join(CE_PRECISIONS)}, got "
                             f"{self.precision!r}")


@dataclass(frozen=True)
class TokenEncoderConfig:
    """The late-interaction token model and its storage.

    ``model``: "" = the embedder's own token vectors; else a ColBERT ONNX folder (or Hugging Face id) with
    ``colbert_config.json``. ``query_maxlen`` / ``doc_maxlen``: 0 takes the model's own settings.
    """

    model: str = ""
    # how the token vectors are stored: a codec of index_builder/snapshot/token_codes.py, chosen by measurement
    # (each passage's tokens pooled 3 to 1, each kept as its signs and a float16 scale: 50 bytes a vector, ~3.4 KB a
    # passage against ~79 KB for "int8"; nDCG@10 -0.0008 SciFact, -0.0013 NFCorpus: docs/results/token-codes.md),
    # or "int8" / "float16"
    storage: str = "pool3+bins"
    batch_size: int = 32
    query_maxlen: int = 0
    doc_maxlen: int = 0
    hf_offline: bool = False
    cache_dir: str = ""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "storage", check_storage(self.storage))
        if self.batch_size < 1 or self.query_maxlen < 0 or self.doc_maxlen < 0:
            raise ValueError("batch_size must be >= 1 and query_maxlen/doc_maxlen >= 0 (0 = the model's own)")


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
class ChunkConfig:
    """``max_tokens``: word pieces of document text per chunk (the title is prepended on top);
    ``overlap``: word pieces shared by consecutive chunks; ``max_chunks_per_doc``: keep only a document's first
    N chunks (0 = all; 1 = truncate, as BEIR's published dense figures do), capping the cost of huge documents."""

    max_tokens: int = 224
    overlap: int = 48
    max_chunks_per_doc: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 16:
            raise ValueError(f"chunk max_tokens must be >= 16, got {self.max_tokens}")
        if not 0 <= self.overlap < self.max_tokens // 2 + 1:
            raise ValueError(f"chunk overlap must be in [0, {self.max_tokens // 2}], got {self.overlap}")
        if self.max_chunks_per_doc < 0:
            raise ValueError(f"max_chunks_per_doc must be >= 0 (0 = all), got {self.max_chunks_per_doc}")


@dataclass(frozen=True)
class AnalyzerConfig:
    """``stemmer``: a PyStemmer algorithm ("porter", "english" = Porter2, ...) or "none"."""

    stemmer: str = "porter"
    stopwords: str = "lucene"  # "lucene" or "none"
    lowercase: bool = True

    def __post_init__(self) -> None:
        if self.stemmer != "none":
            import Stemmer  # here, not at the top: the stemmer is needed to check a name, not to load a config

            if self.stemmer not in Stemmer.algorithms():
                raise ValueError(f"unknown stemmer {self.stemmer!r}; choose 'none' or one of {Stemmer.algorithms()}")
        if self.stopwords not in ("lucene", "none"):
            raise ValueError(f"unknown stopwords {self.stopwords!r}; choose 'lucene' or 'none'")


# ---------------------------------------------------------------------- the build


@dataclass(frozen=True)
class BM25Config:
    """Lucene BM25 parameters; the defaults are Pyserini's for BEIR (k1=0.9, b=0.4)."""

    k1: float = 0.9
    b: float = 0.4

    def __post_init__(self) -> None:
        if not (0 <= self.k1 <= 10 and 0 <= self.b <= 1):
            raise ValueError(f"bm25 needs 0 <= k1 <= 10 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")


@dataclass(frozen=True)
class HNSWConfig:
    """faiss HNSW build parameters (efSearch is a query-time setting: see retrieval's DenseConfig)."""

    m: int = 32
    ef_construction: int = 200

    def __post_init__(self) -> None:
        if not (4 <= self.m <= 128 and self.ef_construction >= self.m):
            raise ValueError(f"hnsw needs 4 <= m <= 128 and ef_construction >= m, got m={self.m}, "
                             f"ef_construction={self.ef_construction}")


@dataclass(frozen=True)
class RayBuildConfig:
    """``[build.ray]``: ``hybridrag build --ray ADDRESS`` (index_builder/build/ray_build.py). ``actors``: encoder actors
    (0: as many as the cluster's CPUs allow at ``actor_cpus`` each, or its GPUs at ``actor_gpus``); each loads the
    models once and runs ONNX with ``actor_cpus`` threads (CUDA/TensorRT providers as ``[embedder.runtime]`` says
    when ``actor_gpus`` > 0). ``prepare_cpus``: what a chunk-and-analyse task reserves (0: it runs beside the
    encoders). ``in_flight``: batches queued per actor (the driver waits beyond that: bounded memory)."""

    actors: int = 0
    actor_cpus: float = 1.0
    actor_gpus: float = 0.0
    prepare_cpus: float = 0.0
    in_flight: int = 2

    def __post_init__(self) -> None:
        if self.actors < 0 or self.actor_cpus <= 0 or self.actor_gpus < 0 or self.prepare_cpus < 0 \
                or self.in_flight < 1:
            raise ValueError(f"build.ray needs actors >= 0, actor_cpus > 0, actor_gpus >= 0, prepare_cpus >= 0 and "
                             f"in_flight >= 1; got {self}")


@dataclass(frozen=True)
class BuildConfig:
    embedder: EmbedderConfig = field(default_factory=EmbedderConfig)
    chunking: ChunkConfig = field(default_factory=ChunkConfig)
    analyzer: AnalyzerConfig = field(default_factory=AnalyzerConfig)
    bm25: BM25Config = field(default_factory=BM25Config)
    hnsw: HNSWConfig = field(default_factory=HNSWConfig)
    token_vectors: bool = True  # store per-token vectors for the late-interaction stage
    token_encoder: TokenEncoderConfig = field(default_factory=TokenEncoderConfig)
    keep_snapshots: int = 3  # generations kept on disk after a build (0 keeps all)
    # passages embedded at a time: one checkpoint of the build (a killed build resumes after its last one), and the
    # bound on what the build holds of model output at once (index_builder/build/builder.py)
    embed_batch: int = 1024
    # true: reuse the encodings the current snapshot, the write buffer and a killed build's checkpoints hold (by
    # chunk key: model files' sha256 and settings + passage); false embeds every passage again (to time a full
    # build, or after a runtime upgrade that changes the vectors the same model file makes)
    reuse: bool = True
    dense_index: str = "auto"  # [dense] index: auto, hnsw, hnsw_sq8, ivf_pq (index_builder/snapshot/dense_index.py)
    ray: RayBuildConfig = field(default_factory=RayBuildConfig)  # [build.ray]: a build on a Ray cluster

    def __post_init__(self) -> None:
        if not 1 <= self.embed_batch <= 65_536:
            raise ValueError(f"build.embed_batch must be in [1, 65536], got {self.embed_batch}")
