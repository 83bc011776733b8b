"""Long queries (issue #23): whole passages are served end to end (library, gRPC, the prompt), and the
evaluation reports a refused query and goes on instead of aborting the run."""

from __future__ import annotations

import dataclasses
import json
import shutil

import grpc
import pytest

from hybridrag.cli import main
from retrieval.client import ClientOptions, RetrieverClient, RetryPolicy
from retrieval.config import ServerConfig
from retrieval.evaluate import build_ood_set, evaluate, judged_queries, load_qrels
from retrieval.generation.prompt import ContextPassage, build_prompt, make_counter
from retrieval.search.pipeline import Pipeline
from retrieval.serving.server import BackgroundServer
from tests.helpers import SAMPLE


def _long_query(doc, chars: int) -> str:
    """A document's own text, repeated to ``chars`` characters: a passage-sized query that must find it."""
    text = f"{doc.title}. {doc.text}"
    return (" ".join([text] * (chars // len(text) + 1)))[:chars]


def test_a_passage_sized_query_is_served_by_every_stage_and_over_grpc(pipeline, sample_docs, sample_index, embedder,
                                                                     config):
    doc = sample_docs[7]
    query = _long_query(doc, 20_000)
    assert 2_048 < len(query) <= pipeline.config.first_stage.max_query_chars
    # the defaults: late interaction over the truncated query's 254 token vectors, blended at li_long_weight 0.5
    res = pipeline.search(query, 10, use_cache=False)
    assert set(res.stages) >= {"bm25", "dense", "fused", "late_interaction"} and not res.degraded and not res.skipped
    assert pipeline.index.documents[int(res.hits.doc[0])].id == doc.id
    skipping = Pipeline(sample_index, embedder, dataclasses.replace(config, rerank=dataclasses.replace(
        config.rerank, li_long_weight=0.0)))
    try:  # li_long_weight = 0: the stage is skipped for long queries, and the response says why
        kept = skipping.search(query, 10, use_cache=False)
        assert ("254 query tokens, cut at the encoder's 256 pieces (rerank.li_long_query_tokens = 128)"
                in kept.skipped["late_interaction"])
        assert skipping.index.documents[int(kept.hits.doc[0])].id == doc.id
    finally:
        skipping.close()
    server = BackgroundServer(pipeline, ServerConfig(port=0))
    try:
        with RetrieverClient(server.target, ClientOptions(retry=RetryPolicy(attempts=1))) as c:
            r = c.retrieve(query, 10, bypass_cache=True)
            assert [p.doc_id for p in r.passages] == [pipeline.index.documents[d].id for d in res.hits.doc]
            assert r.passages[0].doc_id == doc.id
    finally:
        server.stop()


def test_eval_counts_a_refused_query_as_zero_and_finishes_the_run(tmp_path, sample_index_dir, sample_docs):
    data = tmp_path / "data"
    shutil.copytree(SAMPLE, data)
    limit = 32_768
    with open(data / "queries.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"_id": "qlong", "text": _long_query(sample_docs[3], limit + 100)}) + "\n")
    with open(data / "qrels" / "test.tsv", "a", encoding="utf-8") as f:
        f.write(f"qlong\t{sample_docs[3].id}\t1\n")
    base, with_long = tmp_path / "base.json", tmp_path / "long.json"
    assert main(["eval", "--dataset", str(SAMPLE), "--index", str(sample_index_dir), "--quiet",
                 "--json", str(base)]) == 0
    assert main(["eval", "--dataset", str(data), "--index", str(sample_index_dir), "--quiet",
                 "--json", str(with_long)]) == 0
    b, w = json.loads(base.read_text()), json.loads(with_long.read_text())
    n = len(load_qrels(SAMPLE))
    assert w["queries"] == n + 1 and b["failed_queries"] == {}
    failed = w["failed_queries"]
    assert list(failed) == ["qlong"] and set(failed["qlong"]) == set(w["stages"])
    assert all(f"at most {limit}" in why for why in failed["qlong"].values())
    for stage, m in w["stages"].items():
        assert m["failed"] == 1 and m["queries"] == n, stage
        # the refused query counts as 0 (the mean is over n + 1 queries), the others exactly as before
        assert m["ndcg@10"] == pytest.approx(b["stages"][stage]["ndcg@10"] * n / (n + 1), abs=2e-5), stage


def test_the_prompt_cuts_a_passage_sized_question_to_its_budget():
    from retrieval.generation.embedded import bundled_gguf

    counter = make_counter(bundled_gguf())
    question = " ".join(["Why does water boil at a lower temperature on a mountain?"] * 300)
    passages = [ContextPassage("d1", "Boiling", "Water boils when its vapour pressure equals the air pressure.")]
    short = build_prompt("Why?", passages, counter=counter, budget_tokens=512, max_question_tokens=64)
    assert not short.question_truncated and short.messages[1]["content"].endswith("Question: Why?")
    cut = build_prompt(question, passages, counter=counter, budget_tokens=512, max_question_tokens=64)
    asked = cut.messages[1]["content"].split("Question: ", 1)[1]
    assert cut.question_truncated and question.startswith(asked) and 0 < counter.count(asked) <= 64
    assert cut.passages_used == 1  # the context is untouched by the question's cut


def test_doc_query_sets_drop_the_source_document_from_every_run(tmp_path, sample_index_dir):
    out = tmp_path / "docq"
    info = build_ood_set(SAMPLE, "test", out)
    queries, qrels = judged_queries(out, "test")
    originals = load_qrels(SAMPLE)
    multi = {q: j for q, j in originals.items() if len([g for g in j.values() if g > 0]) >= 2}
    assert info["queries"] == len(queries) == len({d for j in multi.values() for d in j}) > 0
    for source, judged in qrels.items():  # the source's co-relevant documents, never itself
        assert source not in judged and judged
        assert all(any(source in j and d in j for j in multi.values()) for d in judged)
    runs = tmp_path / "runs"
    assert main(["eval", "--dataset", str(out), "--index", str(sample_index_dir), "--quiet", "--rerank",
                 "late_interaction", "--json", str(tmp_path / "e.json"), "--run-dir", str(runs)]) == 0
    run: dict[str, dict[str, float]] = {}
    for line in (runs / "late_interaction.trec").read_text().splitlines():
        qid, _, doc, _, score = line.split()[:5]
        run.setdefault(qid, {})[doc] = float(score)
    # the run file keeps the served order, where the source (it is the query) ranks first; scoring drops it
    firsts = [max(docs, key=docs.__getitem__) for docs in run.values()]
    assert sum(f == q for f, q in zip(firsts, run, strict=True)) >= 0.75 * len(run)
    assert evaluate(qrels, run)["ndcg@10"] > evaluate(qrels, run, ignore_identical_ids=False)["ndcg@10"]
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["stages"]["fused"]["queries"] == len(queries) and result["failed_queries"] == {}
    assert result["stages"]["late_interaction"]["ndcg@10"] == pytest.approx(evaluate(qrels, run)["ndcg@10"])


def test_retrieve_refuses_a_query_over_the_abuse_bound_with_its_size(pipeline):
    limit = pipeline.config.first_stage.max_query_chars
    server = BackgroundServer(pipeline, ServerConfig(port=0))
    try:
        with RetrieverClient(server.target, ClientOptions(retry=RetryPolicy(attempts=1))) as c:
            with pytest.raises(grpc.RpcError) as e:
                c.retrieve("x " * limit, 5)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"query is {2 * limit} characters; at most {limit}" in e.value.details()
    finally:
        server.stop()
