"""The ColBERT code path with a tiny ONNX model this test builds itself (embedding lookup -> linear projection ->
L2 normalisation), so markers, query augmentation, truncation, the punctuation skiplist, shapes and the projection
are checked against numpy; then int8 token storage, and the model serving through the pipeline."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from index_builder.build.builder import rebuild_token_vectors
from index_builder.models.encoders import bundled_minilm
from index_builder.models.token_encoders import ColbertEncoder
from index_builder.settings import TokenEncoderConfig
from index_builder.snapshot.token_codes import quantize_int8
from index_builder.snapshot.token_store import TokenStore
from rerank.maxsim import maxsim_batch
from retrieval.search.index import SearchIndex
from retrieval.search.pipeline import Pipeline

VOCAB, HIDDEN, DIM = 30522, 16, 8
QLEN, DLEN = 12, 16
COMMA, PERIOD = 1010, 1012


def _tiny_colbert(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    emb = rng.normal(size=(VOCAB, HIDDEN)).astype(np.float32)
    proj = rng.normal(size=(HIDDEN, DIM)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["x"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "axis"], ["m3"]),
        helper.make_node("Mul", ["x", "m3"], ["xm"]),
        helper.make_node("Cast", ["token_type_ids"], ["tt"], to=TensorProto.FLOAT),  # consumed, contributes 0
        helper.make_node("Unsqueeze", ["tt", "axis"], ["tt3"]),
        helper.make_node("Mul", ["tt3", "zero"], ["tt0"]),
        helper.make_node("Add", ["xm", "tt0"], ["h"]),
        helper.make_node("MatMul", ["h", "proj"], ["y"]),
        helper.make_node("ReduceL2", ["y"], ["n"], axes=[-1], keepdims=1),
        helper.make_node("Max", ["n", "eps"], ["nn"]),
        helper.make_node("Div", ["y", "nn"], ["token_embeddings"]),
    ]
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
            for n in ("input_ids", "attention_mask", "token_type_ids")]
    out = helper.make_tensor_value_info("token_embeddings", TensorProto.FLOAT, ["batch", "seq", DIM])
    inits = [numpy_helper.from_array(emb, "emb"), numpy_helper.from_array(proj, "proj"),
             numpy_helper.from_array(np.array([-1], np.int64), "axis"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(1e-12, np.float32), "eps")]
    graph = helper.make_graph(nodes, "tiny_colbert", ints, [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    shutil.copy(bundled_minilm().tokenizer_path, folder / "tokenizer.json")
    (folder / "colbert_config.json").write_text(json.dumps({
        "dim": DIM, "query_marker_id": 1, "doc_marker_id": 2, "mask_token_id": 103, "query_maxlen": QLEN,
        "doc_maxlen": DLEN, "skiplist_punctuation_ids": [COMMA, PERIOD], "onnx_output": "token_embeddings"}))
    return emb, proj


def _expected(emb: np.ndarray, proj: np.ndarray, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    y = (emb[ids] * mask[..., None]) @ proj
    return y / np.maximum(np.linalg.norm(y, axis=-1, keepdims=True), 1e-12)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-colbert")
    emb, proj = _tiny_colbert(folder)
    return ColbertEncoder(TokenEncoderConfig(model=str(folder))), emb, proj


def test_query_layout_markers_and_mask_augmentation(tiny):
    enc, emb, proj = tiny
    word = enc.tokenizer.encode("bees dance", add_special_tokens=False).ids
    ids, mask = enc.query_ids(["Bees dance"])  # lowercased by the tokenizer
    assert ids[0].tolist() == [101, 1, *word, 102] + [103] * (QLEN - len(word) - 3)
    assert mask[0].tolist() == [1] * (len(word) + 3) + [0] * (QLEN - len(word) - 3)
    vecs = enc.encode_queries(["Bees dance"])[0]
    assert vecs.shape == (QLEN, DIM)  # every position is scored, [MASK] padding included
    np.testing.assert_allclose(vecs, _expected(emb, proj, ids, mask)[0], atol=1e-5)

    long_ids, long_mask = enc.query_ids(["word " * 50])
    assert long_ids.shape == (1, QLEN) and long_ids[0, -1] == 102 and long_mask.all()


def test_document_layout_skiplist_and_truncation(tiny):
    enc, emb, proj = tiny
    text = "Honeybees dance, then fly."
    rows = enc.doc_ids([text, "pollen " * 40])
    content = enc.tokenizer.encode(text, add_special_tokens=False).ids
    assert rows[0] == [101, 2, *content, 102] and len(rows[1]) == DLEN and rows[1][-1] == 102
    vecs = enc.encode_documents([text, "pollen " * 40])
    ids = np.array(rows[0])
    keep = ~np.isin(ids, [COMMA, PERIOD])
    assert vecs[0].shape == (int(keep.sum()), DIM) and vecs[0].dtype == np.float16
    np.testing.assert_allclose(vecs[0].astype(np.float32), _expected(emb, proj, ids, np.ones_like(ids))[keep],
                               atol=2e-3)
    assert vecs[1].shape == (DLEN, DIM)


def test_int8_storage_scores_like_fp16():
    rng = np.random.default_rng(1)
    per_passage = [rng.normal(size=(n, 32)).astype(np.float32) for n in (5, 1, 9, 3)]
    per_passage = [v / np.linalg.norm(v, axis=1, keepdims=True) for v in per_passage]
    fp16 = TokenStore.from_lists(per_passage, 32, "float16")
    int8 = TokenStore.from_lists(per_passage, 32, "int8")
    assert int8.vectors.dtype == np.int8 and int8.scales is not None and int8.nbytes < 0.6 * fp16.nbytes
    q, s = quantize_int8(fp16.vectors.astype(np.float32))
    assert np.abs(q.astype(np.float32) * s[:, None] - fp16.vectors.astype(np.float32)).max() < 0.5 / 127 + 1e-3
    query = rng.normal(size=(6, 32)).astype(np.float32)
    rows = np.arange(4)
    np.testing.assert_allclose(maxsim_batch(query, int8.vectors, int8.offsets, rows, int8.scales),
                               maxsim_batch(query, fp16.vectors, fp16.offsets, rows), atol=0.05)


def test_colbert_serves_through_the_cascade(tiny, sample_index_dir, tmp_path, config, embedder):
    enc, _, _ = tiny
    summary = rebuild_token_vectors(sample_index_dir, enc, "int8", out=tmp_path)
    assert summary.token_vectors > 0
    index = SearchIndex.load(tmp_path, config, embedder)
    assert index.late is not None and index.late.scales is not None
    query = "How do honeybees tell the hive where the nectar is?"
    alone = dataclasses.replace(config, rerank=dataclasses.replace(config.rerank, li_weight=1.0))  # raw MaxSim
    with_colbert = Pipeline(index, embedder, alone, token_encoder=enc)
    try:
        res = with_colbert.search(query, k=10, stages=("bm25", "dense", "late_interaction"), li_top_k=8)
        fused, li = res.stages["fused"], res.stages["late_interaction"]
        assert sorted(li.doc[:8].tolist()) == sorted(fused.doc[:8].tolist())
        assert li.doc[8:].tolist() == fused.doc[8:].tolist()
        # the stage's scores are MaxSim of the ColBERT query vectors over the stored (int8) passage vectors
        q = enc.encode_queries([query])[0]
        expected = maxsim_batch(q, index.late.vectors, index.late.offsets, li.chunk[:8], index.late.scales)
        np.testing.assert_allclose(li.scores[:8], expected, rtol=1e-4, atol=1e-4)
    finally:
        with_colbert.close()
    # the embedder's own token vectors must not be scored against ColBERT document vectors: skipped, with why
    mismatched = Pipeline(index, embedder, config)
    try:
        res = mismatched.search(query, k=10, stages=("bm25", "dense", "late_interaction"))
        assert "late_interaction" not in res.stages and "hybridrag index tokens" in res.skipped["late_interaction"]
    finally:
        mismatched.close()
