import numpy as np

from index_builder.chunking import ChunkConfig, Chunker
from index_builder.types import Document
from retrieval.search.aggregate import doc_starts, top_docs_from_chunk_scores

TEXT = " ".join(f"word{i} is followed by another sentence number {i}." for i in range(120))


def test_long_text_is_split_into_overlapping_word_aligned_windows(embedder):
    chunker = Chunker(embedder.files.tokenizer_path, ChunkConfig(max_tokens=64, overlap=16))
    spans = chunker.spans(TEXT)
    assert len(spans) > 5
    assert spans[0][0] == 0 and spans[-1][1] == len(TEXT)
    tok = chunker.tokenizer
    for (s1, e1), (s2, e2) in zip(spans, spans[1:], strict=False):
        assert s1 < s2 < e1 < e2  # consecutive windows overlap and advance
        assert TEXT[s2 - 1] == " " and (e1 == len(TEXT) or TEXT[e1] == " ")  # whole words
    for s, e in spans:
        assert len(tok.encode(TEXT[s:e], add_special_tokens=False).ids) <= 64 + 8  # a word may run over a little


def test_short_text_is_one_chunk_and_chunks_map_to_documents(embedder):
    chunker = Chunker(embedder.files.tokenizer_path, ChunkConfig(max_tokens=64, overlap=16))
    docs = [Document("a", "short text"), Document("b", TEXT), Document("c", "another short one")]
    chunks = chunker.chunk(docs)
    assert chunks["doc"][0] == 0 and chunks["doc"][-1] == 2
    assert (np.diff(chunks["doc"]) >= 0).all()  # grouped by document
    assert (chunks["doc"] == 1).sum() == len(chunker.spans(TEXT))
    assert (chunks[0]["start"], chunks[0]["end"]) == (0, len("short text"))


def test_documents_score_as_their_best_chunk():
    chunk_doc = np.array([0, 1, 1, 1, 2])
    starts = doc_starts(chunk_doc, 3)
    scores = np.array([0.5, 0.1, 0.9, 0.2, 0.7], dtype=np.float32)
    hits = top_docs_from_chunk_scores(scores, starts, k=3)
    assert hits.doc.tolist() == [1, 2, 0]
    assert hits.chunk.tolist() == [2, 4, 0]
    np.testing.assert_allclose(hits.scores, [0.9, 0.7, 0.5])
    masked = top_docs_from_chunk_scores(scores, starts, k=3, valid=np.array([True, False, True]))
    assert masked.doc.tolist() == [2, 0]


def test_one_chunk_per_doc_shortcut_gives_the_same_hits():
    """The shortcut for indexes whose documents are single chunks (skipping the per-document max) returns exactly
    what the general path does, with masks, a score floor and ties; it is taken only where it holds."""
    from retrieval.search.aggregate import one_chunk_per_doc

    rng = np.random.default_rng(0)
    n = 2000
    starts = np.arange(n, dtype=np.int64)
    assert one_chunk_per_doc(starts, n) and not one_chunk_per_doc(starts[:-1], n)
    assert not one_chunk_per_doc(np.array([0, 0, 2]), 3)  # an empty document: not one chunk each
    for trial in range(20):
        scores = np.round(rng.random(n).astype(np.float32) * 4, 1) * (rng.random(n) > 0.6)  # zeros and ties
        valid = None if trial % 2 else rng.random(n) > 0.3
        for k in (1, 10, 100, 5000):
            for floor in (None, 0.0):
                a = top_docs_from_chunk_scores(scores, starts, k, valid=valid, min_score=floor)
                b = top_docs_from_chunk_scores(scores, starts, k, valid=valid, min_score=floor, one_per_doc=True)
                assert a.doc.tolist() == b.doc.tolist() and a.chunk.tolist() == b.chunk.tolist()
                np.testing.assert_array_equal(a.scores, b.scores)
