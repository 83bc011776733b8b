"""The dense index kinds a snapshot can keep (``[dense] index``: hnsw, hnsw_sq8, ivf_pq; issue 41): built from the
real model's vectors of the sample corpus, each finds what exact search finds (the compressed kinds re-score their
candidates from the float vectors), records its kind in the manifest, and is chosen by size under ``auto``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from index_builder.build.builder import build_snapshot
from index_builder.snapshot.dense_index import choose
from index_builder.snapshot.format import load_snapshot
from index_builder.snapshot.row_file import RowFile
from retrieval.search.index import SearchIndex


@pytest.mark.parametrize("kind", ["hnsw", "hnsw_sq8", "ivf_pq"])
def test_each_dense_index_finds_what_exact_search_finds(kind, tmp_path, sample_docs, sample_queries, config, embedder):
    # short chunks: ~1,000 of them, enough to train IVF-PQ's 256-centroid sub-quantisers
    cfg = dataclasses.replace(config, chunking=dataclasses.replace(config.chunking, max_tokens=48, overlap=8),
                              dense=dataclasses.replace(config.dense, index=kind))
    summary = build_snapshot(sample_docs, tmp_path / kind, cfg.build_config(), embedder)
    snap = load_snapshot(tmp_path / kind)
    assert snap.manifest["dense"]["index"] == kind and summary.chunks > 600
    index = SearchIndex.load(tmp_path / kind, cfg, embedder)
    assert index.dense is not None and index.dense.rescores == (kind != "hnsw")
    # the rows a compressed kind rescores are read with pread, not through the map (no RSS for them)
    assert isinstance(index.dense.rows, RowFile) == (kind != "hnsw")
    recalls = []
    for q in list(sample_queries.values())[:20]:
        vec = embedder.embed([q])[0]
        hits = index.dense.search(vec, 10)
        got = hits.doc.tolist()
        want = index.dense.search(vec, 10, exact=True).doc.tolist()
        # exact scores: float vectors in the graph, or the compressed kinds' candidates rescored from them
        np.testing.assert_allclose(hits.scores, index.dense.vectors[hits.chunk] @ vec, rtol=1e-5, atol=1e-6)
        recalls.append(len(set(got) & set(want)) / len(want))
    assert np.mean(recalls) >= 0.97, (kind, np.mean(recalls))


def test_auto_picks_the_kind_by_corpus_size():
    assert [choose("auto", n) for n in (1_000, 249_999, 250_000, 4_999_999, 5_000_000)] == \
        ["hnsw", "hnsw", "hnsw_sq8", "hnsw_sq8", "ivf_pq"]
    with pytest.raises(ValueError, match="dense index must be one of"):
        choose("flat", 10)


@pytest.mark.parametrize("kind", ["hnsw_sq8", "ivf_pq"])
def test_training_from_a_map_a_block_at_a_time_trains_the_same_quantiser(kind, monkeypatch, tmp_path,
                                                                        sample_index):
    """The quantisers' sample is read from the memory-mapped vectors a block at a time (their pages dropped after
    each): the same rows, so the same trained index as from the vectors in memory. Real vectors: the sample
    corpus's, repeated past the sample size."""
    import faiss

    from index_builder.settings import HNSWConfig
    from index_builder.snapshot import dense_index

    base = np.asarray(sample_index.snapshot.vectors, dtype=np.float32)
    vectors = np.concatenate([base] * (400 // len(base) + 1))[:400]
    np.save(tmp_path / "v.npy", vectors)
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")
    monkeypatch.setattr(dense_index, "TRAIN_SAMPLE", 300)
    monkeypatch.setattr(dense_index, "TRAIN_BLOCK", 7)
    trained = []
    for source in (vectors, mapped):
        index = dense_index.make(kind, vectors.shape[1], len(vectors), HNSWConfig())
        dense_index.train(index, source)
        trained.append(faiss.serialize_index(index))
    assert np.array_equal(trained[0], trained[1])
