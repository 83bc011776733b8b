"""The search room's settings: every configuration section of retrieval/search (first stage, fusion, dense search,
index loading, the cascade, cross-request batching, the result cache) and the protocol of what the pipeline reads
from an application configuration. A settings module: dataclasses and their checks only, so that loading a
configuration (retrieval/config.py) imports no model runtime, index library or server."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from index_builder.settings import TokenEncoderConfig
from rerank.late_interaction import SCORES as LI_SCORES


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
class DenseConfig:
    """``ef_search``: HNSW beam width at query time (raised to the number of chunks asked for);
    ``oversample``: chunks fetched per wanted document (documents have several chunks);
    ``exact_below``: allowed fraction of the corpus under which a filtered query searches exactly."""

    ef_search: int = 128
    oversample: float = 3.0
    exact_below: float = 0.05
    # The index a build makes (index_builder/snapshot/dense_index.py): "auto" (by corpus size), "hnsw" (float vectors in
    # the graph), "hnsw_sq8" (8-bit codes), "ivf_pq" (48-byte codes); the compressed kinds re-score candidates
    # from the float vectors (memory-mapped): IVF-PQ its best ``rescore`` x the chunks wanted, HNSW-SQ8 the chunks
    # wanted out of a beam ``rescore`` x as wide (8-bit codes rank as floats do); ``nprobe`` lists for IVF-PQ.
    index: str = "auto"
    rescore: float = 4.0
    nprobe: int = 32

    def __post_init__(self) -> None:
        if self.ef_search < 1 or self.oversample < 1 or not 0 <= self.exact_below <= 1:
            raise ValueError(f"dense needs ef_search >= 1, oversample >= 1, 0 <= exact_below <= 1; got {self}")
        if self.index not in ("auto", "hnsw", "hnsw_sq8", "ivf_pq"):
            raise ValueError(f"dense.index must be auto, hnsw, hnsw_sq8 or ivf_pq, got {self.index!r}")
        if self.rescore < 1 or self.nprobe < 1:
            raise ValueError(f"dense.rescore must be >= 1 and dense.nprobe >= 1, got {self.rescore}, {self.nprobe}")


@dataclass(frozen=True)
class IndexConfig:
    verify_checksums: bool = True  # sha256 every snapshot file at load (seconds for GBs of token vectors)


@dataclass(frozen=True)
class BatcherConfig:
    """Dynamic batching for one model role.

    ``max_batch_size``: most items per call of the batch function, [1, 1024].
    ``max_wait_ms``: longest a batch is held open for more items after its first item was submitted, [0, 1000]
    (0 = take whatever is already queued, never wait).
    ``enabled``: False calls the function once per item (the unbatched baseline).
    ``max_concurrent_batches``: batches running in the executor at once, [1, 64]; more than one lets the next batch
    be collected while the previous one computes.
    ``idle_dispatch``: dispatch at once when no batch is running (the window only holds items that queued behind a
    running batch); False = every batch waits out its window (the policy before issue 26).
    """

    max_batch_size: int = 32
    max_wait_ms: float = 2.0
    enabled: bool = True
    max_concurrent_batches: int = 2
    idle_dispatch: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.max_batch_size, bool) or not isinstance(self.max_batch_size, int) \
                or not 1 <= self.max_batch_size <= 1024:
            raise ValueError(f"max_batch_size must be an integer in [1, 1024], got {self.max_batch_size!r}")
        if isinstance(self.max_wait_ms, bool) or not isinstance(self.max_wait_ms, int | float) \
                or not 0 <= self.max_wait_ms <= 1000:
            raise ValueError(f"max_wait_ms must be a number in [0, 1000], got {self.max_wait_ms!r}")
        if isinstance(self.max_concurrent_batches, bool) or not isinstance(self.max_concurrent_batches, int) \
                or not 1 <= self.max_concurrent_batches <= 64:
            raise ValueError(f"max_concurrent_batches must be an integer in [1, 64], got {self.max_concurrent_batches!r}")


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
class SemanticCacheConfig:
    """``threshold``: the cosine at or above which a cached query may answer a new one; ``guard``: the candidate
    must also pass :func:`same_meaning_markers`. Defaults from the hand-written SciFact query log (bench/querylog,
    all-MiniLM-L6-v2; chosen on that log, so in-sample): at 0.91 with the guard, 30 of 30 repeats and 23 of 40
    paraphrases hit, and 1 of 150 requests got another question's answer (a near-miss that swaps the two sides of
    a comparison); without the guard 22 did. ``ttl_s``: an entry's lifetime; ``max_entries``: all scopes
    together, least recently used evicted first."""

    enabled: bool = True
    threshold: float = 0.91
    guard: bool = True  # also require the same numbers, negations and direction words (same_meaning_markers)
    ttl_s: float = 600.0
    max_entries: int = 10_000
    # All entries together, as the callers estimate them (result arrays, passages, the answer, the query and its
    # vector, the scope's filter): a bound in bytes, because entries differ a lot in size.
    max_bytes: int = 256 * 2**20
    # Shared across replicas (retrieval.search.shared_cache): a redis:// URL; "" = this process only.
    redis_url: str = ""
    redis_namespace: str = "hybridrag"
    redis_timeout_s: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0 or self.ttl_s <= 0 or self.max_entries < 1 or self.max_bytes < 1:
            raise ValueError("semantic cache needs 0 < threshold <= 1, ttl_s > 0, max_entries >= 1 and max_bytes >= 1")


@dataclass(frozen=True)
class FirstStageConfig:
    """``candidates``: top-N taken from each retriever before fusion; ``max_k``/``max_candidates``: request limits."""

    candidates: int = 100
    max_k: int = 100
    max_candidates: int = 1000
    # An abuse bound, not a use bound: whole passages are normal queries for "find the related passage /
    # counter-argument / similar case" workloads (issue #23; 2,048 refused a quarter of an argument-retrieval
    # set). The encoders truncate at their max_length; BM25 reads every term (analysis is linear: a 32 KiB query
    # costs about a millisecond); Generate cuts the question to generation.max_question_tokens.
    max_query_chars: int = 32_768
    parallel: bool = True  # BM25 beside the query embedding (batched) or the dense search (solo, solo_beside_from)
    workers: int = 4
    # BLAS threads for the pipeline's numpy work (MaxSim): its small matrix products gain nothing from threads,
    # and OpenBLAS's idle threads spin and steal the encoder's cores (pipeline p50 on SciFact: 48 ms with the
    # default threads, 24 ms with 1). 0 leaves the process setting alone.
    blas_threads: int = 1
    # true: a request that finds no other search running, on an in-process index with the embedder's own token
    # vectors, runs all its stages in sequence on one thread kept for solo searches (blocking callers: on their
    # own thread): no batcher, no pool round trips, one hand-off in and one back. Requests that arrive meanwhile
    # take the batched path. Always the same thread: handed to whichever model-pool worker was free, the stages'
    # own compute ran about 1.4 ms slower in the server (SciFact, one caller: p50 10.0 against 8.6 ms end to end).
    # Measured on SciFact (2 cores, one run): p50 at one caller 8.6-9.3 ms against 10.8 batched (1.13-1.18x
    # against 1.52x the compute floor), QPS at 16 callers equal, the same answers. See retrieval/search/runner.py
    # and docs/results/interactive-cascade.md.
    solo_when_idle: bool = True
    # chunks from which a solo search runs BM25 beside its dense search (with ``parallel``): served alternately, a
    # 1M index's search gained 0.4 ms p50 and a 10k one's lost 0.3 (the thread handoff, and three runnable threads
    # on two cores while the embedder's runtime still spun after its run; with ``spin_after_run = false``, 10k from
    # 0 chunks was within the noise: 5.9 against 6.4 ms); at 1M BM25 and HNSW-SQ8 are each 1-3 ms, at 10k 0.2 and
    # 0.7 (docs/results/scale.md)
    solo_beside_from: int = 250_000

    def __post_init__(self) -> None:
        if not 1 <= self.candidates <= self.max_candidates:
            raise ValueError(f"candidates must be in [1, {self.max_candidates}], got {self.candidates}")
        if self.solo_beside_from < 0:
            raise ValueError(f"first_stage.solo_beside_from must be >= 0, got {self.solo_beside_from}")


@dataclass(frozen=True)
class RerankConfig:
    """The cascade after fusion: late interaction (MaxSim over stored token vectors) reorders the top
    ``li_top_k``, then the cross-encoder reorders the top ``ce_top_k``. ``max_top_k``: the largest K a request
    may ask for.

    Defaults from the tuning splits (SciFact train, NFCorpus dev, and the doc-query sets built from those splits,
    ``bench/studies/ood.py``), chosen by the worst case over them, not the mean (``bench/studies/cascade_robustness.py``;
    docs/results/cascade-robustness.md). Late interaction with the embedder's own token vectors, blended half and
    half with the fused order (``li_weight = 0.5``), gains +0.010 to +0.013 on the short-query sets; alone
    (weight 1) it lost up to 0.019 on passage-sized queries. On queries over 128 query tokens no weight gains
    more than +0.0006 on any long-query tuning set, so it does not run for them (``li_long_weight = 0``; the
    response names the skip). The shipped cross-encoder lowered the late-interaction list on NFCorpus dev, so it
    is off.

    Deadlines: a stage is skipped (and the result marked degraded) when the time left before the request's
    deadline is below that stage's recent p95 latency (over the last ``latency_window`` runs); the cross-encoder
    goes first, then late interaction. ``budget_ms`` > 0 gives requests without a deadline one.

    Cross-encoder cost levers (docs/results/interactive-cascade.md), on by default since issue #43 so that
    switching the stage on gives its fast form (docs/results/cross-encoder-defaults.md): ``ce_window_tokens`` > 0
    scores only each passage's best window of that many tokens, found by late interaction's token similarities
    (:mod:`rerank.windows`; needs the index's token vectors stored by position, ``int8`` or ``float16``, and the
    embedder's own query token vectors, else the whole passage is scored: a pooled store such as the default
    ``pool3+bins`` cannot place one); 48 pieces cost 0.30-0.36x whole 128-piece pairs at -0.002/-0.003 nDCG@10 on
    the tuning splits. ``ce_gate_gap`` > 0 skips the cross-encoder when the head is already decisive (its first two
    scores at least that many standard deviations apart, :func:`rerank.cross_encoder.decisive_gap`; the response
    names the skip); 0.5 lies between the tuning sets' median gaps (0.71 SciFact train, 0.26 NFCorpus dev), and
    with the shared model a skipped head keeps the better list, so the gate raised nDCG@10 as it cut the cost.
    With the int8 model (``[cross_encoder] precision``) the gated windowed cascade measured 1.61x the default
    path's p50 at one caller in issue #26's final run, against 8.38x for whole fp32 pairs on every request.
    0 turns either lever off. ``ce_cache_pairs`` > 0 keeps that many pair scores
    (:class:`retrieval.search.model_calls.PairCache`).

    ``li_weight`` / ``ce_weight``: the stage's share in its head's new order; below 1 the stage's scores are blended
    with the order it received (:mod:`rerank.interpolation`; ``hybridrag train`` reports the best weight on dev).
    1 = the stage alone. ``li_long_query_tokens`` > 0: queries with more query tokens, or that the encoder had
    to cut, take ``li_long_weight`` instead (0: late interaction is skipped for them; :meth:`is_long`). ``li_score``: ``maxsim``
    or ``token_z`` (:func:`rerank.late_interaction.head_scores`; measured, not better: the default stays).

    ``highlight_passages``: how many of a result's first passages a request with ``highlights`` gets its best
    sentences for (:mod:`retrieval.search.stages.highlights`). ``highlight_exact``: encode those passages again for
    every token's own similarities instead of the stored ones (the default pooled store gives each token its pooled
    vector's: on the man-page questions the best sentence held the answer 0.528 of the time against 0.611 exact, at
    x1.4 the request's p50 against about x13 with the encoder pass: docs/results/highlights.md).
    """

    late_interaction: bool = True
    li_top_k: int = 20
    li_weight: float = 0.5
    li_score: str = "maxsim"
    li_long_query_tokens: int = 128
    li_long_weight: float = 0.0
    cross_encoder: bool = False
    ce_top_k: int = 5
    ce_weight: float = 1.0
    ce_window_tokens: int = 48
    ce_gate_gap: float = 0.5
    ce_cache_pairs: int = 0
    max_top_k: int = 100
    budget_ms: float = 0.0
    latency_window: int = 200
    highlight_passages: int = 3
    highlight_exact: bool = False

    def __post_init__(self) -> None:
        for name in ("li_top_k", "ce_top_k"):
            if not 1 <= getattr(self, name) <= self.max_top_k:
                raise ValueError(f"{name} must be in [1, {self.max_top_k}], got {getattr(self, name)}")
        if self.budget_ms < 0 or self.latency_window < 1:
            raise ValueError("budget_ms must be >= 0 and latency_window >= 1")
        for name in ("li_weight", "ce_weight", "li_long_weight"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1] (1 = the stage alone), got {getattr(self, name)}")
        if self.li_score not in LI_SCORES:
            raise ValueError(f"li_score must be one of {', '.join(LI_SCORES)}, got {self.li_score!r}")
        for name in ("ce_window_tokens", "ce_cache_pairs"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = off), got {getattr(self, name)}")
        if self.ce_gate_gap < 0:
            raise ValueError(f"ce_gate_gap must be >= 0 (0 = never skip), got {self.ce_gate_gap}")
        if not 0 <= self.highlight_passages <= self.max_top_k:
            raise ValueError(f"highlight_passages must be in [0, {self.max_top_k}], got {self.highlight_passages}")
        if self.li_long_query_tokens < 0:
            raise ValueError(f"li_long_query_tokens must be >= 0 (0 = one weight for every query), "
                             f"got {self.li_long_query_tokens}")

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
