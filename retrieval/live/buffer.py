"""The segmented write buffer (a log-structured merge of write batches), immutable from end to end.

A :class:`BufferState` is a tuple of immutable :class:`Segment` s, one per encoded write batch (docs, chunks,
vectors, a :class:`TokenStore` built once, BM25 postings, sequence numbers, and the ids it deletes), plus, per
segment, the rows later writes superseded or deleted (*dead*: masked like tombstones, never served, dropped when
the segment is next merged). A write appends one segment: O(size of the write + number of segments), whatever is
buffered; existing segments are shared by the old and the new state. After appending, the last two segments are
merged while the last holds more than half as many entries as the one before it (a binary counter): at most
``log2(entries) + 1`` segments, and each row is copied O(log n) times in all. :mod:`retrieval.live.live_index`
makes the states, and the views that queries read over a snapshot plus one state (:mod:`retrieval.live.view`).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from index_builder.documents.chunking import CHUNK_DTYPE
from index_builder.snapshot.token_store import TokenStore
from index_builder.types import Document
from retrieval.search.aggregate import doc_starts
from retrieval.search.bm25 import BM25Stats
from retrieval.search.filters import Filter
from retrieval.search.index import SearchIndex

_FILTER_CACHE = 32  # filter masks cached per segment (a bool per buffered document each)

Postings = Mapping[str, tuple[np.ndarray, np.ndarray]]  # term -> (chunk rows int32, term frequencies int32)


def build_postings(terms: Sequence[Sequence[str]]) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """BM25 postings of analysed passages: term -> (passage rows, term frequencies), and each passage's length.

    >>> p, lengths = build_postings([["bee", "hive", "bee"], ["hive"]])
    >>> {t: (r.tolist(), f.tolist()) for t, (r, f) in sorted(p.items())}, lengths.tolist()
    ({'bee': ([0], [2]), 'hive': ([0, 1], [1, 1])}, [3.0, 1.0])
    """
    acc: dict[str, tuple[list[int], list[int]]] = {}
    for row, passage in enumerate(terms):
        for term, tf in Counter(passage).items():
            entry = acc.get(term)
            if entry is None:
                acc[term] = entry = ([], [])
            entry[0].append(row)
            entry[1].append(tf)
    postings = {t: (np.asarray(r, np.int32), np.asarray(f, np.int32)) for t, (r, f) in acc.items()}
    return postings, np.asarray([len(t) for t in terms], np.float64)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(s, s + n)`` for each (s, n), vectorised."""
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, np.int64)
    before = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return np.arange(total, dtype=np.int64) + np.repeat(starts - before, lengths)


@dataclass(frozen=True)
class Encoded:
    """An encoded write batch, ready to become a segment: chunks (doc = position in ``docs``), vectors, token
    vectors (stored as the snapshot stores them), BM25 postings and passage lengths."""

    docs: tuple[Document, ...]
    chunks: np.ndarray
    vectors: np.ndarray
    tokens: TokenStore
    postings: Postings
    lengths: np.ndarray


