"""Each stage run alone, outside the pipeline, on the sample index and the real model: the first stage, late
interaction and the cross-encoder each take a query and hits and return hits, and give what the pipeline's own run
gives for the same request; on both runners (a solo thread, the pool and batchers on an event loop)."""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from index_builder.models.encoders import CrossEncoder
from index_builder.settings import CrossEncoderConfig
from index_builder.types import Hits
from retrieval.search.pipeline import Pipeline
from retrieval.search.request import SearchRequest
from retrieval.search.runner import Later, PoolRunner, ThreadRunner
from retrieval.search.settings import RerankConfig
from retrieval.search.stages.cross_encoder import CrossEncoderStage
from retrieval.search.stages.first_stage import FirstStage
from retrieval.search.stages.late_interaction import LateInteractionStage
from retrieval.search.stages.query import Query
from tests.helpers import CE_MODEL

QUERY = "How do honeybees tell the hive where the nectar is?"
FULL = ("bm25", "dense", "late_interaction", "cross_encoder")


@pytest.fixture(scope="module")
def served(sample_index, embedder, config):
    """A pipeline, for its models and its own answers (the reference each stage alone must equal)."""
    # the gate off (its default is 0.5): the cross-encoder runs on every request, for the stage's own tests
    # and whole passages (windows, placed from late interaction's token similarities, are tested in test_cascade.py)
    cfg = dataclasses.replace(config, rerank=dataclasses.replace(config.rerank, cross_encoder=True, ce_gate_gap=0.0,
                                                                 ce_window_tokens=0))
    ce = CrossEncoder(CrossEncoderConfig(model=str(CE_MODEL))) if CE_MODEL.is_dir() else None
    p = Pipeline(sample_index, embedder, cfg, cross_encoder=ce)
    yield p
    p.close()


def _query(p: Pipeline, runner, query: str = QUERY, **options) -> Query:
    request = p.resolve(SearchRequest.of(query, 10, stages=options.pop("stages", FULL), **options))
    return Query(request, p.index, runner)


def _solo(coro):
    return ThreadRunner.run(coro)


def _batched(p: Pipeline, make):
    """Run ``make(runner)``'s coroutine with the pool runner on the pipeline's own loop (where its batchers live)."""
    return asyncio.run_coroutine_threadsafe(make(PoolRunner(p.executor, p.models)), p._ensure_loop()).result(60)


def test_the_first_stage_alone_gives_the_pipelines_fused_list(served):
    reference = served.search(QUERY, 10, stages=("bm25", "dense"), use_cache=False)
    stage = FirstStage(served.config.first_stage, served.config.fusion)
    started = []
    beside = ThreadPoolExecutor(1)
    for run in ("solo", "solo beside", "batched"):
        async def first(runner):
            q = _query(served, runner, stages=("bm25", "dense"))
            stage.start(q)
            started.append(q.pending.get("bm25"))
            return q, await stage.run(q)
        if run == "batched":
            q, hits = _batched(served, first)
        else:
            q, hits = _solo(first(ThreadRunner(served.models, beside if run == "solo beside" else None)))
            # BM25 began beside the dense search on the other thread, or ran inline when awaited
            assert isinstance(started[-1], Later) and (started[-1].future is not None) == (run == "solo beside")
        assert hits.top(10).doc.tolist() == reference.hits.doc.tolist(), run
        assert set(q.result.stages) == {"bm25", "dense", "fused"} and q.query_vec is not None
        assert q.result.stages["bm25"].doc.tolist() == reference.stages["bm25"].doc.tolist()
        assert not q.pending and not q.result.skipped
    beside.shutdown()


def test_the_first_stage_serves_bm25_alone_when_dense_is_unavailable(served, sample_index):
    class NoDense:  # the same generation without its HNSW file
        def __init__(self, base):
            self.base = base
            self.dense, self.dense_error = None, "hnsw.faiss is missing"

        def __getattr__(self, name):
            return getattr(self.base, name)

    stage = FirstStage(served.config.first_stage, served.config.fusion)
    request = served.resolve(SearchRequest.of(QUERY, 10, stages=("bm25", "dense")))
    q = Query(request, NoDense(sample_index), ThreadRunner(served.models))
    hits = _solo(stage.run(q))
    assert hits.doc.tolist() == q.result.stages["bm25"].doc.tolist()
    assert q.result.degraded and q.result.skipped == {"dense": "dense index unavailable: hnsw.faiss is missing"}


