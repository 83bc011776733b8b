"""The query-type suite (issue #53) on a few hundred documents: the generators' invariants (each identifier and
phrase held by exactly its one relevant document, halves disjoint, a query's forms in one half, every type
present), ``hybridrag eval --by-type`` on the sample index, and the reference stack on the same folder."""

import json
import re

import pytest

from bench.querytypes.__main__ import main as generate_main
from bench.querytypes.common import SPLITS
from hybridrag.cli import main
from tests.helpers import SAMPLE

PLANTED = {"flag": "--frobnicate-widgets", "constant": "ZQ_SPOOL_LIMIT", "dotted": "opts.worker_threads",
           "version": "v2.14.6", "snake_case": "max_spool_depth"}
SHARED = "--shared-everywhere"  # in two files: never an identifier query


def _doc_tree(root):
    """The sample corpus's text as markdown files, one planted identifier in each of the first few."""
    rows = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").read_text().splitlines()]
    doc = root / "doc" / "pkg"
    doc.mkdir(parents=True)
    planted = list(PLANTED.values())
    for i in range(0, len(rows), 3):
        body = "\n\n".join(r["text"] for r in rows[i:i + 3])
        extra = f"\n\nSet `{planted[i // 3]}` to change it." if i // 3 < len(planted) else ""
        extra += f"\n\nThe {SHARED} option." if i // 3 in (0, 1) else ""
        (doc / f"notes-{i:03d}.md").write_text(f"# Notes {i}\n\n{body}{extra}\n")
    return root / "doc"


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _qrels(folder):
    out = {}
    for s in SPLITS:
        for row in (folder / "qrels" / f"{s}.tsv").read_text().splitlines()[1:]:
            q, d, g = row.split("\t")
            out.setdefault(s, {}).setdefault(q, {})[d] = int(g)
    return out


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("querytypes")
    tree = _doc_tree(tmp_path_factory.mktemp("tree"))
    assert generate_main(["--out", str(out), "--parts", "debdocs", "--docs", "60", "--per-type", "30",
                          "--man-root", "", "--doc-root", str(tree), "--max-chars", "4000", "--all-packages"]) == 0
    assert generate_main(["--out", str(out), "--parts", "sample", "--beir", str(SAMPLE.parent)]) == 0
    return out


def test_identifiers_and_phrases_are_held_by_exactly_their_one_document(suite):
    folder = suite / "debdocs"
    docs = {r["_id"]: " ".join(f"{r['title']} {r['text']}".lower().split()) for r in _lines(folder / "corpus.jsonl")}
    qrels = {q: j for split in _qrels(folder).values() for q, j in split.items()}
    queries = _lines(folder / "queries.jsonl")
    types = {q["metadata"]["type"] for q in queries}
    assert types == {"identifier", "identifier_question", "phrase"}
    bare = {q["text"] for q in queries if q["metadata"]["type"] == "identifier"}
    assert set(PLANTED.values()) <= bare and SHARED not in bare
    for q in queries:
        needle = q["text"]
        if q["metadata"]["type"] == "phrase":
            assert re.fullmatch(r'"[^"]+"', needle) and 3 <= len(needle.split()) <= 5
            needle = needle.strip('"')
        elif q["metadata"]["type"] == "identifier_question":
            needle = re.sub(r"^(what does|how do I use) | mean$", "", needle)
            needle = re.sub(r" mean$", "", needle)
        holders = [d for d, text in docs.items() if needle.lower() in text]
        assert holders == list(qrels[q["_id"]]), q


def test_halves_are_disjoint_and_forms_share_a_half(suite):
    for part in ("debdocs", "sample"):
        halves = _qrels(suite / part)
        assert set(halves) == set(SPLITS) and not set(halves["tune"]) & set(halves["test"])
        queries = _lines(suite / part / "queries.jsonl")
        assert {q["_id"] for q in queries} == set(halves["tune"]) | set(halves["test"])
        half = {q: s for s, judged in halves.items() for q in judged}
        by_source = {}
        for q in queries:
            key = q["metadata"].get("source") or q["_id"].replace("identifier_question-", "identifier-")
            by_source.setdefault((q["metadata"]["type"] == "long", key), set()).add(half[q["_id"]])
        assert all(len(s) == 1 for s in by_source.values())


def test_beir_forms_keep_the_judgments(suite):
    folder = suite / "sample"
    queries = _lines(folder / "queries.jsonl")
    original = {q["_id"]: q["text"] for q in _lines(SAMPLE / "queries.jsonl")}
    qrels = {q: j for split in _qrels(folder).values() for q, j in split.items()}
    assert {q["metadata"]["type"] for q in queries} >= {"natural", "keywords", "misspelled"}
    for q in queries:
        t, src = q["metadata"]["type"], q["metadata"]["source"]
        if t == "natural":
            assert q["text"] == original[src]
        elif t == "keywords":
            assert 1 <= len(q["text"].split()) <= 3 and set(q["text"].split()) <= set(re.findall(r"[a-z0-9]+",
                                                                                                original[src].lower()))
        elif t == "misspelled":
            changed = sum(a != b for a, b in zip(q["text"].split(" "), original[src].split(" "), strict=True))
            assert 1 <= changed <= 2
        if t != "long":
            assert qrels[q["_id"]] == qrels[f"natural-{src}"]


def test_eval_by_type_reports_every_stage_per_type(suite, sample_index_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", "--dataset", str(suite / "sample"), "--index", str(sample_index_dir), "--split", "tune",
                 "--rerank", "late_interaction", "--by-type", "--json", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    figures = json.loads(out.read_text())
    table = figures["by_type"]
    assert {"natural", "keywords", "misspelled"} <= set(table)
    for stages in table.values():
        assert list(stages) == list(figures["stages"])
        for m in stages.values():
            assert all(0.0 <= m[k] <= 1.0 for k in ("ndcg@10", "success@1", "success@3", "mrr@10"))
            assert m["success@1"] <= m["success@3"]
    gaps = figures["type_gaps"]
    assert set(gaps) == set(table) and all(g["served"] == "late_interaction" for g in gaps.values())
    assert "natural: served late_interaction nDCG@10" in printed
    plain = tmp_path / "plain.json"
    assert main(["eval", "--dataset", str(suite / "sample"), "--index", str(sample_index_dir), "--split", "tune",
                 "--rerank", "late_interaction", "--json", str(plain), "--quiet"]) == 0
    assert "by_type" not in json.loads(plain.read_text()) and "served late_interaction" not in capsys.readouterr().out


def test_reference_stack_scores_the_same_types(suite, tmp_path, monkeypatch):
    import bench.reference_stack
    from bench.reference_stack import run_reference

    monkeypatch.setattr(bench.reference_stack, "CACHE", tmp_path / "cache")
    out = run_reference(suite / "sample", "tune")
    assert set(out["by_type"]) >= {"natural", "keywords", "misspelled"}
    assert set(out["overall"]) == {"bm25s", "faiss_hnsw", "reference"}
    assert out["overall"]["reference"]["ndcg@10"] > 0.3  # the sample's questions are easy: a broken stack is not
