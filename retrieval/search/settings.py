"""The search room's settings: every configuration section of retrieval/search (first stage, fusion, dense search,
index loading, the cascade, cross-request batching, the result cache) and the protocol of what the pipeline reads
from an application configuration. A settings module: dataclasses and their checks only, so that loading a
configuration (retrieval/config.py) imports no model runtime, index library or server. Each default says why in
one line and names its report (docs/results/); docs/configuration.md lists every key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from index_builder.settings import DENSE_INDEXES, Section, TokenEncoderConfig, bounded, one_of


@dataclass(frozen=True)
class FusionConfig(Section):
    """RRF: ``score = sum_r w_r / (k + rank_r)``; k chosen on SciFact train + NFCorpus dev
    (docs/results/foundation-and-first-stage.md)."""

    SECTION = "fusion"
    k: float = bounded(10.0, 0, open_lo=True)
    bm25_weight: float = bounded(1.0, 0)
    dense_weight: float = bounded(1.0, 0)


@dataclass(frozen=True)
class DenseConfig(Section):
    """``ef_search``: HNSW beam width at query time (raised to the number of chunks asked for);
    ``oversample``: chunks fetched per wanted document (documents have several chunks);
    ``exact_below``: allowed fraction of the corpus under which a filtered query searches exactly.

    ``index``: the index a build makes (index_builder/snapshot/dense_index.py): "auto" (by corpus size), "hnsw"
    (float vectors in the graph), "hnsw_sq8" (8-bit codes), "ivf_pq" (48-byte codes); the compressed kinds re-score
    candidates from the float vectors (memory-mapped): IVF-PQ its best ``rescore`` x the chunks wanted, HNSW-SQ8
    the chunks wanted out of a beam ``rescore`` x as wide; ``nprobe``: lists an IVF-PQ search visits
    (docs/results/scale.md)."""

    SECTION = "dense"
    ef_search: int = bounded(128, 1)
    oversample: float = bounded(3.0, 1)
    exact_below: float = bounded(0.05, 0, 1)
    index: str = one_of("auto", DENSE_INDEXES)
    rescore: float = bounded(4.0, 1)
    nprobe: int = bounded(32, 1)


@dataclass(frozen=True)
class IndexConfig(Section):
    SECTION = "index"
    verify_checksums: bool = True  # sha256 every snapshot file at load (seconds for GBs of token vectors)


@dataclass(frozen=True)
class BatcherConfig(Section):
    """Dynamic batching for one model role (``[batching.embed]``, ``[batching.query_tokens]``,
    ``[batching.cross_encoder]``; retrieval/search/batching.py).

    ``max_batch_size``: most items per call of the batch function. ``max_wait_ms``: longest a batch is held open
    for more items after its first item was submitted (0 = take whatever is already queued, never wait).
    ``enabled``: False calls the function once per item (the unbatched baseline of bench/batching.py).
    ``max_concurrent_batches``: batches running in the executor at once; more than one lets the next batch be
    collected while the previous one computes. ``idle_dispatch``: dispatch at once when no batch is running (the
    window only holds items that queued behind a running batch); False = every batch waits out its window (the
    policy before issue 26, for bench/batching.py; docs/results/interactive-cascade.md).
    """

    max_batch_size: int = bounded(32, 1, 1024)
    max_wait_ms: float = bounded(2.0, 0, 1000)
    enabled: bool = True
    max_concurrent_batches: int = bounded(2, 1, 64)
    idle_dispatch: bool = True


@dataclass(frozen=True)
class BatchingConfig(Section):
    """Cross-request dynamic batching, one batcher per model role (see retrieval/search/batching.py)."""

    SECTION = "batching"
    embed: BatcherConfig = field(default_factory=lambda: BatcherConfig(max_batch_size=32, max_wait_ms=2.0))
    query_tokens: BatcherConfig = field(default_factory=lambda: BatcherConfig(max_batch_size=32, max_wait_ms=2.0))
    cross_encoder: BatcherConfig = field(default_factory=lambda: BatcherConfig(max_batch_size=64, max_wait_ms=2.0))
    model_workers: int = bounded(4, 1)  # threads running model batches (and unbatched model calls)


@dataclass(frozen=True)
class SemanticCacheConfig(Section):
    """``threshold``: the cosine at or above which a cached query may answer a new one; ``guard``: the candidate
    must also pass :func:`same_meaning_markers`; both chosen on the hand-written SciFact query log (bench/querylog,
    in-sample: docs/results/generation.md). ``ttl_s``: an entry's lifetime; ``max_entries``: all scopes together,
    least recently used evicted first."""

    SECTION = "cache"
    enabled: bool = True
    threshold: float = bounded(0.91, 0, 1, open_lo=True)
    guard: bool = True  # also require the same numbers, negations and direction words (same_meaning_markers)
    ttl_s: float = bounded(600.0, 0, open_lo=True)
    max_entries: int = bounded(10_000, 1)
    # all entries together, as the callers estimate them: a bound in bytes, because entries differ a lot in size
    max_bytes: int = bounded(256 * 2**20, 1)
    # shared across replicas (retrieval.search.shared_cache): a redis:// URL; "" = this process only
    redis_url: str = ""
    redis_namespace: str = "hybridrag"
    redis_timeout_s: float = 0.5


@dataclass(frozen=True)
class FirstStageConfig(Section):
    """``candidates``: top-N taken from each retriever before fusion; ``max_k``/``max_candidates``: request limits.

    How a request runs (retrieval/search/runner.py): ``solo_when_idle``: a request that finds no other search
    running, on an in-process index with the embedder's own token vectors, runs all its stages in sequence on one
    thread kept for solo searches; requests that arrive meanwhile take the batched path
    (docs/results/interactive-cascade.md). ``parallel``: BM25 beside the query embedding (batched), or beside the
    dense search in a solo search over at least ``solo_beside_from`` chunks (docs/results/scale.md).

    ``phrases``: a query's ``"quoted phrases"`` move the candidates whose passage holds them verbatim ahead
    ("boost") or drop the others ("require"); "off" reads quotes as plain text (retrieval/search/stages/phrases.py)."""

    SECTION = "first_stage"
    candidates: int = bounded(100, 1, "max_candidates")
    max_k: int = 100
    max_candidates: int = 1000
    # an abuse bound, not a use bound: whole passages are normal queries (issue 23; docs/results/cascade-robustness.md)
    max_query_chars: int = 32_768
    parallel: bool = True
    workers: int = 4
    # BLAS threads for the pipeline's numpy work (MaxSim): its small products gain nothing from threads, whose
    # spinning takes the encoder's cores (docs/results/reranking.md)
    blas_threads: int = bounded(1, 0, note="0 leaves the process setting alone")
    solo_when_idle: bool = True
    # where BM25 beside the dense search starts to pay in a solo search: where HNSW-SQ8 takes over (docs/results/scale.md)
    solo_beside_from: int = bounded(250_000, 0)
    phrases: str = one_of("boost", ("off", "boost", "require"))


@dataclass(frozen=True)
class RerankConfig(Section):
    """The cascade after fusion: late interaction (MaxSim over stored token vectors) reorders the top
    ``li_top_k``, then the cross-encoder reorders the top ``ce_top_k``. ``max_top_k``: the largest K a request
    may ask for.

    Defaults chosen on the tuning splits (SciFact train, NFCorpus dev, and the doc-query sets built from them) by
    the worst case over them, not the mean (docs/results/cascade-robustness.md): late interaction blended half and
    half with the fused order (``li_weight``); queries over ``li_long_query_tokens`` query tokens or cut by the
    encoder take ``li_long_weight`` (0.5 since issue 53, chosen on the query-type suite's long type: it was 0, the
    stage skipped; 0 still skips and the response names it: :meth:`is_long`); the shipped cross-encoder is off.

    ``li_weight`` / ``ce_weight``: the stage's share in its head's new order; below 1 the stage's scores are
    blended with the order it received (:mod:`rerank.interpolation`; ``hybridrag train`` reports the best weight on
    dev). 1 = the stage alone.

    Deadlines: a stage is skipped (and the result marked degraded) when the time left before the request's
    deadline is below that stage's recent p95 latency (over the last ``latency_window`` runs); the cross-encoder
    goes first, then late interaction. ``budget_ms`` > 0 gives requests without a deadline one.

    The cross-encoder's fast form is its default, so that switching the stage on gives it
    (docs/results/cross-encoder-defaults.md): ``ce_window_tokens`` > 0 scores only each passage's best window of
    that many tokens, found by late interaction's token similarities (:mod:`rerank.windows`; needs token positions,
    else the whole passage is scored); ``ce_gate_gap`` > 0 skips the cross-encoder when the head's first two scores
    are at least that many standard deviations apart (:func:`rerank.cross_encoder.decisive_gap`; the response names
    the skip). 0 turns either off. ``ce_cache_pairs`` > 0 keeps that many pair scores
    (:class:`retrieval.search.model_calls.PairCache`).

    ``highlight_passages``: how many of a result's first passages a request with ``highlights`` gets its best
    sentences for (:mod:`retrieval.search.stages.highlights`). ``highlight_exact``: encode those passages again for
    every token's own similarities instead of the stored ones: better sentences at the encoder's price
    (docs/results/highlights.md).
    """

    SECTION = "rerank"
    late_interaction: bool = True
    li_top_k: int = bounded(20, 1, "max_top_k")
    li_weight: float = bounded(0.5, 0, 1, note="1 = the stage alone")
    li_long_query_tokens: int = bounded(128, 0, note="0 = one weight for every query")
    li_long_weight: float = bounded(0.5, 0, 1, note="0 = skip late interaction for long queries")
    cross_encoder: bool = False
    ce_top_k: int = bounded(5, 1, "max_top_k")
    ce_weight: float = bounded(1.0, 0, 1, note="1 = the stage alone")
    ce_window_tokens: int = bounded(48, 0, note="0 = whole passages")
    ce_gate_gap: float = bounded(0.5, 0, note="0 = never skip")
    ce_cache_pairs: int = bounded(0, 0, note="0 = off")
    max_top_k: int = 100
    budget_ms: float = bounded(0.0, 0, note="0 = no deadline of its own")
    latency_window: int = bounded(200, 1)
    highlight_passages: int = bounded(3, 0, "max_top_k")
    highlight_exact: bool = False
    # certain evidence (rerank/evidence.py, issue 53): BM25's best document, when it leads the next by at least this
    # share of its score (1 - s2/s1), stays within the first keep_bm25_rank of every reranked list
    # (docs/results/certain-evidence.md)
    keep_bm25_lead: float = bounded(0.2, 0, 1, note="0 = off")
    keep_bm25_rank: int = bounded(1, 1, "max_top_k")

    def is_long(self, query_tokens: int, truncated: bool = False) -> bool:
        """A query of ``query_tokens`` token vectors is long when it has more than ``li_long_query_tokens``, or
        when the encoder had to truncate it (a query longer than the encoder's window is a passage, whatever the
        window: with a 128-piece encoder no query would otherwise pass 128)."""
        return bool(self.li_long_query_tokens) and (query_tokens > self.li_long_query_tokens or truncated)

    def li_weight_for(self, query_tokens: int, truncated: bool = False) -> float:
        """The late-interaction weight for a query of ``query_tokens`` token vectors.

        >>> RerankConfig(li_weight=0.5, li_long_query_tokens=0).li_weight_for(300)
        0.5
        >>> RerankConfig(li_weight=0.5, li_long_query_tokens=64, li_long_weight=0.0).li_weight_for(300)
        0.0
        >>> RerankConfig(li_weight=0.5, li_long_query_tokens=128, li_long_weight=0.0).li_weight_for(126, True)
        0.0
        """
        return self.li_long_weight if self.is_long(query_tokens, truncated) else self.li_weight


class SearchSettings(Protocol):
    """The configuration sections the pipeline reads (``retrieval.config.AppConfig`` has them; so may any object
    with these attributes). The pipeline imports no application config: each component declares what it reads."""

    @property
    def first_stage(self) -> FirstStageConfig: ...

    @property
    def fusion(self) -> FusionConfig: ...

    @property
    def rerank(self) -> RerankConfig: ...

    @property
    def batching(self) -> BatchingConfig: ...

    @property
    def late_interaction(self) -> TokenEncoderConfig: ...