def test_late_interaction_alone_reorders_the_head_as_the_pipeline_does(served):
    reference = served.search(QUERY, 10, stages=("bm25", "dense", "late_interaction"), use_cache=False)
    stage = LateInteractionStage(served.config.rerank, served.token_encoder, embedder_tokens=True,
                                 max_length=served.embedder.config.max_length)
    fused = reference.stages["fused"]
    q = _query(served, ThreadRunner(served.models), stages=("bm25", "dense", "late_interaction"))
    hits = _solo(stage.run(q, fused))
    assert hits.top(10).doc.tolist() == reference.hits.doc.tolist()
    np.testing.assert_allclose(hits.top(10).scores, reference.hits.scores, rtol=1e-5, atol=1e-6)
    assert hits.doc[20:].tolist() == fused.doc[20:].tolist()  # below li_top_k the fused order is kept
    # a long query is blended at li_long_weight (0.5 by default); at 0 it keeps the fused order, and says why
    long_query = " ".join(["honeybees dance to tell the hive where nectar is"] * 30)
    q = _query(served, ThreadRunner(served.models), long_query, stages=("bm25", "dense", "late_interaction"))
    _solo(stage.run(q, fused))
    assert "late_interaction" in q.result.stages and "late_interaction" not in q.result.skipped
    skipping = LateInteractionStage(dataclasses.replace(served.config.rerank, li_long_weight=0.0), served.token_encoder,
                                    embedder_tokens=True, max_length=served.embedder.config.max_length)
    q = _query(served, ThreadRunner(served.models), long_query, stages=("bm25", "dense", "late_interaction"))
    kept = _solo(skipping.run(q, fused))
    assert kept.doc.tolist() == fused.doc.tolist() and "late_interaction" not in q.result.stages
    assert q.result.skipped["late_interaction"].startswith("long query:") and not q.result.degraded


def test_late_interaction_says_why_it_cannot_run(served, sample_index):
    stage = LateInteractionStage(served.config.rerank, served.token_encoder, embedder_tokens=True, max_length=256)
    assert stage.unavailable(sample_index) is None

    class Other:
        late = sample_index.late
        token_encoder = {"name": "colbert-something", "dim": 128}

    assert "run 'hybridrag index tokens'" in stage.unavailable(Other())
    Other.late = None
    assert stage.unavailable(Other()) == "the snapshot has no token vectors"


def test_late_interaction_scores_texts_outside_the_index(served):
    stage = served.li_stage
    texts = ["Honeybees perform a waggle dance to share the direction of flowers.", "Volcanoes erupt basalt."]
    scores = _solo(stage.score_texts(ThreadRunner(served.models), QUERY, texts))
    assert scores.dtype == np.float32 and scores.shape == (2,) and scores[0] > scores[1]


@pytest.mark.skipif(not CE_MODEL.is_dir(), reason="../shared/models/ce-minilm-l6-beir-train is absent")
def test_the_cross_encoder_alone_scores_the_head_as_the_pipeline_does(served):
    reference = served.search(QUERY, 10, stages=FULL, use_cache=False)
    stage = CrossEncoderStage(served.config.rerank, served.embedder, embedder_tokens=True)
    incoming = reference.stages["late_interaction"]
    q = _query(served, ThreadRunner(served.models))
    hits = _solo(stage.run(q, incoming))
    assert hits.top(10).doc.tolist() == reference.hits.doc.tolist()
    assert hits.doc[5:].tolist() == incoming.doc[5:].tolist()  # below ce_top_k the order received is kept
    on_pool = _batched(served, lambda runner: stage.run(_query(served, runner), incoming))
    np.testing.assert_allclose(on_pool.scores[:5], hits.scores[:5], rtol=1e-4, atol=1e-4)


def test_the_cross_encoder_gate_skips_a_decisive_head(served):
    gated = CrossEncoderStage(dataclasses.replace(served.config.rerank, ce_gate_gap=0.5), served.embedder,
                              embedder_tokens=True)
    decisive = Hits(np.arange(20), np.array([10.0] + [0.0] * 19, dtype=np.float32), np.arange(20))
    close = Hits(np.arange(20), np.linspace(1.0, 0.9, 20).astype(np.float32), np.arange(20))
    assert gated.gated(decisive, 20).startswith("gated: the head is already decisive")
    assert gated.gated(close, 20) is None
    assert served.ce_stage.gated(decisive, 20) is None  # ce_gate_gap 0: never
    assert dataclasses.replace(served.config.rerank, ce_gate_gap=RerankConfig().ce_gate_gap) == gated.config  # 0.5: the default


def test_a_thread_runner_refuses_a_step_that_waits_on_a_loop():
    async def waits():
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="not solo-safe"):
        ThreadRunner.run(waits())
