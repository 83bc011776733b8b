"""The segmented write buffer (retrieval/live/live_index.py) on the sample corpus with the real model: many small writes,
replacements and deletes serve what a rebuild from the store serves; the segments stay O(log n) and a write
shares every segment it does not merge (structural: identity of the segment objects and their token stores, no
timings); batch limits and deadlines are checked before any work and before the commit; a full buffer refuses
upserts and starts the rebuild; two rebuilds due at once build one generation."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from index_builder.build.builder import build_snapshot
from index_builder.documents.chunking import chunk_passages
from index_builder.models.token_encoders import EmbedderTokens
from index_builder.types import Document
from retrieval.errors import DeadlineExceeded, InvalidRequest, Overloaded
from retrieval.live.live_index import LiveIndex
from retrieval.live.store import MAX_BATCH, MAX_BATCH_BYTES, MAX_TEXT_CHARS, DocumentStore
from retrieval.search.bm25 import score_with_stats
from retrieval.search.filters import Filter
from retrieval.search.index import SearchIndex
from retrieval.search.pipeline import Pipeline

STAGES = ("bm25", "dense", "late_interaction")


def _config(config, **live):
    # normal priority and all threads: these tests are about correctness, not the rebuild's effect on queries
    return dataclasses.replace(config, live=dataclasses.replace(config.live, rebuild_nice=0, **live))


@pytest.fixture()
def live(writable, config, embedder):
    store = DocumentStore(writable / "store.db")
    base = SearchIndex.load(writable / "index", config, embedder)
    li = LiveIndex(base, store, embedder, EmbedderTokens(embedder), _config(config))
    pipeline = Pipeline(li.view, embedder, config)
    li.on_publish(pipeline.publish)
    yield li, pipeline, store, writable
    li.close()
    pipeline.close()
    store.close()


def note(i: int, tenant: str = "acme", version: int = 0) -> Document:
    return Document(id=f"seg-{i}", tenant=tenant, title=f"note {i}",
                    text=f"segment marker zz{i}x{version} written as note {i}, version {version}, about topic {i % 7}",
                    metadata={"topic": f"t{i % 3}"})


def ids(pipeline, query, k=10, **kw):
    res = pipeline.search(query, k, **kw)
    return [res.index.documents[d].id for d in res.hits.doc]


class Counting(Sequence):
    """A list that records which positions were read."""

    def __init__(self, items: list) -> None:
        self.items = items
        self.read: set[int] = set()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        self.read.add(i)
        return self.items[i]


def served(view) -> dict[str, Document]:
    """Every document the view serves (id -> version), read off its masks: each id at most once."""
    masks = view.filters.masks(Filter())
    out: dict[str, Document] = {}
    visible = masks[0] if masks is not None else np.ones(len(view.documents), bool)
    for i in np.flatnonzero(visible).tolist():
        d = view.documents[i]
        assert d.id not in out, f"{d.id} served twice"
        out[d.id] = d
    return out


def test_interleaved_small_writes_serve_what_a_rebuild_serves(live, sample_docs, config, embedder):
    li, pipeline, store, tmp_path = live
    by_id = {d.id: d for d in sample_docs}
    for i in range(40):
        li.upsert([note(i)])
        if i % 4 == 3:  # replace a buffered document (an earlier segment's row dies)
            li.upsert([note(i - 2, version=1)])
        if i % 5 == 4:  # delete a buffered document
            li.delete([f"seg-{i - 3}"])
        if i % 6 == 5:  # replace, then delete, a snapshot document
            old = sample_docs[i]
            li.upsert([Document(id=old.id, tenant=old.tenant, title="Replaced", metadata=old.metadata,
                                text=f"replacement text qq{i} for the snapshot document {old.id}")])
            if i % 12 == 11:
                li.delete([old.id])
    li.upsert([note(100 + j) for j in range(5)] + [note(1, version=2)])  # a batch mixing new and replaced
    view = li.view
    assert len(view.state.segments) <= math.log2(sum(s.size for s in view.state.segments)) + 1
    assert any(view.state.dead), "the replacements left dead rows to mask"
    # exactly the store's documents, each once, in their current version
    _, stored = store.snapshot()
    assert served(view) == {d.id: d for d in stored}
    assert view.buffered == sum(1 for d in stored if d.id not in by_id or by_id[d.id] != d)
    # buffered BM25 scores are score_with_stats' with the snapshot's statistics, exactly
    st = view.state
    passages = [p for s in st.segments for p in chunk_passages(s.docs, s.chunks)]
    query = "segment marker note topic zz3x0 replacement"
    analyzer = view.base.bm25.analyzer
    expected = score_with_stats(analyzer(query), analyzer.batch(passages), view.base.bm25_stats)
    terms = analyzer(query)
    idf = {t: view.base.bm25_stats.idf(t) for t in set(terms)}
    got = np.concatenate([s.bm25(terms, idf, view.base.bm25_stats) for s in st.segments])
    assert np.array_equal(got, expected)
    # every stage finds buffered writes, never a dead row or a deleted document
    assert ids(pipeline, "zz10x0", stages=["bm25"])[0] == "seg-10"
    assert ids(pipeline, "zz13x1", stages=STAGES)[0] == "seg-13"
    assert ids(pipeline, "zz1x2", stages=["bm25"])[0] == "seg-1"
    visible = view.filters.masks(Filter())[0]
    for q in ("zz6x0", "segment marker zz1x0 zz1x1 note 1", "replacement text for the snapshot document"):
        res = pipeline.search(q, 50, stages=STAGES)
        for stage, hits in res.stages.items():
            assert visible[hits.doc].all(), (q, stage)
            assert "seg-6" not in {res.index.documents[d].id for d in hits.doc}  # deleted
    # the same answers as a fresh build from the store
    seq, docs = store.snapshot()
    build_snapshot(docs, tmp_path / "rebuilt", config.build_config(), embedder, covered_seq=seq)
    fresh = Pipeline(SearchIndex.load(tmp_path / "rebuilt", config, embedder), embedder, config)
    try:
        for q in ["segment marker zz12x0 note", "zz13x1", "replacement text for the snapshot document",
                  "how do bees find flowers", "largest volcano in the solar system", "stars and planets"]:
            a, b = ids(pipeline, q, stages=STAGES), ids(fresh, q, stages=STAGES)
            assert a[0] == b[0], (q, a, b)
            assert len(set(a) & set(b)) >= 8, (q, a, b)
    finally:
        fresh.close()
    # a restart replays the same buffer: the same answers
    again = LiveIndex(SearchIndex.load(tmp_path / "index", config, embedder), store, embedder, EmbedderTokens(embedder),
                      _config(config))
    # MaxSim alone (li_weight 1): the template notes tie in BM25 and RRF, ties break by internal id, and a replay
    # numbers the buffered rows afresh; blended with the fused order (the default) the head would carry those ties
    alone = dataclasses.replace(config, rerank=dataclasses.replace(config.rerank, li_weight=1.0))
    p1, p2 = Pipeline(view, embedder, alone), Pipeline(again.view, embedder, alone)
    try:
        assert served(again.view) == served(view)
        for q in ["segment marker zz12x0 note", "zz13x1", "stars and planets"]:
            assert ids(p2, q, stages=STAGES) == ids(p1, q, stages=STAGES), q
            assert ids(p2, q, stages=STAGES)[0] == ids(pipeline, q, stages=STAGES)[0], q  # the default too
    finally:
        p1.close()
        p2.close()


def test_segments_stay_logarithmic_and_a_write_shares_what_it_does_not_merge(live):
    li, pipeline, _, _ = live
    n = 200
    written: set[str] = set()
    copied = 0  # document rows written into merged segments, over all the writes
    for i in range(n):
        old = li.view.state
        doc = note(i) if i % 10 else note(i // 10, version=1)  # every 10th rewrites an earlier id
        replacing = doc.id in written
        li.upsert([doc])
        written.add(doc.id)
        new = li.view.state
        entries = sum(s.size for s in new.segments)
        assert len(new.segments) <= math.floor(math.log2(entries)) + 1, [s.size for s in new.segments]
        k = 0  # the segments the write left alone: a prefix of the old ones, the very same objects
        while k < min(len(old.segments), len(new.segments)) and new.segments[k] is old.segments[k]:
            k += 1
        old_ids = {id(s) for s in old.segments}
        tail = new.segments[k:]
        assert all(id(s) not in old_ids for s in tail)  # the rest is new: the appended or merged tail
        assert all(new.segments[j].tokens is old.segments[j].tokens for j in range(k))  # not re-quantised
        if len(tail) == 1 and k == len(old.segments):  # appended without a merge
            assert tail[0].docs == (doc,)
            if not replacing:  # nothing superseded: the dead-row sets are the previous state's, shared
                assert all(a is b for a, b in zip(new.dead[:k], old.dead, strict=True))
        copied += sum(len(s.docs) for s in tail) - 1
    assert li.view.buffered == len(written)
    assert copied <= n * math.log2(n), copied  # amortised: O(log n) copies per written row
    assert 0 < len(li.view.state.segments) <= math.log2(n) + 1
    # the largest segment outlives a write untouched
    big = li.view.state.segments[0]
    li.upsert([note(10_000)])
    assert li.view.state.segments[0] is big
    assert ids(pipeline, "zz151x0", stages=["bm25"])[0] == "seg-151"
    assert ids(pipeline, "zz7x1", stages=STAGES)[0] == "seg-7"
    # after a rebuild covering a sequence number, exactly the later writes stay buffered
    st = li.view.state
    mid = st.seq - 50
    rest = st.after(mid)
    assert not any(rest.dead) and len(rest.segments) <= math.log2(max(2, sum(s.size for s in rest.segments))) + 1
    later = {d.id: s for seg in st.segments for d, s in zip(seg.docs, seg.seqs, strict=True) if s > mid}
    assert {d.id for seg in rest.segments for d in seg.docs} == set(later) and rest.live_docs == len(later) == 50
    assert dict(rest.hidden) == later


def test_batch_limits_refuse_before_any_work(live):
    li, _, store, _ = live
    before, view = store.last_seq(), li.view
    batch = Counting([note(i) for i in range(MAX_BATCH + 1)])
    with pytest.raises(InvalidRequest, match=f"{MAX_BATCH + 1} documents in one upsert; at most {MAX_BATCH}"):
        li.upsert(batch)
    assert batch.read == set()  # not one document was read, let alone encoded
    ids_batch = Counting([f"x{i}" for i in range(MAX_BATCH + 1)])
    with pytest.raises(InvalidRequest, match="ids in one delete"):
        li.delete(ids_batch)
    assert ids_batch.read == set()
    # over the bytes bound: refused at the document that passes it; the ones after it are never read, so
    # nothing can have been encoded (the encoder needs the whole batch)
    n = MAX_BATCH_BYTES // MAX_TEXT_CHARS + 6
    big = Counting([Document(id=f"big-{i}", tenant="acme", text="x" * MAX_TEXT_CHARS) for i in range(n)])
    with pytest.raises(InvalidRequest, match=f"more than {MAX_BATCH_BYTES} bytes"):
        li.upsert(big)
    assert max(big.read) == MAX_BATCH_BYTES // MAX_TEXT_CHARS < n - 1
    assert store.last_seq() == before and li.view is view and li.view.buffered == 0


def test_a_write_whose_deadline_passes_before_the_commit_is_not_applied(live):
    li, pipeline, store, _ = live
    before = store.last_seq()
    with pytest.raises(DeadlineExceeded, match="before it started"):
        li.upsert([note(1)], deadline=time.monotonic() - 1)
    with pytest.raises(DeadlineExceeded, match="before it started"):
        li.delete(["bio-012"], deadline=time.monotonic() - 1)
    # passes while the write waits for the writer lock (held here), after its encoding: refused at the commit
    errors: list[BaseException] = []
    deadline = time.monotonic() + 5.0
    with li._lock:
        t = threading.Thread(target=lambda: _catch(errors, li.upsert, [note(2)], deadline=deadline))
        t.start()
        time.sleep(max(0.0, deadline - time.monotonic()) + 0.2)
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], DeadlineExceeded) and "before the commit" in str(errors[0])
    assert store.last_seq() == before and store.get("seg-1") is None and store.get("seg-2") is None
    assert li.view.buffered == 0 and "seg-2" not in ids(pipeline, "zz2x0", stages=["bm25"])
    assert store.get("bio-012") is not None
    li.upsert([note(3)], deadline=time.monotonic() + 60)  # in time: applied
    assert store.get("seg-3") is not None and li.view.buffered == 1


def _catch(errors, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except BaseException as e:  # noqa: BLE001
        errors.append(e)


def test_a_full_buffer_refuses_upserts_and_starts_the_rebuild(live, config):
    li, pipeline, store, _ = live
    li.config = _config(config, max_buffered_docs=3, rebuild_after_writes=0, rebuild_after_s=0,
                        check_interval_s=3600.0, rebuild_threads=0)
    li.upsert([note(1), note(2)])
    li.upsert([note(3)])
    before = store.last_seq()
    assert not li.rebuild_due()
    with pytest.raises(Overloaded, match=r"write buffer full: 3 documents buffered \(max 3\)"):
        li.upsert([note(4)])
    assert store.last_seq() == before and store.get("seg-4") is None
    assert li.rebuild_due()
    li.upsert([note(2, version=1)])  # a replacement adds nothing: accepted
    li.delete(["seg-3"])
    li.upsert([note(4)])  # room again
    with pytest.raises(Overloaded):
        li.upsert([note(5), note(6)])
    generation = li.view.generation
    li.start_auto_rebuild()  # the refusal woke it (not the hour-long check interval)
    t0 = time.monotonic()
    while li.view.generation == generation and time.monotonic() - t0 < 300:
        time.sleep(0.2)
    assert li.view.generation == generation + 1 and li.view.buffered == 0
    assert not li.rebuild_due()
    li.upsert([note(5), note(6)])
    assert ids(pipeline, "zz6x0", stages=["bm25"])[0] == "seg-6"


def test_two_rebuilds_due_at_once_build_one_generation(live, config):
    li, pipeline, store, _ = live
    li.config = _config(config, rebuild_threads=0)
    li.upsert([note(1)])
    generation = li.view.generation
    out: list = []
    threads = [threading.Thread(target=lambda: out.append(li.rebuild())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert li.view.generation == generation + 1 and len(li.rebuilds) == 1
    assert sorted(x is None for x in out) == [False, True]  # one built, the other found the work done
    assert li.view.buffered == 0 and ids(pipeline, "zz1x0", stages=["bm25"])[0] == "seg-1"
    assert li.rebuild(only_if_due=True) is None and li.rebuild() is None  # nothing new: nothing built
    assert li.view.generation == generation + 1 and len(li.rebuilds) == 1
