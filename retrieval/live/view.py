"""What a request reads on the local backend: one snapshot generation plus one immutable write-buffer state.

A :class:`LiveView` is one snapshot (:class:`SearchIndex`) plus one :class:`~retrieval.live.buffer.BufferState`.
Every write makes a new buffer state and a new view (:class:`retrieval.live.live_index.LiveIndex`); the pipeline
swaps its ``index`` reference to it, so each request keeps the view it started with from start to end (readers
never lock, never wait).

The view keeps the snapshot's index space and appends the buffer's: buffered document ``i`` is document
``n_snapshot_docs + i``, its chunks follow the snapshot's chunks, so every stage's :class:`Hits` work unchanged.

- **Tombstones**: a document id written since the snapshot (replaced or deleted) is hidden from the snapshot's
  side in every stage at once (a mask, like a filter); its current version, if any, lives in the buffer.
- **BM25 over buffered passages** is scored with the *snapshot's* statistics (IDF from its document frequencies,
  its mean length; the formula of :func:`retrieval.search.bm25.score_with_stats`, over each segment's postings), so
  buffered and indexed passages are ranked on one scale. A second BM25 index over the few buffered passages would
  use that tiny collection's IDF (a word in 1 of 3 buffered passages looks rare) and its scores could not be
  compared; RRF-merging the two lists would put the buffer's best passage near the top for any query sharing a
  word with it.
- **Dense**: exact inner product over the buffered vectors (same embedding space: scores are comparable), merged
  with the snapshot's HNSW results by score.
- **Late interaction**: token vectors of buffered passages, computed and stored (the snapshot's storage) when
  written.

The arrays that combine the snapshot and the buffer (``chunk_doc``, ``starts``, the visibility masks) are computed
lazily, once per view, when a query first needs them: a write never pays for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np

from index_builder.documents.chunking import chunk_passages
from index_builder.snapshot.token_store import TokenStore
from index_builder.types import Document, Hits
from rerank.late_interaction import LateInteractionReranker, Reordering, head_scores, rerank_head
from retrieval.live.buffer import BufferState
from retrieval.search.aggregate import top_docs_from_chunk_scores
from retrieval.search.filters import Filter
from retrieval.search.index import SearchIndex


class _Concat(Sequence[Document]):
    """Two sequences seen as one, without copying (the snapshot's documents, then the buffer's)."""

    def __init__(self, a: Sequence[Document], b: Sequence[Document]) -> None:
        self.a, self.b = a, b

    def __len__(self) -> int:
        return len(self.a) + len(self.b)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        return self.a[i] if i < len(self.a) else self.b[i - len(self.a)]


def _merge_hits(base: Hits, buf: Hits, nb: int, nbc: int, k: int) -> Hits:
    """The top ``k`` of the snapshot's and the buffer's hits by score (ties: the snapshot's first, then each list's
    own order, as one ranking over the concatenated index space would have them)."""
    doc = np.concatenate([base.doc, buf.doc + nb])
    sc = np.concatenate([base.scores, buf.scores]).astype(np.float32)
    ch = np.concatenate([base.chunk, buf.chunk + nbc])
    order = np.argsort(-sc, kind="stable")[:k]
    return Hits(doc[order], sc[order], ch[order])


class LiveView:
    """One snapshot + one buffer state, with the interface the pipeline and the server read (see the module doc).

    Making one is O(1) in the buffer's and the snapshot's size; the arrays that combine both are computed when
    a query first reads them (pure, so two threads racing on one compute the same value)."""

    in_process = True  # in-memory searches (see SearchIndex.in_process)
    backend = "local snapshot"  # what serves it (GetIndexStatus.backend)

    def __init__(self, base: SearchIndex, state: BufferState, storage: str | None = None) -> None:
        self.base = base
        self.state = state
        self.snapshot = base.snapshot
        self.n_base_docs = len(base.documents)
        self.n_base_chunks = len(base.chunks)
        self.documents = _Concat(base.documents, state.docs)
        self.filters = _LiveFilters(self)
        self.bm25 = _LiveBM25(self)
        self.dense = _LiveDense(self) if base.dense is not None else None
        self.late = _LiveLate(self) if base.late is not None else None
        self.token_encoder = base.token_encoder

    @cached_property
    def chunk_doc(self) -> np.ndarray:
        if not self.state.n_chunks:
            return self.base.chunk_doc
        return np.concatenate([self.base.chunk_doc, self.state.chunk_doc + self.n_base_docs])

    @cached_property
    def starts(self) -> np.ndarray:
        if not self.state.n_docs:
            return self.base.starts
        return np.concatenate([self.base.starts, self.state.starts + self.n_base_chunks])

    @cached_property
    def base_visible(self) -> np.ndarray:
        """bool [n_snapshot_docs]: the snapshot's documents that no buffered write hides."""
        visible = np.ones(self.n_base_docs, dtype=bool)
        for seg in self.state.segments:
            visible[seg.base_rows(self.base)] = False
        return visible

    @cached_property
    def _base_visible_chunks(self) -> np.ndarray:
        return self.base_visible[self.base.chunk_doc]

    @cached_property
    def visible_masks(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(document mask, chunk mask) of everything this view serves; None when nothing is hidden."""
        st = self.state
        if not st.segments:
            return None
        return (np.concatenate([self.base_visible, st.live_mask]),
                np.concatenate([self._base_visible_chunks, st.live_mask[st.chunk_doc]]))

    @property
    def generation(self) -> int:
        return self.base.generation

    @property
    def dense_error(self) -> str | None:
        return self.base.dense_error

    @property
    def buffered(self) -> int:
        return self.state.live_docs

    def passage(self, chunk: int) -> str:
        if chunk < self.n_base_chunks:
            return self.base.passage(chunk)
        seg, _, row = self.state.locate_chunk(chunk - self.n_base_chunks)
        c = seg.chunks[row]
        return seg.docs[c["doc"]].text[c["start"]:c["end"]]

    def passage_with_title(self, chunk: int) -> str:
        if chunk < self.n_base_chunks:
            return self.base.passage_with_title(chunk)
        seg, _, row = self.state.locate_chunk(chunk - self.n_base_chunks)
        return chunk_passages(seg.docs, seg.chunks[row].reshape(1))[0]


class _LiveFilters:
    def __init__(self, view: LiveView) -> None:
        self.view = view

    def masks(self, f: Filter) -> tuple[np.ndarray, np.ndarray] | None:
        v = self.view
        base = v.base.filters.masks(f)
        if base is None:
            return v.visible_masks
        st = v.state
        if not st.segments:
            return base
        buf = st.filter_mask(f)
        return (np.concatenate([base[0] & v.base_visible, buf]),
                np.concatenate([base[1] & v._base_visible_chunks, buf[st.chunk_doc]]))


class _LiveBM25:
    def __init__(self, view: LiveView) -> None:
        self.view = view
        self.analyzer = view.base.bm25.analyzer

    def search(self, query: str, k: int, doc_mask: np.ndarray | None = None) -> Hits:
        v = self.view
        st = v.state
        if doc_mask is None and (m := v.visible_masks) is not None:
            doc_mask = m[0]
        nb = v.n_base_docs
        base = top_docs_from_chunk_scores(v.base.bm25.chunk_scores(query), v.base.starts, k,
                                          valid=None if doc_mask is None else doc_mask[:nb], min_score=0.0)
        if not st.n_chunks:
            return base
        stats = v.base.bm25_stats
        terms = self.analyzer(query)
        idf = {t: stats.idf(t) for t in set(terms)}
        scores = np.concatenate([s.bm25(terms, idf, stats) for s in st.segments])
        buf = top_docs_from_chunk_scores(scores, st.starts, k, valid=None if doc_mask is None else doc_mask[nb:],
                                         min_score=0.0)
        return _merge_hits(base, buf, nb, v.n_base_chunks, k)


class _LiveDense:
    def __init__(self, view: LiveView) -> None:
        self.view = view

    def search(self, query_vec: np.ndarray, k: int, doc_mask: np.ndarray | None = None,
               chunk_mask: np.ndarray | None = None, *, exact: bool = False) -> Hits:
        v = self.view
        st = v.state
        assert v.base.dense is not None
        nb, nbc = v.n_base_docs, v.n_base_chunks
        if doc_mask is None and (m := v.visible_masks) is not None:
            doc_mask, chunk_mask = m
        base = v.base.dense.search(query_vec, k, None if doc_mask is None else doc_mask[:nb],
                                   None if chunk_mask is None else chunk_mask[:nbc], exact=exact)
        if not st.n_chunks:
            return base
        q = np.asarray(query_vec, dtype=np.float32)
        scores = np.concatenate([s.vectors @ q for s in st.segments])
        buf = top_docs_from_chunk_scores(scores, st.starts, k, valid=None if doc_mask is None else doc_mask[nb:])
        return _merge_hits(base, buf, nb, nbc, k)


def _segment_late(tokens: TokenStore) -> LateInteractionReranker:
    return LateInteractionReranker(tokens.vectors, tokens.offsets, tokens.scales, tokens.storage, tokens.groups,
                                   tokens.group_offsets)


class _LiveLate:
    def __init__(self, view: LiveView) -> None:
        self.view = view

    def token_sims(self, query_tokens: np.ndarray, chunk: int) -> np.ndarray | None:
        """Every stored token of ``chunk`` (the snapshot's or a buffered one) against every query token: float32
        [t, q] (the cross-encoder's windows)."""
        v = self.view
        late = v.base.late
        assert late is not None
        if chunk < v.n_base_chunks:
            return late.token_sims(query_tokens, chunk)
        st = v.state
        local = chunk - v.n_base_chunks
        offsets = np.asarray(st.chunk_offsets, np.int64)
        j = int(np.searchsorted(offsets, local, side="right") - 1)
        return _segment_late(st.segments[j].tokens).token_sims(query_tokens, int(local - offsets[j]))

    def rerank(self, query_tokens: np.ndarray, chunks: np.ndarray, top_k: int, weight: float = 1.0,
               score: str = "maxsim") -> Reordering:
        v = self.view
        late = v.base.late
        assert late is not None
        head = np.asarray(chunks[:top_k], dtype=np.int64)
        per_token = np.zeros((len(head), len(query_tokens)), dtype=np.float32)
        in_base = head < v.n_base_chunks
        if in_base.any():
            per_token[in_base] = late.token_maxsims(query_tokens, head[in_base])
        buffered = np.flatnonzero(~in_base)
        if len(buffered):
            st = v.state
            local = head[buffered] - v.n_base_chunks
            offsets = np.asarray(st.chunk_offsets, np.int64)
            seg_of = np.searchsorted(offsets, local, side="right") - 1
            for j in np.unique(seg_of).tolist():
                sel = seg_of == j
                per_token[buffered[sel]] = _segment_late(st.segments[j].tokens).token_maxsims(
                    query_tokens, local[sel] - offsets[j])
        return rerank_head(head_scores(per_token, score), len(chunks), weight)
