"""Synthetic training queries (``hybridrag train synth-queries``): the real embedded LLM (llama.cpp server with the
bundled SmolLM2 GGUF) writes queries for sample-corpus documents, the real first stage filters them, and the
folder it writes is a dataset the trainers load and mine."""

from __future__ import annotations

import json

import pytest

from index_builder.documents.corpus import read_corpus
from index_builder.errors import ConfigError
from index_builder.types import Document
from retrieval.generation.embedded import EmbeddedLLMConfig, EmbeddedLLMServer
from tests.helpers import SAMPLE, train_cross_encoder_cli
from training.data import load_training_data, make_groups, mine
from training.export import write_model_card
from training.synthetic import SynthConfig, chat_completer, clean_query, filter_consistent, sample_documents, synthesize


@pytest.fixture(scope="module")
def llm():
    with EmbeddedLLMServer(EmbeddedLLMConfig(threads=2, nice=0, n_ctx=2048)) as server:
        yield server


def test_clean_query_keeps_the_query_and_names_why_it_drops_one():
    doc, cfg = Document("d", "text", title="Chandrasekhar limit"), SynthConfig()
    assert clean_query('Query: "What is the Chandrasekhar limit?"\nmore text', doc, cfg) == (
        "What is the Chandrasekhar limit?", "")
    assert clean_query("  \n1. how heavy can a white dwarf be", doc, cfg) == ("how heavy can a white dwarf be", "")
    assert clean_query("Search query - mass of white dwarfs", doc, cfg) == ("mass of white dwarfs", "")
    assert clean_query("", doc, cfg) == (None, "empty")
    assert clean_query("white dwarf", doc, cfg) == (None, "too short")
    assert clean_query(" ".join(["word"] * 40), doc, cfg) == (None, "too long")
    assert clean_query("Chandrasekhar limit.", doc, cfg) == (None, "too short")
    assert clean_query("the Chandrasekhar limit", Document("d", "t", title="The Chandrasekhar limit"), cfg) == (
        None, "copies the title")


def test_bad_settings_are_refused():
    for bad in ({"docs": -1}, {"keep_top": -2}, {"passage_chars": 10}, {"max_tokens": 1}, {"min_words": 5, "max_words": 4}):
        with pytest.raises(ConfigError):
            SynthConfig(**bad)


def test_sample_is_fixed_by_the_seed():
    docs, _ = read_corpus(SAMPLE / "corpus.jsonl")
    a, b = sample_documents(docs, 5, 1), sample_documents(docs, 5, 1)
    assert [d.id for d in a] == [d.id for d in b] and len({d.id for d in a}) == 5
    assert [d.id for d in sample_documents(docs, 5, 2)] != [d.id for d in a]
    assert len(sample_documents(docs, 0, 1)) == len(docs)