@dataclass(frozen=True, eq=False)
class Segment:
    """One immutable piece of the write buffer: the documents of one write batch (or of a merge of consecutive
    ones) with everything the stages read, and the ids it deleted (``deleted``: id -> sequence number; never one of
    its own documents). Nothing in it changes after it is made; which of its rows are still served is the
    :class:`BufferState`'s business."""

    docs: tuple[Document, ...]
    chunks: np.ndarray  # CHUNK_DTYPE, "doc" = position in docs; grouped by document, in order
    vectors: np.ndarray  # float32 [n_chunks, dim]
    tokens: TokenStore  # per chunk
    postings: Postings  # BM25, per chunk row
    lengths: np.ndarray  # float64 [n_chunks]: analysed terms per chunk
    seqs: tuple[int, ...]  # per document, the sequence number of its version
    deleted: Mapping[str, int] = field(default_factory=dict)
    _filter_masks: dict = field(default_factory=dict, repr=False)  # Filter -> bool [n_docs] (bounded)
    _base_rows: list = field(default_factory=list, repr=False)  # [(snapshot key, rows it hides)] (one entry)

    @classmethod
    def of(cls, enc: Encoded, seqs: Sequence[int]) -> Segment:
        return cls(enc.docs, enc.chunks, enc.vectors, enc.tokens, enc.postings, enc.lengths, tuple(seqs))

    @classmethod
    def deletion(cls, deleted: Mapping[str, int], dim: int, token_dim: int, storage: str) -> Segment:
        return cls((), np.zeros(0, CHUNK_DTYPE), np.zeros((0, dim), np.float32),
                   TokenStore.from_lists([], token_dim, storage), {}, np.zeros(0, np.float64), (), dict(deleted))

    @property
    def size(self) -> int:
        """Entries (documents and deletes): what the merge rule compares."""
        return len(self.docs) + len(self.deleted)

    @cached_property
    def row_of(self) -> dict[str, int]:
        return {d.id: i for i, d in enumerate(self.docs)}

    @cached_property
    def chunk_doc(self) -> np.ndarray:
        return self.chunks["doc"].astype(np.int64)

    @cached_property
    def starts(self) -> np.ndarray:
        return doc_starts(self.chunk_doc, len(self.docs))

    def ids(self) -> Iterable[str]:
        """Every id this segment writes (its documents' and the deleted ones)."""
        yield from self.row_of
        yield from self.deleted

    def base_rows(self, base: SearchIndex) -> np.ndarray:
        """Positions in ``base`` of the documents this segment hides (cached for the latest snapshot)."""
        key = str(base.snapshot.path)
        cached = self._base_rows
        if cached and cached[0][0] == key:
            return cached[0][1]
        rows = np.fromiter((i for i in (base.doc_index.get(d) for d in self.ids()) if i is not None), np.int64)
        self._base_rows[:] = [(key, rows)]
        return rows

    def filter_mask(self, f: Filter) -> np.ndarray:
        """bool [n_docs]: the documents that pass ``f`` (dead ones included: the state masks those)."""
        hit = self._filter_masks.get(f)
        if hit is None:
            hit = np.fromiter(((not f.tenant or d.tenant == f.tenant)
                               and all(d.metadata.get(k) == val for k, val in f.metadata) for d in self.docs),
                              bool, len(self.docs))
            if len(self._filter_masks) >= _FILTER_CACHE:
                self._filter_masks.clear()
            self._filter_masks[f] = hit
        return hit

    def bm25(self, query_terms: Sequence[str], idf: Mapping[str, float], stats: BM25Stats) -> np.ndarray:
        """float32 [n_chunks]: the Lucene BM25 of every chunk with the snapshot's statistics, the same formula and
        operation order as :func:`retrieval.search.bm25.score_with_stats` (repeated query terms count each time)."""
        out = np.zeros(len(self.chunks), np.float64)
        norm = None
        for t in query_terms:
            p = self.postings.get(t)
            if p is None:
                continue
            if norm is None:
                norm = stats.k1 * (1 - stats.b + stats.b * self.lengths / stats.avgdl)
            rows, tf = p
            tf = tf.astype(np.float64)
            out[rows] += idf[t] * tf / (tf + norm[rows])
        return out.astype(np.float32)

    @classmethod
    def combine(cls, parts: Sequence[tuple[Segment, np.ndarray]], deleted: Mapping[str, int], dim: int,
                token_dim: int, storage: str) -> Segment:
        """One new segment of the kept documents (``parts``: segments in order, each with a bool keep mask over
        its documents) and these deletes. Copies the kept rows once (token vectors as stored: no re-encoding)."""
        docs: list[Document] = []
        seqs: list[int] = []
        chunks, vectors, tok_vectors, tok_scales, tok_lengths, lengths = [], [], [], [], [], []
        postings: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        n_docs = n_chunks = 0
        for seg, keep in parts:
            kept = np.flatnonzero(keep)
            if not len(kept):
                continue
            remap = np.full(len(seg.docs), -1, np.int64)
            remap[kept] = np.arange(len(kept)) + n_docs
            crows = np.flatnonzero(keep[seg.chunk_doc])
            ch = seg.chunks[crows].copy()
            ch["doc"] = remap[seg.chunk_doc[crows]]
            chunks.append(ch)
            vectors.append(seg.vectors[crows])
            off = seg.tokens.offsets
            sel = (off[1:] - off[:-1])[crows]
            idx = _ranges(off[:-1][crows], sel)
            tok_vectors.append(seg.tokens.vectors[idx])
            if seg.tokens.scales is not None:
                tok_scales.append(seg.tokens.scales[idx])
            tok_lengths.append(sel)
            lengths.append(seg.lengths[crows])
            chunk_remap = np.full(len(seg.chunks), -1, np.int64)
            chunk_remap[crows] = np.arange(len(crows)) + n_chunks
            everything = len(crows) == len(seg.chunks)
            for term, (rows, tf) in seg.postings.items():
                r = chunk_remap[rows]
                if not everything:
                    m = r >= 0
                    if not m.any():
                        continue
                    r, tf = r[m], tf[m]
                postings.setdefault(term, []).append((r.astype(np.int32), tf))
            docs.extend(seg.docs[i] for i in kept.tolist())
            seqs.extend(seg.seqs[i] for i in kept.tolist())
            n_docs += len(kept)
            n_chunks += len(crows)
        if not docs:
            return cls.deletion(deleted, dim, token_dim, storage)
        tok_len = np.concatenate(tok_lengths)
        tokens = TokenStore(np.concatenate(tok_vectors), np.concatenate([[0], np.cumsum(tok_len)]).astype(np.int64),
                            np.concatenate(tok_scales) if tok_scales else None, storage)
        merged = {t: v[0] if len(v) == 1 else (np.concatenate([r for r, _ in v]), np.concatenate([f for _, f in v]))
                  for t, v in postings.items()}
        return cls(tuple(docs), np.concatenate(chunks), np.concatenate(vectors), tokens, merged,
                   np.concatenate(lengths), tuple(seqs), dict(deleted))


