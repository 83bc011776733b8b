import gzip
import json

import pytest

from index_builder.documents.corpus import read_corpus, resolve_corpus_path
from index_builder.errors import CorpusError


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = json.dumps({"_id": "a", "title": "T", "text": "some text", "tenant": "acme", "metadata": {"year": 2020}})


def test_reads_plain_jsonl_and_converts_scalar_metadata(tmp_path):
    p = write_lines(tmp_path / "c.jsonl", [GOOD, json.dumps({"id": 7, "text": "x"})])
    docs, report = read_corpus(p)
    assert [d.id for d in docs] == ["a", "7"]
    assert docs[0].metadata == {"year": "2020"} and docs[0].tenant == "acme"
    assert report.documents == 2 and report.skipped == 0


def test_reads_beir_gz_folder(tmp_path):
    with gzip.open(tmp_path / "corpus.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"_id": "d1", "title": "", "text": "hello"}) + "\n")
    assert resolve_corpus_path(tmp_path).name == "corpus.jsonl.gz"
    docs, _ = read_corpus(tmp_path)
    assert docs[0].id == "d1"


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", "malformed JSON"),
        (json.dumps({"_id": "b", "text": "   "}), "'text' is empty"),
        (json.dumps({"_id": "a", "text": "dup"}), "duplicate document id 'a'"),
        (json.dumps({"text": "no id"}), "missing '_id'"),
        (json.dumps({"_id": "c", "text": "x", "metadata": {"k": [1]}}), "metadata value for key 'k'"),
        (json.dumps({"_id": "d", "text": "x", "tenant": "bad tenant!"}), "'tenant' must be"),
        # issue 51: a lone surrogate (JSON's "\udce9" escape) in a name: refused per line, naming it
        (json.dumps({"_id": "caf\udce9", "text": "x"}), r"'_id' 'caf\udce9' holds a lone surrogate (U+DCE9)"),
        (json.dumps({"_id": "e", "text": "x", "metadata": {"k": "v\ud800"}}), "metadata 'k': the value 'v\\ud800' holds"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, bad, message):
    p = write_lines(tmp_path / "c.jsonl", [GOOD, bad])
    with pytest.raises(CorpusError) as e:
        read_corpus(p)
    assert f"{p}:2:" in str(e.value) and message in str(e.value)
    assert e.value.line == 2


def test_skip_bad_counts_and_keeps_good(tmp_path):
    p = write_lines(tmp_path / "c.jsonl", [GOOD, "{oops", json.dumps({"_id": "a", "text": "dup"}),
                                           json.dumps({"_id": "z", "text": "fine"})])
    docs, report = read_corpus(p, skip_bad=True)
    assert [d.id for d in docs] == ["a", "z"]
    assert report.skipped == 2 and len(report.errors) == 2 and ":2:" in report.errors[0]


def test_lone_surrogates_skipped_in_names_replaced_in_text(tmp_path):
    """Issue 51: an id, or a metadata value, holding a lone surrogate is a bad line (--skip-bad skips it, the rest is
    read); in a title or a text each one becomes U+FFFD (same length: character offsets hold)."""
    p = write_lines(tmp_path / "c.jsonl", [GOOD, json.dumps({"_id": "caf\udce9", "text": "x"}),
                                           json.dumps({"_id": "t", "title": "caf\udce9", "text": "split \ud83d pair"})])
    docs, report = read_corpus(p, skip_bad=True)
    assert [d.id for d in docs] == ["a", "t"] and report.skipped == 1 and "lone surrogate" in report.errors[0]
    assert docs[1].title == "caf\ufffd" and docs[1].text == "split \ufffd pair"
    for d in docs:
        (d.id + d.title + d.text + "".join(d.metadata.values())).encode("utf-8")  # all of it encodable


def test_missing_file_and_empty_corpus(tmp_path):
    with pytest.raises(CorpusError, match="no such corpus file"):
        read_corpus(tmp_path / "nope.jsonl")
    with pytest.raises(CorpusError, match="no corpus.jsonl"):
        read_corpus(tmp_path)
    p = write_lines(tmp_path / "c.jsonl", ["{oops"])
    with pytest.raises(CorpusError, match="no valid documents"):
        read_corpus(p, skip_bad=True)


def test_sample_corpus_is_well_formed(sample_docs, sample_queries, sample_qrels):
    ids = {d.id for d in sample_docs}
    assert 150 <= len(sample_docs) <= 300
    assert {d.tenant for d in sample_docs} >= {"acme", "globex", "initech"}
    assert 25 <= len(sample_qrels) <= 40
    for qid, rels in sample_qrels.items():
        assert qid in sample_queries and set(rels) <= ids
