"""Benchmarks and tuning studies (bench/README.md has a row for each). ``SCRIPTS``: every runnable one, by the name
``hybridrag bench NAME`` takes, with its module (``python -m MODULE`` runs the same) and one line on what it does."""

SCRIPTS: dict[str, tuple[str, str]] = {
    # benchmarks: what the served defaults cost, against a baseline in the same run
    "load": ("bench.load", "the gRPC (and HTTP) service under closed and open loop load, against the compute floor "
                           "and the naive baseline"),
    "cascade_load": ("bench.cascade_load", "server configurations side by side under load, ratios to the first"),
    "backends": ("bench.backends", "the first-stage backends (local, Qdrant in process, Qdrant over REST) side by "
                                   "side, and the shared cache's lookups"),
    "floor": ("bench.floor", "the compute floor: each stage's own compute alone"),
    "burst": ("bench.burst", "refusals past saturation: a burst's excess, direct or through the front"),
    "batching": ("bench.batching", "cross-request batching on against off and the old window policy, in process"),
    "observability": ("bench.observability", "what tracing and metrics cost per request"),
    "generate": ("bench.generate", "Generate with the embedded llama.cpp server, the semantic cache on a query log, "
                                   "Retrieve under Generate load"),
    "live": ("bench.live", "the live index: queries during a rebuild, write throughput and visibility, upserts as "
                           "the buffer grows, memory under a write stream"),
    "build": ("bench.build", "the build against the encoder alone on the same passages; a rebuild after edits"),
    "folder": ("bench.folder", "a folder of real documentation files: read, built, re-run unchanged and after edits, "
                               "kept in step by sync against a running server; the right file for each question"),
    "ray_build": ("bench.ray_build", "the build on a local Ray cluster against the number of encoder actors, beside "
                                     "the single-process build and the encoder alone"),
    "scale": ("bench.scale", "what the build and the service cost from thousands to a million passages: build time, "
                             "peak RSS, disk and serving RSS per passage, latency per stage, dense recall; quality "
                             "with distractors"),
    "scale_corpus": ("bench.scale_corpus", "the scale bench's corpora: Debian's documentation cut into passages, "
                                           "recombined sentences past its size"),
    "bm25_speed": ("bench.bm25_speed", "bm25s against rank-bm25 over the same chunks"),
    "gpu_check": ("bench.gpu_check", "model roles per execution provider and batch size; the GPU fallback"),
    "naive_baseline": ("bench.naive_baseline", "the tutorial pipeline the load bench compares against"),
    "highlights": ("bench.highlights", "how often the highlighted sentence holds the answer (hand-written questions "
                                       "over this machine's man pages) and what highlights cost per request"),
    # tuning studies: choose a default on tuning splits, report test beside it
    "tune_fusion": ("bench.studies.tune_fusion", "RRF k and weights chosen on tuning splits"),
    "cascade_robustness": ("bench.studies.cascade_robustness", "late-interaction policies (and the cross-encoder's "
                                                               "weight, BM25 k1/b) chosen by the worst case"),
    "ce_levers": ("bench.studies.ce_levers", "the cross-encoder's levers: quality and cost of each, in one run"),
    "bm25_build_memory": ("bench.studies.bm25_build_memory", "the build's BM25 in memory: the postings held and the "
                                                             "peak while scoring them, per posting and passage"),
    "bm25_units": ("bench.studies.bm25_units", "BM25 over documents against chunks, Porter against Snowball"),
    "token_codes": ("bench.studies.token_codes", "compact token stores (int4, 1-bit, residual codes, PCA, pooling, "
                                                 "stacked): bytes, nDCG of the served cascade, MaxSim time; the "
                                                 "default by the worst case"),
    "qdrant_tokens": ("bench.studies.qdrant_tokens", "the compact store's multivectors in Qdrant's own engine (Edge): "
                                                     "float16 on disk, binary / int8 quantization; bytes, scores"),
    "ood": ("bench.studies.ood", "an out-of-domain doc-query set from a dataset's own judgments (a data tool)"),
    "reference_stack": ("bench.reference_stack", "the tutorial stack (bm25s + faiss HNSW over one vector per "
                                                 "document + RRF 60) per query type, beside eval --by-type"),
}
