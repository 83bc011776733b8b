"""Rerank stages on real data: MaxSim maths, the late-interaction stage over stored token vectors, the
cross-encoder with the trained model from ../shared/models (skipped where that folder is absent)."""


import dataclasses

import numpy as np
import pytest

from index_builder.models.encoders import CrossEncoder
from index_builder.settings import CrossEncoderConfig
from rerank.maxsim import maxsim, maxsim_batch
from retrieval.search.pipeline import Pipeline
from tests.helpers import CE_MODEL


def test_maxsim_batch_matches_a_brute_force_loop():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(7, 16)).astype(np.float32)
    lengths = [3, 0, 5, 1, 9]
    vectors = rng.normal(size=(sum(lengths), 16)).astype(np.float16)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    rows = np.array([4, 0, 1, 2, 3])
    expected = []
    for r in rows:
        doc = vectors[offsets[r]:offsets[r + 1]].astype(np.float32)
        best = [max((float(qi @ dj) for dj in doc), default=None) for qi in q]
        expected.append(0.0 if not len(doc) else sum(best))
    np.testing.assert_allclose(maxsim_batch(q, vectors, offsets, rows), expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(maxsim(q, vectors[:3]), expected[1], rtol=1e-5)


def test_late_interaction_reorders_only_the_head(pipeline):
    res = pipeline.search("which planet has the largest volcano", k=30,
                          stages=("bm25", "dense", "late_interaction"))
    fused, li = res.stages["fused"], res.stages["late_interaction"]
    top = pipeline.config.rerank.li_top_k
    assert sorted(li.doc[:top].tolist()) == sorted(fused.doc[:top].tolist())  # same head, new order
    assert li.doc[top:].tolist() == fused.doc[top:].tolist()  # the tail keeps its order
    assert (np.diff(li.scores[:top]) <= 1e-6).all() and "late_interaction" in res.timings_ms


def test_li_weight_blends_maxsim_with_the_fused_order(sample_index, embedder, config):
    """``[rerank] li_weight``: 0 keeps the fused head, 1 is MaxSim alone, in between the served order is exactly
    the blend of MaxSim with the fused positions (the function the trainers select the weight with)."""
    import dataclasses

    from index_builder.models.token_encoders import EmbedderTokens
    from rerank.interpolation import blend_with_prior

    query = "which planet has the largest volcano"
    orders = {}
    for w in (0.0, 0.5, 1.0):
        # the blend alone: the certain-evidence rule (keep_bm25_lead, tested in test_certain_evidence.py) off
        cfg = dataclasses.replace(config, rerank=dataclasses.replace(config.rerank, li_weight=w, keep_bm25_lead=0.0))
        p = Pipeline(sample_index, embedder, cfg)
        try:
            res = p.search(query, k=30, stages=("bm25", "dense", "late_interaction"), use_cache=False)
        finally:
            p.close()
        fused = res.stages["fused"]
        if w == 0.0:  # weight 0: the stage does not run, and says so
            assert "late_interaction" not in res.stages and "li_weight = 0" in res.skipped["late_interaction"]
            orders[w] = res.hits.doc.tolist()
        else:
            orders[w] = res.stages["late_interaction"].doc.tolist()
    top = config.rerank.li_top_k
    assert orders[0.0] == fused.doc[:30].tolist()
    assert orders[1.0][:30] != orders[0.0] and orders[0.5][:30] not in (orders[0.0], orders[1.0][:30])
    late = sample_index.late
    tokens = EmbedderTokens(embedder).encode_queries([query])[0]  # the default token encoder
    pure = late.scores(tokens, fused.chunk[:top])  # MaxSim on the index's own store (compact by default)
    for w in (0.5, 1.0):
        expected = fused.doc[:top][np.argsort(-blend_with_prior(pure, w), kind="stable")].tolist()
        assert orders[w][:top] == expected and orders[w][top:] == fused.doc[top:].tolist()


def test_weights_outside_0_1_are_refused():
    from retrieval.config import RerankConfig

    with pytest.raises(ValueError, match="ce_weight must be in \\[0, 1\\]"):
        RerankConfig(ce_weight=1.5)


def test_cross_encoder_stage_skipped_without_a_model_and_scores_with_one(sample_index, embedder, config):
    p = Pipeline(sample_index, embedder, config)
    res = p.search("how do bees find flowers", k=5, stages=("bm25", "dense", "cross_encoder"))
    assert res.skipped["cross_encoder"] == "no cross-encoder model configured"
    p.close()
    if not CE_MODEL.is_dir():
        pytest.skip("../shared/models/ce-minilm-l6-beir-train is absent")
    # fp32: padding must not change a pair's score, which holds exactly only there (the int8 copy quantises each
    # batch's activations on one scale: a pair's logit moved by up to 0.7 with its batch-mates on SciFact pairs: test_int8.py)
    ce = CrossEncoder(CrossEncoderConfig(model=str(CE_MODEL), precision="fp32"))
    config = dataclasses.replace(config, rerank=dataclasses.replace(config.rerank, ce_gate_gap=0.0))  # runs every time
    p = Pipeline(sample_index, embedder, config, cross_encoder=ce)
    res = p.search("How do honeybees tell the hive where the nectar is?", k=10,
                   stages=("bm25", "dense", "cross_encoder"))
    p.close()
    top = config.rerank.ce_top_k
    fused, ce_hits = res.stages["fused"], res.stages["cross_encoder"]
    assert sorted(ce_hits.doc[:top].tolist()) == sorted(fused.doc[:top].tolist())
    passages = [sample_index.passage_with_title(int(c)) for c in fused.chunk[:top]]
    query = "How do honeybees tell the hive where the nectar is?"
    one_by_one = np.array([ce.score_pairs(query, [psg])[0] for psg in passages])
    batched = ce.score_pairs(query, passages)
    np.testing.assert_allclose(batched, one_by_one, atol=1e-4)  # batched (padded) equals one by one
    assert sample_index.documents[ce_hits.doc[0]].id == "bio-012"


def test_long_queries_take_their_own_weight_and_say_so(sample_index, embedder, config):
    """``li_long_query_tokens`` / ``li_long_weight`` (issue #23): a query over the length bound is blended at its own
    weight; at 0 the stage is not run, the response says why, and the result is not marked degraded."""
    import dataclasses

    from index_builder.models.token_encoders import EmbedderTokens

    short, long = "which planet has the largest volcano", ("the largest volcano on any planet in the solar system "
                                                          "rises far above the surrounding plains of Mars") * 3
    n_short, n_long = (len(EmbedderTokens(embedder).encode_queries([q])[0]) for q in (short, long))
    bound = (n_short + n_long) // 2
    assert n_short <= bound < n_long
    cfg = dataclasses.replace(config, rerank=dataclasses.replace(config.rerank, li_weight=1.0,
                                                                 li_long_query_tokens=bound, li_long_weight=0.0))
    p = Pipeline(sample_index, embedder, cfg)
    plain = Pipeline(sample_index, embedder, dataclasses.replace(config, rerank=dataclasses.replace(
        config.rerank, li_weight=1.0, li_long_query_tokens=0)))
    try:
        s = p.search(short, 30, use_cache=False)
        assert "late_interaction" in s.stages and "late_interaction" not in s.skipped
        assert s.hits.doc.tolist() == plain.search(short, 30, use_cache=False).hits.doc.tolist()
        r = p.search(long, 30, use_cache=False)
        assert "late_interaction" not in r.stages and not r.degraded
        assert f"{n_long} query tokens (rerank.li_long_query_tokens = {bound})" in r.skipped["late_interaction"]
        assert r.hits.doc.tolist() == r.stages["fused"].doc[:30].tolist()
    finally:
        p.close()
        plain.close()
    assert cfg.rerank.li_weight_for(n_long) == 0.0 and cfg.rerank.li_weight_for(n_short) == 1.0
