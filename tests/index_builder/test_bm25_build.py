"""The streamed BM25 build (index_builder/bm25_build.py) scores as bm25s's own ``index`` does, whatever the batches
and the score blocks; real passages of the sample corpus."""

from __future__ import annotations

import bm25s
import numpy as np
import pytest

from index_builder import bm25_build
from index_builder.analysis import Analyzer
from index_builder.bm25_build import BM25Builder
from index_builder.corpus import read_corpus
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
