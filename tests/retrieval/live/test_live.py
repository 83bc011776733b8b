"""The live index on the sample corpus with the real model: a write is visible to the next query in every stage,
replacements and deletes hide the snapshot's version at once, filters apply to buffered documents, a restart
replays the store, and buffered search finds what a rebuild from the store finds."""

from __future__ import annotations

import pytest

from index_builder.build.builder import build_snapshot
from index_builder.models.token_encoders import EmbedderTokens
from index_builder.types import Document
from retrieval.errors import InvalidRequest
from retrieval.live.live_index import LiveIndex
from retrieval.live.store import DocumentStore
from retrieval.search.filters import Filter
from retrieval.search.index import SearchIndex
from retrieval.search.pipeline import Pipeline

STAGES = ("bm25", "dense", "late_interaction")
NEW = Document(id="new-001", tenant="acme", title="Axolotl limb regeneration",
               text="Axolotls regrow entire limbs after amputation: a blastema of dedifferentiated cells forms at "
                    "the wound and rebuilds bone, muscle and nerves in the right pattern.", metadata={"topic": "bio"})


@pytest.fixture()
def live(writable, config, embedder):
    tmp_path = writable
    store = DocumentStore(tmp_path / "store.db")
    base = SearchIndex.load(tmp_path / "index", config, embedder)
    li = LiveIndex(base, store, embedder, EmbedderTokens(embedder), config)
    pipeline = Pipeline(li.view, embedder, config)
    li.on_publish(pipeline.publish)
    yield li, pipeline, store, tmp_path
    pipeline.close()


def ids(pipeline, query, k=10, **kw):
    res = pipeline.search(query, k, **kw)
    return [res.index.documents[d].id for d in res.hits.doc], res


def test_an_upsert_is_visible_to_the_next_query_in_every_stage(live):
    li, pipeline, _, _ = live
    query = "how do axolotls regrow their limbs"
    assert "new-001" not in ids(pipeline, query)[0]
    r = li.upsert([NEW])
    assert r.count == 1 and pipeline.index.buffered == 1
    top, res = ids(pipeline, query, stages=STAGES)
    assert top[0] == "new-001"
    for stage in ("bm25", "dense", "fused", "late_interaction"):
        hits = res.stages[stage]
        assert res.index.documents[hits.doc[0]].id == "new-001", stage
    assert "blastema" in res.index.passage(int(res.hits.chunk[0]))
    # filters apply to buffered documents too
    assert "new-001" not in ids(pipeline, query, filter=Filter.of("globex"))[0]
    assert ids(pipeline, query, filter=Filter.of("acme", {"topic": "bio"}))[0][0] == "new-001"


def test_replace_and_delete_hide_the_snapshot_version_at_once(live, sample_docs):
    li, pipeline, _, _ = live
    old = next(d for d in sample_docs if d.id == "bio-012")
    query = "honeybee waggle dance"
    assert ids(pipeline, query)[0][0] == "bio-012"
    li.upsert([Document(id="bio-012", tenant=old.tenant, title="Renamed", text="Volcanic glass forms when lava "
                        "cools too fast for crystals to grow.", metadata=old.metadata)])
    top, res = ids(pipeline, "obsidian volcanic glass lava cools fast", k=5, stages=STAGES)
    assert top[0] == "bio-012" and top.count("bio-012") == 1
    assert "Volcanic glass" in pipeline.index.passage(int(res.hits.chunk[0]))
    assert "bio-012" not in ids(pipeline, query, k=20)[0]  # the old text is gone from every stage
    li.delete(["bio-012"])
    for q in (query, "obsidian volcanic glass lava cools fast"):
        top, res = ids(pipeline, q, k=50, stages=STAGES)
        assert "bio-012" not in top
        for hits in res.stages.values():
            assert "bio-012" not in {pipeline.index.documents[d].id for d in hits.doc}


def test_a_refused_batch_changes_nothing(live):
    li, pipeline, store, _ = live
    before = store.last_seq()
    with pytest.raises(InvalidRequest, match=r"document 1 \('bad'\).*'text' is empty"):
        li.upsert([NEW, {"_id": "bad", "text": " ", "tenant": "acme"}])
    assert store.last_seq() == before and pipeline.index.buffered == 0 and store.get("new-001") is None


def test_restart_replays_the_store_and_matches_a_rebuild(live, config, embedder):
    li, pipeline, store, tmp_path = live
    li.upsert([NEW])
    li.delete(["astro-001"])
    li.upsert([Document(id="law-new", tenant="initech", text="A contract signed under duress can be voided by "
                        "the party who was coerced.", metadata={"topic": "law"})])
    queries = ["how do axolotls regrow their limbs", "can a contract signed under pressure be cancelled",
               "largest volcano in the solar system", "how do bees find flowers", "stars and planets"]
    served = {q: ids(pipeline, q, stages=STAGES)[0] for q in queries}
    # restart: a new live index over the same snapshot and store replays the writes
    base = SearchIndex.load(tmp_path / "index", config, embedder)
    again = LiveIndex(base, store, embedder, EmbedderTokens(embedder), config)
    p2 = Pipeline(again.view, embedder, config)
    # a fresh build from the store
    seq, docs = store.snapshot()
    build_snapshot(docs, tmp_path / "rebuilt", config.build_config(), embedder, covered_seq=seq)
    p3 = Pipeline(SearchIndex.load(tmp_path / "rebuilt", config, embedder), embedder, config)
    try:
        for q in queries:
            assert ids(p2, q, stages=STAGES)[0] == served[q], q  # replay gives exactly the served answers
            rebuilt = ids(p3, q, stages=STAGES)[0]
            assert rebuilt[0] == served[q][0], q  # the same best document
            assert len(set(rebuilt) & set(served[q])) >= 8, (q, rebuilt, served[q])  # the same documents found
            assert "astro-001" not in served[q] and "astro-001" not in rebuilt
    finally:
        p2.close()
        p3.close()


