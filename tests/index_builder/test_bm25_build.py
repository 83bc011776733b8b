"""The streamed BM25 build (index_builder/snapshot/bm25_files.py) scores as bm25s's own ``index`` does, whatever the batches
and the score blocks; real passages of the sample corpus."""

from __future__ import annotations

import json

import bm25s
import numpy as np
import pytest

from index_builder.documents.analysis import Analyzer
from index_builder.documents.corpus import read_corpus
from index_builder.snapshot import bm25_files as bm25_build
from index_builder.snapshot.bm25_files import BM25Builder
from tests.helpers import SAMPLE


def _postings(bm: bm25s.BM25, vocab: dict[str, int]) -> dict[tuple[str, int], float]:
    s = bm.scores
    names = {i: t for t, i in vocab.items()}
    out = {}
    for t in range(len(s["indptr"]) - 1):
        for j in range(int(s["indptr"][t]), int(s["indptr"][t + 1])):
            out[(names[t], int(s["indices"][j]))] = float(s["data"][j])
    return out


@pytest.mark.parametrize("block", [7, 1 << 22])
def test_the_streamed_build_scores_as_bm25s_indexes(monkeypatch, block):
    docs, _ = read_corpus(SAMPLE / "corpus.jsonl")
    terms = Analyzer().batch([f"{d.title} {d.text}" for d in docs])
    monkeypatch.setattr(bm25_build, "SCORE_BLOCK", block)
    ours = BM25Builder()
    for a in range(0, len(terms), 50):  # several batches, as a build adds them
        ours.add(terms[a:a + 50])
    built = ours.finish(0.9, 0.4)
    ref = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    ref.index(terms, show_progress=False)
    got, want = _postings(built, built.vocab_dict), _postings(ref, ref.vocab_dict)
    assert got.keys() == want.keys() and len(got) > 5000
    np.testing.assert_allclose([got[k] for k in want], list(want.values()), rtol=1e-6)
    # CSC order: within each term, passages ascending
    s = built.scores
    for t in range(len(s["indptr"]) - 1):
        col = s["indices"][s["indptr"][t]:s["indptr"][t + 1]]
        assert (np.diff(col) > 0).all()


@pytest.mark.parametrize(("per_pass", "block"), [(2000, 97), (300, 4096), (1 << 24, 1 << 22)])
def test_the_spilled_build_writes_the_held_builds_files(tmp_path, monkeypatch, per_pass, block):
    """With its postings spilled to disk and the matrix written a range of terms at a time (a few thousand
    postings a pass read in blocks of 97; a few hundred a pass, some terms longer than that; or one pass), the
    index's files are the held build's, byte for byte, and bm25s loads them; the postings are on disk, not in
    memory."""
    docs, _ = read_corpus(SAMPLE / "corpus.jsonl")
    terms = Analyzer().batch([f"{d.title} {d.text}" for d in docs])
    monkeypatch.setattr(bm25_build, "SCORE_BLOCK", block)
    monkeypatch.setattr(bm25_build, "PASS_POSTINGS", per_pass)
    held, spilled = BM25Builder(), BM25Builder(spill=tmp_path / "spill")
    for a in range(0, len(terms), 50):
        held.add(terms[a:a + 50])
        spilled.add(terms[a:a + 50])
    assert spilled.postings == held.postings > 5000
    assert held.nbytes - spilled.nbytes == 12 * held.postings  # the postings are on disk, not in memory
    assert (tmp_path / "spill" / "docs").stat().st_size == 4 * spilled.postings
    held.write(tmp_path / "held", 0.9, 0.4)
    spilled.write(tmp_path / "spilled", 0.9, 0.4)
    for name in bm25_build.FILES.values():
        a, b = (tmp_path / "held" / name).read_bytes(), (tmp_path / "spilled" / name).read_bytes()
        if name.endswith(".json"):
            a, b = json.loads(a), json.loads(b)
        assert a == b, name
    loaded = bm25s.BM25.load(str(tmp_path / "spilled"), mmap=True, load_vocab=True, show_progress=False)
    ids = loaded.get_tokens_ids(terms[3][:5])
    reference = bm25s.BM25.load(str(tmp_path / "held"), mmap=True, load_vocab=True, show_progress=False)
    scores = loaded.get_scores_from_ids(ids)
    np.testing.assert_array_equal(scores, reference.get_scores_from_ids(ids))
    assert (scores > 0).sum() > 10
    with pytest.raises(ValueError, match="written to a folder"):
        spilled.finish(0.9, 0.4)


def test_a_spilled_build_that_cannot_write_says_so(tmp_path):
    """(As root every folder is writable: the folder's parent is a file instead.) The build turns the error into
    one that names the file and says CURRENT is untouched (test_stream_build.py)."""
    spilled = BM25Builder(spill=tmp_path / "spill")
    spilled.add([["bee", "hive"], ["hive"]])
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(OSError):
        spilled.write(tmp_path / "file" / "bm25", 0.9, 0.4)
