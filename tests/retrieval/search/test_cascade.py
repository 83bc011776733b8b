"""The cascade under concurrency and deadlines, on the real bundled model and the sample index: concurrent
requests share batched model runs and get the same answers as unbatched ones; a tight deadline skips the
cross-encoder (flagged) instead of timing out; per-request options are validated."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from index_builder.models import CrossEncoder, CrossEncoderConfig
from retrieval.config import BatchingConfig
from retrieval.errors import DeadlineExceeded, InvalidRequest
from retrieval.search.batching import BatcherConfig
from retrieval.search.pipeline import Pipeline
from tests.helpers import CE_MODEL

STAGES = ("bm25", "dense", "late_interaction")


def _with_batching(config, enabled: bool, wait_ms: float = 20.0):
    b = BatcherConfig(max_batch_size=32, max_wait_ms=wait_ms, enabled=enabled)
    return dataclasses.replace(config, batching=BatchingConfig(embed=b, query_tokens=b, cross_encoder=b))


def test_concurrent_requests_share_batches_and_match_unbatched(sample_index, embedder, config, sample_queries):
    queries = list(sample_queries.values())[:16]
    unbatched = Pipeline(sample_index, embedder, _with_batching(config, enabled=False))
    batched = Pipeline(sample_index, embedder, _with_batching(config, enabled=True))
    try:
        expected = [unbatched.search(q, k=10, stages=STAGES) for q in queries]
        with ThreadPoolExecutor(len(queries)) as pool:
            got = list(pool.map(lambda q: batched.search(q, k=10, stages=STAGES), queries))
        for e, g in zip(expected, got, strict=True):
            assert g.hits.doc.tolist() == e.hits.doc.tolist()
            np.testing.assert_allclose(g.hits.scores, e.hits.scores, rtol=1e-4, atol=1e-5)
        stats = batched.batcher_stats()["embed"]
        assert stats["items"] == len(queries) and stats["batches"] < len(queries)  # shared ONNX runs
        assert unbatched.batcher_stats()["embed"]["mean_batch_size"] == 1.0
        assert "embed_queue" in got[0].timings_ms
    finally:
        unbatched.close()
        batched.close()


def test_request_options_are_validated(pipeline):
    with pytest.raises(InvalidRequest, match=r"li_top_k must be in \[1, 100\], got 0"):
        pipeline.search("bees", k=5, li_top_k=0)
    with pytest.raises(InvalidRequest, match=r"ce_top_k must be in \[1, 100\], got 500"):
        pipeline.search("bees", k=5, ce_top_k=500)
    with pytest.raises(DeadlineExceeded):
        pipeline.search("bees", k=5, deadline=time.monotonic() - 0.001)
    res = pipeline.search("which planet has the largest volcano", k=10, stages=STAGES, li_top_k=3)
    fused, li = res.stages["fused"], res.stages["late_interaction"]
    assert sorted(li.doc[:3].tolist()) == sorted(fused.doc[:3].tolist()) and li.doc[3:].tolist() == fused.doc[3:].tolist()


@pytest.mark.skipif(not CE_MODEL.is_dir(), reason="../shared/models/ce-minilm-l6-beir-train is absent")
def test_tight_deadline_skips_the_cross_encoder_and_answers_in_time(sample_index, embedder, config):
    ce = CrossEncoder(CrossEncoderConfig(model=str(CE_MODEL)))
    p = Pipeline(sample_index, embedder, config, cross_encoder=ce)
    full = ("bm25", "dense", "late_interaction", "cross_encoder")
    query = "How do honeybees tell the hive where the nectar is?"
    try:
        for _ in range(3):  # the stages' recent latencies, which the deadline decisions use
            res = p.search(query, k=10, stages=full, ce_top_k=10)
            assert "cross_encoder" in res.stages and not res.degraded
        ce_p95 = p.latency.p95("cross_encoder")
        li_p95 = p.latency.p95("late_interaction")
        first_stage = res.timings_ms["total"] - res.timings_ms["cross_encoder"] - res.timings_ms["late_interaction"]
        # Enough for the first stage and late interaction, far too little for the cross-encoder.
        budget_ms = first_stage * 3 + li_p95 * 3 + 50
        assert budget_ms < ce_p95, "the sample cross-encoder run is expected to be the slowest stage"
        start = time.monotonic()
        deadline = start + budget_ms / 1000.0
        res = p.search(query, k=10, stages=full, ce_top_k=10, deadline=deadline)
        assert "cross_encoder" not in res.stages and res.degraded
        assert res.skipped["cross_encoder"].startswith("deadline:")
        assert len(res.hits) == 10
        # Arrived before the deadline, and so well before a cross-encoder run would have ended.
        assert time.monotonic() < start + ce_p95 / 1000.0
        # No deadline: the whole cascade runs again.
        assert "cross_encoder" in p.search(query, k=10, stages=full, ce_top_k=10).stages
    finally:
        p.close()