def _merge(a: Segment, b: Segment, dead_a: frozenset[int], dead_b: frozenset[int], dim: int, token_dim: int,
           storage: str) -> Segment:
    """Consecutive segments ``a`` then ``b`` as one, without their dead rows; a delete in ``a`` that ``b``
    overrides (writes the id again) is dropped."""
    def keep(seg: Segment, dead: frozenset[int]) -> np.ndarray:
        mask = np.ones(len(seg.docs), bool)
        if dead:
            mask[list(dead)] = False
        return mask
    deleted = {i: s for i, s in a.deleted.items() if i not in b.row_of and i not in b.deleted}
    deleted.update(b.deleted)
    return Segment.combine([(a, keep(a, dead_a)), (b, keep(b, dead_b))], deleted, dim, token_dim, storage)


def _compact(segments: list[Segment], dead: list[frozenset[int]], dim: int, token_dim: int,
             storage: str) -> None:
    """The merge rule (binary counter), in place: merge the last two segments while the last holds more than
    half as many entries as the one before it."""
    while len(segments) >= 2 and 2 * segments[-1].size > segments[-2].size:
        m = _merge(segments[-2], segments[-1], dead[-2], dead[-1], dim, token_dim, storage)
        segments[-2:] = [m]
        dead[-2:] = [frozenset()]