@pytest.mark.slow  # ~19 s: starts the embedded llama.cpp server, generates, then trains on what it wrote
def test_synthesized_queries_form_a_dataset_the_trainers_read(llm, pipeline, sample_index_dir, tmp_path):
    docs, _ = read_corpus(SAMPLE / "corpus.jsonl")
    cfg = SynthConfig(docs=6, seed=5, keep_top=3)
    out = tmp_path / "syn"
    report = synthesize(docs, SAMPLE / "corpus.jsonl", out, chat_completer(llm.base_url, max_tokens=cfg.max_tokens),
                        pipeline, cfg, generator="test")
    # every sampled document is accounted for: kept, or dropped with a reason
    assert report["documents"] == 6 and report["kept"] >= 1
    assert report["usable"] + sum(v for k, v in report["dropped"].items() if not k.startswith("source")) == 6
    assert report["kept"] + report["dropped"].get("source not in the first stage's top 3", 0) == report["usable"]
    assert json.loads((out / "synthetic.json").read_text())["kept"] == report["kept"]
    # the corpus is linked, not copied; each query judges its source document, which the first stage ranks top 3
    assert (out / "corpus.jsonl").is_symlink() and (out / "corpus.jsonl").resolve() == (SAMPLE / "corpus.jsonl").resolve()
    queries = [json.loads(x) for x in (out / "queries.jsonl").read_text().splitlines()]
    train = [x.split("\t") for x in (out / "qrels" / "train.tsv").read_text().splitlines()[1:]]
    unfiltered = [x.split("\t") for x in (out / "qrels" / "unfiltered.tsv").read_text().splitlines()[1:]]
    assert len(queries) == len(unfiltered) == report["usable"] and len(train) == report["kept"]
    sampled = {d.id for d in sample_documents(docs, 6, 5)}
    for i, (q, (qid, doc_id, rel)) in enumerate(zip(queries, unfiltered, strict=True)):
        assert q["_id"] == qid and q["metadata"]["source_doc"] == doc_id in sampled and rel == "1"
        top3 = pipeline.search(q["text"], 3, stages=("bm25", "dense"), candidates=10, use_cache=False).doc_ids()[:3]
        if i < report["kept"]:  # kept first: in train.tsv, the source in the first stage's top 3 at its rank
            assert train[i] == [qid, doc_id, "1"] and top3.index(doc_id) + 1 == q["metadata"]["source_rank"]
        else:
            assert doc_id not in top3 and q["metadata"]["source_rank"] == 0
    # the trainers' loader and miner take the folder as they take a judged dataset (dev held out, no dev split)
    data = load_training_data(out, "train", dev_fraction=0.25, seed=3)
    assert set(data.train) | set(data.dev) == {qid for qid, _, _ in train}
    mine(data, pipeline, depth=5, dev_depth=5)
    assert make_groups(data, hard=2, random_negatives=1, seed=1)
    every = load_training_data(out, "unfiltered", dev_fraction=0.25, seed=3)
    assert set(every.train) | set(every.dev) == {q["_id"] for q in queries}
    # a model trained on the folder says so on its card (a real, tiny training run on it)
    pytest.importorskip("torch")
    log, card = train_cross_encoder_cli(tmp_path / "card", out, sample_index_dir)
    assert f"synthetic, no human judgment: {report['kept']} kept of 6 documents, kept when the first stage" in card
    assert "top 3; written by test" in card
    log["split"] = "unfiltered"
    write_model_card(tmp_path / "card", kind="cross-encoder", dataset=str(out), summary=log, check=log["onnx_check"],
                     command="hybridrag train cross-encoder ... --split unfiltered")
    assert f"{report['usable']} of 6 documents, no filter" in (tmp_path / "card" / "README.md").read_text()


def test_the_filter_drops_a_query_that_does_not_find_its_document(pipeline):
    docs = {d.id: d for d in read_corpus(SAMPLE / "corpus.jsonl")[0]}
    light = docs["astro-001"]
    kept, dropped = filter_consistent([(light, "how far does light travel in one year"),
                                       (light, "recipe for sourdough bread with rye flour")], pipeline, 3)
    assert [q for _, q, _ in kept] == ["how far does light travel in one year"] and 1 <= kept[0][2] <= 3
    assert [(q, r) for _, q, r in dropped] == [("recipe for sourdough bread with rye flour", 0)]
    assert len(filter_consistent([(light, "anything at all")], pipeline, 0)[0]) == 1


def test_cli_names_an_unreachable_generator_and_writes_nothing(sample_index_dir, tmp_path, capsys):
    from hybridrag.cli import main
    from retrieval.generation.embedded import free_port

    out = tmp_path / "syn"
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    assert main(["train", "synth-queries", "--dataset", str(SAMPLE), "--index", str(sample_index_dir), "--out", str(out),
                 "--docs", "2", "--llm-url", url, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "error: the query generator at " + url + " failed: ConnectError" in err and not out.exists()
    assert main(["train", "synth-queries", "--dataset", str(tmp_path / "none"), "--index", str(sample_index_dir),
                 "--out", str(out), "--llm-url", url]) == 2
    assert "no such corpus file" in capsys.readouterr().err
