import numpy as np
import pytest

from index_builder.documents.chunking import Chunker
from index_builder.settings import ChunkConfig
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


@pytest.mark.parametrize("stride", [2, 16])
def test_prefiltered_top_docs_equal_the_full_pass(monkeypatch, stride):
    """Over many chunks the top documents are narrowed from a sample's threshold first; the answer must be the full
    pass's exactly (documents, scores, best chunks, ties at the k-th score to the lowest ids), with multi-chunk
    documents, masks, a score floor, ties and zeros, and whether the sample guessed too high or not."""
    from retrieval.search import aggregate

    rng = np.random.default_rng(1)
    for trial in range(12):
        n_docs = 3000
        sizes = rng.integers(1, 4, n_docs) if trial % 3 else np.ones(n_docs, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        n = int(sizes.sum())
        scores = (np.round(rng.random(n).astype(np.float32) * 8, 1) * (rng.random(n) > 0.7)).astype(np.float32)
        valid = None if trial % 2 else rng.random(n_docs) > 0.5
        one = bool(trial % 3 == 0)
        for k in (1, 10, 100, 1000):
            for floor in (None, 0.0):
                monkeypatch.setattr(aggregate, "PREFILTER_FROM", 1 << 62)
                full = top_docs_from_chunk_scores(scores, starts, k, valid=valid, min_score=floor, one_per_doc=one)
                monkeypatch.setattr(aggregate, "PREFILTER_FROM", 0)
                monkeypatch.setattr(aggregate, "PREFILTER_STRIDE", stride)
                fast = top_docs_from_chunk_scores(scores, starts, k, valid=valid, min_score=floor, one_per_doc=one)
                assert fast.doc.tolist() == full.doc.tolist() and fast.chunk.tolist() == full.chunk.tolist()
                np.testing.assert_array_equal(fast.scores, full.scores)


def test_prefiltered_bm25_and_exact_dense_equal_the_full_pass(monkeypatch, sample_index, sample_queries, embedder):
    """The same on the real index: BM25 (zeros, a score floor) and exact dense search (negative scores) over the
    sample corpus's chunks, every query, with and without a document filter; and the prefilter is really taken."""
    from retrieval.search import aggregate

    taken = []
    real = aggregate._prefiltered
    monkeypatch.setattr(aggregate, "_prefiltered", lambda *a: taken.append(r := real(*a)) or r)
    monkeypatch.setattr(aggregate, "PREFILTER_STRIDE", 2)
    mask = np.random.default_rng(0).random(len(sample_index.starts)) > 0.5
    texts = list(sample_queries.values())
    vectors = embedder.embed(texts)
    assert sample_index.dense is not None
    for text, vec in zip(texts, vectors, strict=True):
        for k in (1, 5, 20):
            for doc_mask in (None, mask):
                for search, arg in ((sample_index.bm25.search, text), (sample_index.dense.exact, vec)):
                    monkeypatch.setattr(aggregate, "PREFILTER_FROM", 1 << 62)
                    full = search(arg, k, doc_mask)
                    monkeypatch.setattr(aggregate, "PREFILTER_FROM", 0)
                    fast = search(arg, k, doc_mask)
                    assert fast.doc.tolist() == full.doc.tolist() and fast.chunk.tolist() == full.chunk.tolist()
                    np.testing.assert_array_equal(fast.scores, full.scores)
    assert sum(t is not None for t in taken) > len(texts)


def test_best_chunks_are_each_documents_first_best_chunk():
    """The documents' best chunks, taken at once, are what a loop over them finds (first of tied bests)."""
    from retrieval.search.aggregate import best_chunks

    rng = np.random.default_rng(2)
    sizes = rng.integers(1, 6, 500)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    scores = np.round(rng.random(int(sizes.sum())), 1).astype(np.float32)  # many ties
    ends = np.append(starts[1:], len(scores))
    docs = rng.permutation(500)[:120]
    expected = [int(starts[d] + np.argmax(scores[starts[d]:ends[d]])) for d in docs]
    assert best_chunks(scores, starts, docs).tolist() == expected


def test_a_document_of_mostly_spaces_is_cut_into_passages_of_bounded_characters(embedder):
    """900,000 characters, a word every 3,000: spaces make no word pieces, so one window of pieces spanned all of
    it (one 900 KB passage before issue 51). Every passage is now bounded in characters, and holds every word."""
    chunker = Chunker(embedder.files.tokenizer_path, ChunkConfig())
    words = [f"word{i}" for i in range(300)]
    text = "".join(w + " " * (3_000 - len(w)) for w in words)
    assert len(text) == 900_000
    for doc_text in (text, "Title\n\n" + text + "\f" + text):  # a plain document and a folder's sections
        spans = chunker.spans(doc_text)
        assert max(e - s for s, e in spans) <= 224 * 16  # 16 characters a word piece of the window
        assert {w for s, e in spans for w in doc_text[s:e].split()} == set(doc_text.split())  # no word lost
        assert all(doc_text[s:e].strip() == doc_text[s:e] for s, e in spans)  # whitespace runs dropped
    dense = " ".join(f"w{i}" for i in range(150_000))  # words a few characters long: the pieces bound first
    assert chunker.spans(dense) == chunker.window_spans(dense)


def test_the_character_bound_leaves_the_sample_corpus_chunks_unchanged(embedder):
    import json

    from tests.helpers import SAMPLE

    chunker = Chunker(embedder.files.tokenizer_path, ChunkConfig(max_tokens=64, overlap=16))
    for line in (SAMPLE / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        text = json.loads(line)["text"]
        assert chunker.spans(text) == chunker.window_spans(text)