@dataclass(frozen=True, eq=False)
class BufferState:
    """An immutable write buffer: the documents written since the snapshot, as segments (see the module doc).

    ``dead[j]``: the rows of ``segments[j]`` that a later write in the buffer superseded or deleted (never
    served). ``live_docs``: the buffered documents that are served; ``pending``: the distinct ids written since
    the snapshot (what a rebuild would apply); ``seq``: the store's sequence number this state reflects."""

    segments: tuple[Segment, ...]
    dead: tuple[frozenset[int], ...]
    seq: int
    live_docs: int
    pending: int
    dim: int
    token_dim: int
    storage: str

    @classmethod
    def empty(cls, dim: int, seq: int, *, token_dim: int | None = None, storage: str = "int8") -> BufferState:
        return cls((), (), seq, 0, 0, dim, dim if token_dim is None else token_dim, storage)

    # ------------------------------------------------------------------ index space (lazy, per state)

    @cached_property
    def doc_offsets(self) -> list[int]:
        """Where each segment's documents start in the buffer's document space (and the total, last)."""
        out = [0]
        for s in self.segments:
            out.append(out[-1] + len(s.docs))
        return out

    @cached_property
    def chunk_offsets(self) -> list[int]:
        out = [0]
        for s in self.segments:
            out.append(out[-1] + len(s.chunks))
        return out

    @property
    def n_docs(self) -> int:
        """Buffered document rows (dead ones included: the index space)."""
        return self.doc_offsets[-1]

    @property
    def n_chunks(self) -> int:
        return self.chunk_offsets[-1]

    @cached_property
    def docs(self) -> Sequence[Document]:
        """Every buffered document row in index order (dead ones included: mask them with :attr:`live_mask`)."""
        return _SegmentDocs(self)

    @cached_property
    def chunk_doc(self) -> np.ndarray:
        """int64 [n_chunks]: each buffered chunk's document (buffer numbering)."""
        parts = [s.chunk_doc + off for s, off in zip(self.segments, self.doc_offsets, strict=False)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    @cached_property
    def starts(self) -> np.ndarray:
        """int64 [n_docs]: each buffered document's first chunk (buffer numbering)."""
        parts = [s.starts + off for s, off in zip(self.segments, self.chunk_offsets, strict=False)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    @cached_property
    def live_mask(self) -> np.ndarray:
        """bool [n_docs]: the rows that are served."""
        mask = np.ones(self.n_docs, bool)
        for dead, off in zip(self.dead, self.doc_offsets, strict=False):
            if dead:
                mask[[off + r for r in dead]] = False
        return mask

    @cached_property
    def hidden(self) -> Mapping[str, int]:
        """id -> sequence number of its last write since the snapshot (upsert or delete)."""
        out: dict[str, int] = {}
        for s in self.segments:
            out.update(zip((d.id for d in s.docs), s.seqs, strict=True))
            out.update(s.deleted)
        return out

    def filter_mask(self, f: Filter) -> np.ndarray:
        """bool [n_docs]: the served buffered documents that pass ``f``."""
        parts = [s.filter_mask(f) for s in self.segments]
        return (np.concatenate(parts) if parts else np.zeros(0, bool)) & self.live_mask

    def locate_chunk(self, chunk: int) -> tuple[Segment, int, int]:
        """(segment, its index, the chunk's row in it) of a buffered chunk (buffer numbering)."""
        j = bisect.bisect_right(self.chunk_offsets, chunk) - 1
        return self.segments[j], j, chunk - self.chunk_offsets[j]

    def find(self, doc_id: str) -> tuple[int, int] | None:
        """The latest write of ``doc_id`` in the buffer: (segment, row), row -1 for a delete; None if none.
        The row found is live (a later write would be found first)."""
        for j in range(len(self.segments) - 1, -1, -1):
            s = self.segments[j]
            row = s.row_of.get(doc_id)
            if row is not None:
                return j, row
            if doc_id in s.deleted:
                return j, -1
        return None

    def growth(self, ids: Iterable[str]) -> int:
        """How many more documents would be buffered after upserting these ids (not already live here)."""
        n = 0
        for i in ids:
            hit = self.find(i)
            n += hit is None or hit[1] < 0
        return n

    # ------------------------------------------------------------------ new states

    def _add(self, seg: Segment, ids: Sequence[str]) -> BufferState:
        """This state with ``seg`` appended (its writes supersede every earlier version of their ids): O(ids x
        segments), plus the merges the rule asks for."""
        kills: dict[int, set[int]] = {}
        new_ids = 0
        for i in ids:
            hit = self.find(i)
            if hit is None:
                new_ids += 1
            elif hit[1] >= 0:
                kills.setdefault(hit[0], set()).add(hit[1])
        dead = list(self.dead)
        for j, rows in kills.items():
            dead[j] = dead[j] | rows
        segments = [*self.segments, seg]
        dead.append(frozenset())
        killed = sum(len(r) for r in kills.values())
        seq = max(self.seq, *seg.seqs, *seg.deleted.values())
        _compact(segments, dead, self.dim, self.token_dim, self.storage)
        return BufferState(tuple(segments), tuple(dead), seq, self.live_docs - killed + len(seg.docs),
                           self.pending + new_ids, self.dim, self.token_dim, self.storage)

    def plus(self, enc: Encoded, seqs: Sequence[int]) -> BufferState:
        """Add (or replace) documents written with these sequence numbers (one per document of ``enc``)."""
        return self._add(Segment.of(enc, seqs), [d.id for d in enc.docs])

    def minus(self, deleted: Mapping[str, int]) -> BufferState:
        """Remove documents deleted at these sequence numbers (id -> seq)."""
        if not deleted:
            return self
        return self._add(Segment.deletion(deleted, self.dim, self.token_dim, self.storage), list(deleted))

    def with_seq(self, seq: int) -> BufferState:
        return replace(self, seq=max(self.seq, seq))

    def after(self, seq: int) -> BufferState:
        """What stays buffered once a snapshot covering ``seq`` is served: the writes after ``seq`` (the others are
        in the snapshot), in segments without dead rows."""
        kept: list[Segment] = []
        for seg, dead in zip(self.segments, self.dead, strict=True):
            keep = np.fromiter((s > seq for s in seg.seqs), bool, len(seg.docs))
            if dead:
                keep[list(dead)] = False
            deleted = {i: s for i, s in seg.deleted.items() if s > seq}
            if keep.all() and len(deleted) == len(seg.deleted):
                kept.append(seg)  # untouched: shared with this state
            elif keep.any() or deleted:
                kept.append(Segment.combine([(seg, keep)], deleted, self.dim, self.token_dim, self.storage))
        segments: list[Segment] = []
        dead_out: list[frozenset[int]] = []
        for seg in kept:  # the sizes changed: restore the merge rule
            segments.append(seg)
            dead_out.append(frozenset())
            _compact(segments, dead_out, self.dim, self.token_dim, self.storage)
        ids: set[str] = set()
        for seg in segments:
            ids.update(seg.ids())
        return BufferState(tuple(segments), tuple(dead_out), self.seq, sum(len(s.docs) for s in segments), len(ids),
                           self.dim, self.token_dim, self.storage)


class _SegmentDocs(Sequence[Document]):
    """The buffer's documents in index order, read through the segments (no copy)."""

    def __init__(self, state: BufferState) -> None:
        self.state = state

    def __len__(self) -> int:
        return self.state.n_docs

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        offsets = self.state.doc_offsets
        j = bisect.bisect_right(offsets, i) - 1
        return self.state.segments[j].docs[i - offsets[j]]