def test_a_rebuild_embeds_nothing_and_serves_what_the_buffer_served(live):
    """Issue 41: the snapshot's chunks are found in it by key, every buffered write was embedded when it arrived,
    so a rebuild runs no model at all; the answers after the swap are the buffer's (the same vectors; BM25's
    collection statistics now include the writes, so the tail may move)."""
    li, pipeline, store, tmp_path = live
    li.upsert([NEW, Document(id="law-new", tenant="initech", text="A contract signed under duress can be voided "
                             "by the party who was coerced.", metadata={"topic": "law"})])
    li.delete(["astro-001"])
    li.upsert([Document(id="bio-002", tenant="globex",
                        text="Edited: octopuses taste with their suckers.")])
    queries = ["how do axolotls regrow their limbs", "can a contract signed under pressure be cancelled",
               "what do octopus suckers do", "how do bees find flowers"]
    before = {q: ids(pipeline, q, stages=STAGES)[0] for q in queries}
    summary = li.rebuild()
    assert summary is not None and summary.embedded == 0 and summary.reused == summary.chunks, summary
    assert li.view.buffered == 0
    for q in queries:
        after = ids(pipeline, q, stages=STAGES)[0]
        assert after[:3] == before[q][:3] and len(set(after) & set(before[q])) >= 8, (q, after, before[q])


@pytest.mark.slow  # ~12 s: 8 writers and 16 readers across two rebuilds and swaps
def test_writers_and_readers_across_swaps(live, config, embedder):
    """8 writers (40 documents each at most, so that a rebuild's cost stays bounded) and 16 readers for a bounded
    time while the index is rebuilt and swapped twice: no errors, no deleted document served after its delete was
    acknowledged, every acknowledged upsert found by a query that started after the ack; afterwards the served
    results equal a fresh build's."""
    import dataclasses
    import random
    import threading
    import time

    li, pipeline, store, tmp_path = live
    # Rebuild at normal priority with all threads: at nice 19 on one thread, under 24 busy threads, the rebuilds
    # take minutes (this test is about correctness across swaps; bench/live.py measures the priority's effect).
    li.config = dataclasses.replace(config, live=dataclasses.replace(config.live, rebuild_nice=0, rebuild_threads=0))
    acked: dict[str, float] = {}  # id -> when its upsert was acknowledged
    deleted: dict[str, float] = {}  # id -> when its delete was acknowledged
    errors: list[BaseException] = []
    misses: list[str] = []
    leaks: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def writer(w: int) -> None:
        rng = random.Random(w)
        i = 0
        try:
            while not stop.is_set() and i < 40:
                doc_id = f"w{w}-{i}"
                li.upsert([Document(id=doc_id, tenant="acme", title=f"note {w} {i}",
                                    text=f"marker zq{w}q{i} written by writer {w} as note number {i}")])
                with lock:
                    acked[doc_id] = time.monotonic()
                if i and rng.random() < 0.3:
                    victim = f"w{w}-{rng.randrange(i)}"
                    if victim not in deleted:
                        li.delete([victim])
                        with lock:
                            deleted[victim] = time.monotonic()
                i += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def reader(r: int) -> None:
        rng = random.Random(100 + r)
        try:
            while not stop.is_set():
                with lock:
                    candidates = [d for d in acked if d not in deleted]
                    gone = dict(deleted)
                if not candidates:
                    time.sleep(0.01)
                    continue
                target = rng.choice(candidates)
                w, i = target[1:].split("-")
                started = time.monotonic()
                res = pipeline.search(f"zq{w}q{i}", 10)
                found = {res.index.documents[d].id for d in res.hits.doc}
                with lock:
                    if target not in found and target not in deleted:
                        misses.append(target)
                    leaks.extend(d for d in found if d in gone and gone[d] < started)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    threads += [threading.Thread(target=reader, args=(r,)) for r in range(16)]
    for t in threads:
        t.start()
    generations = [pipeline.index.generation]
    try:
        for _ in range(2):
            time.sleep(2.0)
            li.rebuild()  # swaps while writers and readers run
            generations.append(pipeline.index.generation)
        time.sleep(2.0)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    assert len(set(generations)) == 3, generations
    assert not leaks, leaks[:5]
    assert not misses, misses[:5]
    assert len(acked) >= 16 and deleted
    li.rebuild()  # everything written is now in the snapshot
    assert pipeline.index.buffered == 0
    seq, docs = store.snapshot()
    build_snapshot(docs, tmp_path / "fresh", config.build_config(), embedder, covered_seq=seq)
    fresh = Pipeline(SearchIndex.load(tmp_path / "fresh", config, embedder), embedder, config)
    try:
        for q in ["how do bees find flowers", "largest volcano in the solar system", "zq3q1", "contract disputes"]:
            a, b = ids(pipeline, q, stages=STAGES)[0], ids(fresh, q, stages=STAGES)[0]
            assert a[0] == b[0] and len(set(a) & set(b)) >= 9, (q, a, b)
    finally:
        fresh.close()
