"""The naive baseline (bench/naive_baseline.py) on the sample corpus: the torch rebuild of the served cross-encoder
matches onnxruntime, and the tutorial pipeline ranks the judged passage first for clear queries.

Real models, no timing assertions; a small candidate list keeps it fast on two cores."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import REPO, SAMPLE

CE_ONNX = REPO.parent / "shared" / "models" / "ce-minilm-l6-beir-train"

# Judged queries whose single best passage (grade 2) shares their topic words: the full pipeline (100 candidates)
# puts it first for all of them; a cross-encoder with wrong weights would do so for about 1 in 10 each (the test
# reranks 10 candidates).
CLEAR = ("q01", "q04", "q06", "q08", "q11", "q16")

pytestmark = [
    pytest.mark.slow,  # ~16 s for the module: loads torch, sentence-transformers and the cross-encoder
    pytest.mark.skipif(not (CE_ONNX / "model.onnx").is_file(), reason="../shared/models/ce-minilm-l6-beir-train is absent"),
]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("rank_bm25")
    pytest.importorskip("onnx")
    from bench.naive_baseline import NaiveBaseline

    return NaiveBaseline(SAMPLE, ce_onnx=CE_ONNX, cache_dir=tmp_path_factory.mktemp("baseline"), candidates=10)


def test_torch_cross_encoder_matches_onnxruntime(baseline, sample_queries, sample_docs):
    from bench.naive_baseline import _ort_logits, passage

    record = baseline.ce_check
    assert record["ok"] and record["parameters"] == 105 and record["from_matmul_node"] == 36
    assert record["max_abs_diff_logits"] < 1e-3 and record["max_abs_diff_cross_encoder_predict"] < 1e-3
    # independently of the recorded check: judged and unjudged pairs, one past 256 word pieces (a long article)
    docs = {d.id: d for d in sample_docs}
    pairs = [(sample_queries[q], passage(docs[d].title, docs[d].text))
             for q, d in (("q01", "astro-001"), ("q01", "cook-001"), ("q26", "climate-long"), ("q12", "hist-008"))]
    ort, feed = _ort_logits(CE_ONNX / "model.onnx", CE_ONNX / "tokenizer.json", pairs, baseline.ce_max_length)
    assert feed["attention_mask"].sum(1).max() == 256  # truncation exercised
    torch_scores = baseline.cross_encoder.predict(pairs)
    assert np.abs(torch_scores - ort).max() < 1e-3
    assert ort[0] > ort[1]  # the light-year query prefers the light-year passage to a cooking one


def test_run_ranks_the_judged_passage_first(baseline, sample_queries, sample_qrels):
    from retrieval.evaluate import evaluate

    res = baseline.run({q: sample_queries[q] for q in CLEAR}, k=10, warmup=0)
    assert res["queries"] == len(CLEAR) and res["qps"] > 0 and set(res["stage_ms"]) == {"bm25", "dense", "fusion",
                                                                                          "cross_encoder"}
    run = res["run"]
    best = {q: next(d for d, g in sample_qrels[q].items() if g == 2) for q in CLEAR}
    first = [q for q in CLEAR if next(iter(run[q])) == best[q]]
    assert len(first) >= len(CLEAR) - 1, {q: list(run[q])[:3] for q in CLEAR}
    assert all(len(run[q]) == 10 for q in CLEAR)  # k = candidates = 10: the whole reranked list
    scores = list(run[CLEAR[0]].values())
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)  # cross-encoder logits, best first
    assert evaluate({q: sample_qrels[q] for q in CLEAR}, run)["ndcg@10"] > 0.8
    assert baseline.search(sample_queries["q01"], k=3)[0][0] == "astro-001"
    assert isinstance(baseline.setup_s["embed_corpus_s"], float) and baseline.setup_s["bm25_index_s"] >= 0
