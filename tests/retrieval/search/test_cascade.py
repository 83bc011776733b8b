"""The cascade under concurrency and deadlines, on the real bundled model and the sample index: concurrent
requests share batched model runs and get the same answers as unbatched ones; a tight deadline skips the
cross-encoder (flagged) instead of timing out; per-request options are validated."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from index_builder.models.encoders import CrossEncoder
from index_builder.settings import CrossEncoderConfig
from retrieval.config import BatchingConfig
from retrieval.errors import DeadlineExceeded, InvalidRequest
from retrieval.search.batching import BatcherConfig
from retrieval.search.pipeline import Pipeline
from tests.helpers import CE_MODEL

STAGES = ("bm25", "dense", "late_interaction")


def _with_batching(config, enabled: bool, wait_ms: float = 20.0):
    b = BatcherConfig(max_batch_size=32, max_wait_ms=wait_ms, enabled=enabled)
    return dataclasses.replace(config, batching=BatchingConfig(embed=b, query_tokens=b, cross_encoder=b),
                               first_stage=dataclasses.replace(config.first_stage, solo_when_idle=False))


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
    head, order = fused.doc[:3].tolist(), li.doc.tolist()
    bm25_first = int(res.stages["bm25"].doc[0])
    if bm25_first not in head and order[0] == bm25_first:  # the certain-evidence rule ([rerank] keep_bm25_lead)
        order = order[1:]  # brought BM25's unique first hit up from below the head: the rest is as without it
        tail = [d for d in fused.doc[3:].tolist() if d != bm25_first]
    else:
        tail = fused.doc[3:].tolist()
    assert sorted(order[:3]) == sorted(head) and order[3:] == tail  # only the head of 3 was reordered


@pytest.mark.skipif(not CE_MODEL.is_dir(), reason="../shared/models/ce-minilm-l6-beir-train is absent")
def test_tight_deadline_skips_the_cross_encoder_and_answers_in_time(sample_index, embedder, config):
    # the stage's old form (fp32, whole passages, never gated): it must run every time and be the slowest stage
    ce = CrossEncoder(CrossEncoderConfig(model=str(CE_MODEL), precision="fp32"))
    config = dataclasses.replace(config, rerank=dataclasses.replace(config.rerank, ce_window_tokens=0, ce_gate_gap=0.0))
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


def _cascade(sample_index, embedder, config, **rerank):
    """A pipeline with the cross-encoder on; it runs on every request (no gate) unless ``ce_gate_gap`` is given."""
    ce = CrossEncoder(CrossEncoderConfig(model=str(CE_MODEL)))
    rerank.setdefault("ce_gate_gap", 0.0)
    cfg = dataclasses.replace(config, rerank=dataclasses.replace(config.rerank, cross_encoder=True, **rerank))
    return Pipeline(sample_index, embedder, cfg, cross_encoder=ce)


FULL = ("bm25", "dense", "late_interaction", "cross_encoder")
QUERY = "How do honeybees tell the hive where the nectar is?"


@pytest.mark.skipif(not CE_MODEL.is_dir(), reason="../shared/models/ce-minilm-l6-beir-train is absent")
def test_cross_encoder_windows_are_the_best_maxsim_span_of_each_passage(int8_index, sample_index, embedder, config):
    """Windows need token positions: an index storing every token (int8) places them, and so does the default
    pooled store through the groups it keeps (each token's pooled row); a store without positions scores the
    whole passages."""
    from rerank.windows import best_window

    tokens = embedder.encode([QUERY], with_tokens=True).token_vectors[0].astype(np.float32)
    for index in (sample_index, int8_index):
        check_windows(_cascade(index, embedder, config, ce_window_tokens=12), tokens, embedder, best_window)


def check_windows(p, tokens, embedder, best_window):
    try:
        res = p.search(QUERY, k=10, stages=FULL, ce_top_k=3)
        chunks = res.stages["late_interaction"].chunk[:3]
        windows = p.ce_stage.passages(p.index, chunks, tokens, 12)
        for c, w in zip(chunks.tolist(), windows, strict=True):
            whole = p.index.passage_with_title(c)
            assert w and w in whole and len(w) < len(whole)
            # the window re-tokenises to the 12 pieces the late-interaction similarities chose
            pieces = embedder.model.tokenize([w])[0]
            assert sum(1 for s in pieces.special_tokens_mask if not s) == 12
            start, end = best_window(p.index.late.token_sims(tokens, c), 12)
            enc = embedder.model.tokenize([whole])[0]
            content = [i for i, s in enumerate(enc.special_tokens_mask) if not s]
            assert enc.tokens[content[start]] == pieces.tokens[1] and enc.tokens[content[end - 1]] == pieces.tokens[-2]
        # the served stage scores exactly those windows
        scores = np.asarray(p.cross_encoder.score([(QUERY, w) for w in windows]), dtype=np.float32)
        assert sorted(res.stages["cross_encoder"].scores[:3].tolist(), reverse=True) == pytest.approx(
            sorted(scores.tolist(), reverse=True), rel=1e-4, abs=1e-4)
        # a width as long as the passages gives the whole passages back
        assert p.ce_stage.passages(p.index, chunks, tokens, 4096) == [p.index.passage_with_title(int(c)) for c in chunks]
        assert p.ce_stage.passages(p.index, chunks, None, 12) == [p.index.passage_with_title(int(c)) for c in chunks]
    finally:
        p.close()


@pytest.mark.skipif(not CE_MODEL.is_dir(), reason="../shared/models/ce-minilm-l6-beir-train is absent")
def test_cross_encoder_gate_skips_decisive_heads_and_says_so(sample_index, embedder, config):
    from rerank.cross_encoder import decisive_gap

    open_gate = _cascade(sample_index, embedder, config)
    try:
        base = open_gate.search(QUERY, k=10, stages=FULL)
        gap = decisive_gap(base.stages["late_interaction"].scores[:config.rerank.li_top_k])
    finally:
        open_gate.close()
    shut = _cascade(sample_index, embedder, config, ce_gate_gap=gap * 0.99)
    try:
        res = shut.search(QUERY, k=10, stages=FULL)
        assert "cross_encoder" not in res.stages and not res.degraded
        assert res.skipped["cross_encoder"].startswith("gated: the head is already decisive")
        assert res.hits.doc.tolist() == base.stages["late_interaction"].doc[:10].tolist()
    finally:
        shut.close()
    above = _cascade(sample_index, embedder, config, ce_gate_gap=gap * 1.01)
    try:
        res = above.search(QUERY, k=10, stages=FULL)
        assert "cross_encoder" in res.stages and res.hits.doc.tolist() == base.hits.doc.tolist()
    finally:
        above.close()
    with pytest.raises(ValueError, match="ce_gate_gap must be >= 0"):
        dataclasses.replace(config.rerank, ce_gate_gap=-1.0)


@pytest.mark.skipif(not CE_MODEL.is_dir(), reason="../shared/models/ce-minilm-l6-beir-train is absent")
def test_pair_cache_scores_only_unseen_pairs_and_answers_the_same(sample_index, embedder, config):
    p = _cascade(sample_index, embedder, config, ce_cache_pairs=8)
    try:
        first = p.search(QUERY, k=10, stages=FULL, use_cache=False, ce_top_k=5)
        items = p.batcher_stats()["cross_encoder"]["items"]
        again = p.search(QUERY, k=10, stages=FULL, use_cache=False, ce_top_k=5)
        stats = p.batcher_stats()
        assert stats["cross_encoder"]["items"] == items  # every pair came from the cache
        assert again.hits.doc.tolist() == first.hits.doc.tolist()
        np.testing.assert_allclose(again.hits.scores, first.hits.scores, rtol=1e-6)
        deeper = p.search(QUERY, k=10, stages=FULL, use_cache=False, ce_top_k=7)
        assert p.batcher_stats()["cross_encoder"]["items"] == items + 2  # only the two new pairs were scored
        pairs = p.batcher_stats()["cross_encoder_pairs"]
        assert pairs["hits"] == 10 and pairs["misses"] == 7 and pairs["entries"] == 7
        assert "cross_encoder" in deeper.stages
        p.search("a different question about volcanoes", k=10, stages=FULL, use_cache=False, ce_top_k=5)
        assert p.batcher_stats()["cross_encoder_pairs"]["entries"] == 8  # bounded: the oldest were evicted
    finally:
        p.close()


def test_a_lone_request_runs_solo_and_answers_as_the_batched_path(sample_index, embedder, config, sample_queries):
    """``first_stage.solo_when_idle``: a request that finds no other search running runs its stages in sequence
    on one thread, with the models called directly; requests arriving meanwhile take the batched path. Both give
    the same answers, blocking and async, and the cross-encoder (with its pair cache) too."""
    import asyncio

    queries = list(sample_queries.values())[:12]
    ce_cfg = dataclasses.replace(config.rerank, cross_encoder=True, ce_cache_pairs=64, ce_gate_gap=0.0)
    base = dataclasses.replace(config, rerank=ce_cfg)
    stages = (*STAGES, "cross_encoder")
    cross_encoder = CrossEncoder(CrossEncoderConfig(model=str(CE_MODEL))) if (CE_MODEL / "model.onnx").is_file() \
        else None
    if cross_encoder is None:
        stages, base = STAGES, config
    solo_cfg = dataclasses.replace(base, first_stage=dataclasses.replace(base.first_stage, solo_when_idle=True,
                                                                        solo_beside_from=0))  # beside at any size
    base = dataclasses.replace(base, first_stage=dataclasses.replace(base.first_stage, solo_when_idle=False))
    batched = Pipeline(sample_index, embedder, base, cross_encoder=cross_encoder)
    solo = Pipeline(sample_index, embedder, solo_cfg, cross_encoder=cross_encoder)
    try:
        expected = [batched.search(q, k=10, stages=stages) for q in queries]
        assert batched.solo_runs == 0
        alone = [solo.search(q, k=10, stages=stages) for q in queries]
        assert solo.solo_runs == len(queries)
        assert all(r.timings_ms["embed_queue"] == 0.0 for r in alone)
        embed = solo.models.embed.snapshot()
        assert embed["batches"] == embed["direct"] == embed["items"] == len(queries)  # no call through the queue

        async def run_async() -> list:
            return [await solo.search_async(q, k=10, stages=stages) for q in queries]

        alone_async = asyncio.run(run_async())
        assert solo.solo_runs == 2 * len(queries)
        # every async solo search ran on the one thread kept for them (its core's caches warm), none on the model
        # pool, whose workers a lone request used to take in turn
        assert len(solo._solo_executor._threads) == 1 and not solo.models.executor._threads
        assert len(solo._solo_beside._threads) == 1  # BM25 ran beside the dense search
        with ThreadPoolExecutor(len(queries)) as pool:
            together = list(pool.map(lambda q: solo.search(q, k=10, stages=stages), queries))
        assert solo.solo_runs < 3 * len(queries)  # concurrent requests went through the batchers
        embed = solo.models.embed.snapshot()
        assert embed["batches"] > embed["direct"]  # some calls went through the queue
        assert embed["items"] == 3 * len(queries)  # every query embedded once, whichever way
        for e, a, b, t in zip(expected, alone, alone_async, together, strict=True):
            assert a.hits.doc.tolist() == e.hits.doc.tolist() == b.hits.doc.tolist() == t.hits.doc.tolist()
            assert set(a.stages) == set(e.stages) and a.skipped == e.skipped
            np.testing.assert_allclose(a.hits.scores, e.hits.scores, rtol=1e-4, atol=1e-5)
    finally:
        batched.close()
        solo.close()


def test_a_small_index_runs_bm25_in_sequence_when_solo(sample_index, embedder, config):
    """Below ``first_stage.solo_beside_from`` chunks a solo search does not hand BM25 to the second thread (served,
    that cost 0.3 ms at 10k); the answer is the same either way."""
    cfg = dataclasses.replace(config, first_stage=dataclasses.replace(config.first_stage, solo_when_idle=True))
    assert len(sample_index.chunk_doc) < cfg.first_stage.solo_beside_from
    p = Pipeline(sample_index, embedder, cfg)
    beside = Pipeline(sample_index, embedder, dataclasses.replace(
        cfg, first_stage=dataclasses.replace(cfg.first_stage, solo_beside_from=0)))
    try:
        a, b = p.search("volcano on mars", k=10), beside.search("volcano on mars", k=10)
        assert p.solo_runs == beside.solo_runs == 1 and a.doc_ids() == b.doc_ids()
        assert not p._solo_beside._threads and len(beside._solo_beside._threads) == 1
    finally:
        p.close()
        beside.close()
