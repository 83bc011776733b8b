"""Scoring passages outside the BM25 index with the snapshot's statistics (what the live index's write buffer
needs): on the indexed passages themselves it must reproduce bm25s exactly."""

from __future__ import annotations

import numpy as np

from index_builder.documents.chunking import chunk_passages
from retrieval.search.bm25 import score_with_stats


def test_stats_scoring_reproduces_the_index(sample_index, sample_queries):
    stats = sample_index.bm25_stats
    analyzer = sample_index.bm25.analyzer
    terms = analyzer.batch(chunk_passages(sample_index.documents, sample_index.chunks))
    assert sample_index.snapshot.manifest["bm25"]["avgdl"] == stats.avgdl == np.mean([len(t) for t in terms])
    assert stats.num_docs == len(sample_index.chunks)
    for query in list(sample_queries.values())[:12]:
        known = [t for t in analyzer(query) if t in stats.vocab]  # the index ignores terms it never saw
        np.testing.assert_allclose(score_with_stats(known, terms, stats), sample_index.bm25.chunk_scores(query),
                                   rtol=1e-5, atol=1e-5)


def test_a_term_the_index_never_saw_is_rarest(sample_index):
    stats = sample_index.bm25_stats
    analyzer = sample_index.bm25.analyzer
    new = analyzer("zyxwvutsrq honeybee")
    scores = score_with_stats(new, [analyzer("zyxwvutsrq appears here"), analyzer("honeybee appears here")], stats)
    assert scores[0] > scores[1] > 0  # unseen: df 0, the highest IDF; "honeybee" occurs in the sample corpus
