"""The Qdrant backend against the local snapshot it was migrated from: the same scores, the same answers, the
same write semantics (the service-level tests run on both backends through the ``any_pipeline`` fixture)."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from index_builder.errors import ConfigError, SnapshotError
from index_builder.snapshot.format import load_snapshot
from retrieval.app import open_index, open_writes
from retrieval.engines.qdrant.engine import QdrantEngine
from retrieval.engines.qdrant.ids import doc_number
from retrieval.engines.qdrant.view import QdrantView
from retrieval.errors import DeadlineExceeded, InvalidRequest, PermissionDenied
from retrieval.search.filters import Filter
from retrieval.search.pipeline import Pipeline
from tests.conftest import engine_config


def test_bm25_scores_and_dense_lists_equal_the_local_ones(pipeline, engine_pipeline, sample_queries):
    """BM25 as Qdrant sparse vectors with the IDF modifier is the local Lucene BM25 to float precision; exact
    dense search returns the same documents. Lists may differ only where scores tie."""
    for q in list(sample_queries.values()):
        for stages in (("bm25",), ("dense",)):
            a = pipeline.search(q, 20, stages=stages, exact_dense=True, use_cache=False)
            b = engine_pipeline.search(q, 20, stages=stages, exact_dense=True, use_cache=False)
            assert np.allclose(a.hits.scores, b.hits.scores, atol=1e-3), (q, stages)
            ta = [(round(float(s), 3), i) for s, i in zip(a.hits.scores, a.doc_ids(), strict=True)]
            tb = [(round(float(s), 3), i) for s, i in zip(b.hits.scores, b.doc_ids(), strict=True)]
            assert sorted(ta) == sorted(tb) or len(set(a.doc_ids()) ^ set(b.doc_ids())) <= 2, (q, stages)
    # document numbers are hashes of the ids, the same in every replica
    r = engine_pipeline.search("how do bees share where flowers are", 3)
    assert [doc_number(i) for i in r.doc_ids()] == r.hits.doc.tolist()


def test_late_interaction_runs_in_the_engine_and_matches_local_maxsim(pipeline, engine_pipeline, sample_queries):
    same = 0
    for q in sample_queries.values():
        a = pipeline.search(q, 10, use_cache=False)
        b = engine_pipeline.search(q, 10, use_cache=False)
        assert "late_interaction" in b.stages and not b.degraded
        same += a.doc_ids()[:5] == b.doc_ids()[:5]
    assert same >= 0.9 * len(sample_queries)  # fp16/int8 stored vectors locally vs float32 in the engine


def test_engine_filters_keep_tenants_apart_whatever_the_metadata(config, embedder, sample_index_dir):
    cfg = engine_config(config)
    p = Pipeline(open_index(sample_index_dir, cfg, embedder), embedder, cfg)
    writer = open_writes(p, cfg, None)
    try:
        writer.upsert([{"_id": "plant-1", "tenant": "globex", "title": "Honeybee waggle dance",
                        "text": "Bees share where flowers are with a waggle dance.", "metadata": {"tenant": "acme"}}])
        for stages in (("bm25",), ("dense",), None):
            r = p.search("how do bees share where flowers are", 20, filter=Filter.of("acme"), stages=stages)
            assert "plant-1" not in r.doc_ids() and all(p.index.documents[d].tenant == "acme" for d in r.hits.doc)
        r = p.search("how do bees share where flowers are", 3, filter=Filter.of("globex"))
        assert r.doc_ids()[0] == "plant-1"
        r = p.search("bees", 20, filter=Filter.of("", {"tenant": "acme"}), stages=("bm25",))
        assert r.doc_ids() == ["plant-1"]  # metadata matches metadata only
        assert len(p.search("anything", 5, filter=Filter.of("nobody")).hits) == 0
    finally:
        p.close()


def test_engine_writes_replace_chunks_refuse_other_tenants_and_respect_deadlines(config, embedder,
                                                                                  sample_index_dir):
    cfg = engine_config(config)
    p = Pipeline(open_index(sample_index_dir, cfg, embedder), embedder, cfg)
    writer = open_writes(p, cfg, None)
    engine: QdrantEngine = p.index.engine
    m = engine.m

    def chunks_of(doc_id: str) -> int:
        return engine.client.count(engine.name, count_filter=m.Filter(must=[
            m.FieldCondition(key="id", match=m.MatchValue(value=doc_id))]), exact=True).count

    try:
        long_text = " ".join(f"Sentence {i} about the migration of arctic terns across oceans." for i in range(120))
        r1 = writer.upsert([{"_id": "tern", "tenant": "acme", "title": "Terns", "text": long_text}])
        assert chunks_of("tern") > 1
        r2 = writer.upsert([{"_id": "tern", "tenant": "acme", "title": "Terns", "text": "Arctic terns fly far."}])
        assert chunks_of("tern") == 1 and r2.seq > r1.seq  # the longer version's extra chunks are gone
        assert p.search("arctic terns", 1, stages=("bm25",)).index.passage(
            int(p.search("arctic terns", 1, stages=("bm25",)).hits.chunk[0])) == "Arctic terns fly far."
        with pytest.raises(PermissionDenied, match="cannot be written under tenant 'globex'"):
            writer.upsert([{"_id": "tern", "tenant": "globex", "text": "mine now"}])
        with pytest.raises(InvalidRequest, match="document 1"):
            writer.upsert([{"_id": "ok", "tenant": "acme", "text": "fine"}, {"_id": "bad", "tenant": "acme", "text": " "}])
        with pytest.raises(DeadlineExceeded):
            writer.upsert([{"_id": "late", "tenant": "acme", "text": "too late"}], deadline=time.monotonic() - 1)
        assert not engine.owners(["ok", "late"])
        assert writer.delete(["tern"], tenant="globex").count == 0  # not globex's: nothing deleted
        assert writer.delete(["tern", "never-existed"], tenant="acme").count == 1 and chunks_of("tern") == 0
    finally:
        p.close()


def test_migration_refuses_an_existing_collection_and_another_model(config, embedder, sample_index_dir, tmp_path):
    cfg = engine_config(config, location=str(tmp_path / "engine"), collection="sample")
    snap = load_snapshot(sample_index_dir)
    engine = QdrantEngine(cfg.backend)
    try:
        info = engine.migrate(snap)
        assert info["documents"] == len(snap.documents) and info["chunks"] == len(snap.chunks)
        assert engine.points() == len(snap.chunks) and engine.documents() == len(snap.documents)
        with pytest.raises(ConfigError, match="already exists"):
            engine.migrate(snap)
        other = dataclasses.replace(cfg, analyzer=dataclasses.replace(cfg.analyzer, stemmer="none"))
        from index_builder.snapshot.manifest import expected_settings

        with pytest.raises(SnapshotError, match="analyzer.stemmer: snapshot has 'porter', configuration has 'none'"):
            QdrantView.open(engine, expected_settings(other.build_config(), embedder))
        missing = QdrantEngine(dataclasses.replace(cfg.backend, collection="absent"), client=engine.client)
        with pytest.raises(ConfigError, match="does not exist.*hybridrag migrate"):
            QdrantView.open(missing, {})
        with pytest.raises(ConfigError, match="starts empty: give --index SNAPSHOT"):
            QdrantView.open(QdrantEngine(engine_config(config).backend), {})
    finally:
        engine.close()


def test_engine_writes_store_tokens_as_a_migrated_snapshot_does(config, embedder, sample_index_dir):
    """A passage written through the engine holds the vectors a build of the snapshot's storage keeps (pooled,
    coded and decoded), not its raw token vectors, so written and migrated passages are scored alike; the
    collection's tokens are configured as ``[backend] token_*`` say, migration included."""
    from index_builder.documents.chunking import chunk_passages
    from index_builder.models.token_encoders import EmbedderTokens
    from index_builder.snapshot.token_store import TokenStore
    from rerank.late_interaction import LateInteractionReranker
    from retrieval.engines.qdrant.ids import point_id
    from retrieval.live.store import validate_batch

    cfg = engine_config(config, token_quantization="binary")
    p = Pipeline(open_index(sample_index_dir, cfg, embedder), embedder, cfg)
    writer = open_writes(p, cfg, None)
    engine: QdrantEngine = p.index.engine
    try:
        params = engine.client.get_collection(engine.name).config.params.vectors["tokens"]
        assert params.on_disk is True and params.quantization_config.binary.always_ram is True
        storage = p.index.token_encoder["dtype"]
        assert storage == load_snapshot(sample_index_dir).manifest["models"]["token_encoder"]["dtype"] == "pool3+bins"
        doc = {"_id": "bees-1", "tenant": "acme", "title": "Honeybee waggle dance",
               "text": "Forager bees share where flowers are with a waggle dance whose angle points at the sun."}
        writer.upsert([doc])
        pid = point_id("bees-1", 0)
        got = np.asarray(engine.client.retrieve(engine.name, [pid], with_vectors=["tokens"])[0].vector["tokens"],
                         dtype=np.float32)
        docs = validate_batch([doc], None)
        passages = chunk_passages(docs, writer.chunker.chunk(docs))
        assert len(passages) == 1
        tokens = EmbedderTokens(embedder)
        raw = tokens.encode_documents(passages)
        store = TokenStore.from_lists(raw, raw[0].shape[1], storage)
        want = LateInteractionReranker(store.vectors, store.offsets, store.scales, storage).decoded(0)
        assert got.shape == want.shape and len(got) < len(raw[0])  # pooled: fewer vectors than tokens
        assert np.allclose(got, want, atol=1e-4)
        q = tokens.encode_queries(["how do bees tell each other where flowers are"])[0]
        assert abs(engine.maxsim(q, [pid])[pid] - float((q @ want.T).max(axis=1).sum())) < 1e-3
    finally:
        p.close()
