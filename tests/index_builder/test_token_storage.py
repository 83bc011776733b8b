"""The compact token store in the build and the served stage (issue 41, ask 2): a snapshot stored as a codec
(``[late_interaction] storage``, e.g. ``pool3+bins``) is a fraction of the int8 one, its late interaction scores
on the codes what the codec computes, an int8 snapshot is re-stored in the compact form with no model call, a
compact one cannot be turned back (its chunks are embedded again), and a bad storage is refused naming it. Real
model, real sample corpus."""

from __future__ import annotations

import dataclasses
import logging
import shutil

import numpy as np
import pytest

from index_builder.build.builder import build_snapshot
from index_builder.settings import CodecSpec, TokenEncoderConfig
from index_builder.snapshot.format import load_snapshot
from index_builder.snapshot.token_codes import TokenCodec, TokenCodes
from rerank.late_interaction import LateInteractionReranker
from retrieval.search.index import SearchIndex


def _with_storage(config, storage: str):
    build = config.build_config()
    return dataclasses.replace(build, token_encoder=dataclasses.replace(build.token_encoder, storage=storage))


def _tokens_bytes(root) -> int:
    snap = load_snapshot(root, checksums=False)
    return int(snap.token_vectors.nbytes + (0 if snap.token_scales is None else snap.token_scales.nbytes))


def test_a_compact_build_is_smaller_and_scores_on_its_codes(tmp_path, config, embedder, sample_docs, int8_index_dir):
    """Against the sample built with int8 storage (``int8_index_dir``: the same build, made once per run)."""
    compact = build_snapshot(sample_docs, tmp_path / "compact", _with_storage(config, "pool3+bins"), embedder)
    chunks = len(load_snapshot(int8_index_dir, checksums=False).chunks)
    assert compact.embedded == compact.chunks == chunks  # a build of its own: nothing to reuse
    a, b = _tokens_bytes(int8_index_dir), _tokens_bytes(tmp_path / "compact")
    assert b < a / 20  # 50 bytes per pooled vector, a third as many vectors, against 388 per token
    snap = load_snapshot(tmp_path / "compact")
    assert snap.manifest["models"]["token_encoder"]["dtype"] == "pool3+bins"
    assert snap.token_vectors.dtype == np.uint8 and snap.token_scales.dtype == np.float16
    # each chunk keeps about a third of its tokens (at least one)
    n_int8 = np.diff(load_snapshot(int8_index_dir, checksums=False).token_offsets)
    n_compact = np.diff(snap.token_offsets)
    assert np.array_equal(n_compact, np.maximum(n_int8 // 3, 1))

    index = SearchIndex(snap, config)
    assert isinstance(index.late, LateInteractionReranker) and index.late.pooled
    codec = TokenCodec(CodecSpec.parse("pool3+bins"), 384)
    codes = TokenCodes(snap.token_vectors, snap.token_offsets, snap.token_scales)
    query = embedder.encode(["how do bees find flowers"], with_tokens=True).token_vectors[0]
    head = np.arange(20)
    np.testing.assert_array_equal(index.late.scores(query, head), codec.maxsim(query, codes, head))
    # pooled, but each original token keeps its pooled row (the groups): token similarities with positions, one
    # row per token of the int8 store, each its pooled row's (the cross-encoder's windows, highlights)
    assert snap.token_groups is not None and np.array_equal(np.diff(snap.token_group_offsets), n_int8)
    for chunk in (0, 7, 42):
        sims = index.late.token_sims(query, chunk)
        pooled = codec.similarities(query, codes, np.arange(snap.token_offsets[chunk], snap.token_offsets[chunk + 1]))
        groups = np.asarray(snap.token_groups[snap.token_group_offsets[chunk]:snap.token_group_offsets[chunk + 1]])
        assert sims.shape == (n_int8[chunk], len(query)) and set(groups.tolist()) == set(range(n_compact[chunk]))
        np.testing.assert_array_equal(sims, pooled[groups])
    # a store written before the groups were kept has no positions: None, and the stages encode the passage
    old = LateInteractionReranker(snap.token_vectors, snap.token_offsets, snap.token_scales, "pool3+bins")
    assert old.token_sims(query, 0) is None
    # the codes stand for unit-ish vectors near the int8 store's pooled ones: MaxSim correlates with int8's
    full = SearchIndex(load_snapshot(int8_index_dir), config).late
    corr = np.corrcoef(full.scores(query, np.arange(100)), index.late.scores(query, np.arange(100)))[0, 1]
    assert corr > 0.8, corr


def test_an_int8_index_is_restored_compact_without_the_model_and_not_back(tmp_path, config, embedder,
                                                                           sample_docs, caplog, int8_index_dir):
    root = tmp_path / "idx"
    shutil.copytree(int8_index_dir, root)  # the sample built with int8 storage (made once per run), a copy to move
    int8 = load_snapshot(root, checksums=False)
    moved = build_snapshot(sample_docs, root, _with_storage(config, "pool3+bins"), embedder)
    assert moved.embedded == 0 and moved.timings.get("restore", 0) > 0  # re-stored from the int8 rows
    snap = load_snapshot(root)
    assert snap.manifest["models"]["token_encoder"]["dtype"] == "pool3+bins"
    # what the re-store made: each chunk's int8 vectors decoded, pooled and coded
    codec = TokenCodec(CodecSpec.parse("pool3+bins"), 384)
    for c in (0, 17, len(int8.chunks) - 1):
        lo, hi = int8.token_offsets[c], int8.token_offsets[c + 1]
        floats = np.asarray(int8.token_vectors[lo:hi], np.float32) * int8.token_scales[lo:hi, None]
        want = codec.encode_passages(floats, np.array([0, len(floats)]))
        a, b = snap.token_offsets[c], snap.token_offsets[c + 1]
        assert np.array_equal(snap.token_vectors[a:b], want.codes)
        assert np.array_equal(snap.token_scales[a:b], want.scales)
    np.testing.assert_array_equal(snap.vectors, int8.vectors)  # the dense side copied as it was
    # a rebuild in the same storage reuses every chunk; one in int8 cannot decode the codes: it embeds again
    assert build_snapshot(sample_docs, root, _with_storage(config, "pool3+bins"), embedder).embedded == 0
    with caplog.at_level(logging.WARNING, logger="index_builder.build.builder"):
        back = build_snapshot(sample_docs, root, _with_storage(config, "int8"), embedder)
    assert back.embedded == back.chunks and "cannot be re-stored as int8" in caplog.text


@pytest.mark.parametrize("storage, problem", [("pca64+int8", "needs a codec fitted"), ("res2", "needs a codec"),
                                             ("pool3+bits", "unknown codec step 'bits'"), ("int9", "unknown")])
def test_a_storage_the_build_cannot_make_is_refused_naming_it(storage, problem):
    with pytest.raises(ValueError, match="late_interaction.storage") as e:
        TokenEncoderConfig(storage=storage)
    assert problem in str(e.value) and storage in str(e.value)


def test_the_token_store_is_read_by_rows_never_mapped(sample_index_dir, config, embedder):
    """A serving process reads the head's token rows with pread: the token files are never mapped, so their pages
    never count in its RSS (a mapped store ends resident in full: docs/results/scale.md), and a truncated file is
    an error naming it."""
    from pathlib import Path

    from index_builder.snapshot.row_file import RowFile

    index = SearchIndex.load(sample_index_dir, config, embedder)
    query = embedder.encode(["which planet has the largest volcano"], with_tokens=True).token_vectors[0]
    for a in range(0, len(index.chunks) - 20, 20):
        index.late.scores(query, np.arange(a, a + 20))
    maps = Path("/proc/self/maps").read_text()
    assert "token_vectors.npy" not in maps and "token_scales.npy" not in maps
    rows = index.late.vectors
    assert isinstance(rows, RowFile)
    whole = np.load(rows.path)
    pick = np.array([5, 6, 7, 0, 100, 101])
    np.testing.assert_array_equal(rows[pick], whole[pick])
    np.testing.assert_array_equal(np.asarray(rows), whole)


def test_a_truncated_token_file_is_an_error_naming_it(tmp_path):
    from index_builder.snapshot.row_file import RowFile

    p = tmp_path / "token_vectors.npy"
    np.save(p, np.ones((10, 48), np.uint8))
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size - 100)
    rows = RowFile(p)
    assert rows[0:2].shape == (2, 48)
    with pytest.raises(OSError, match="token_vectors.npy: truncated"):
        rows[8:10]
    assert rows[np.array([0, 3, 4])].shape == (3, 48)  # scattered rows: one pread a run, joined
    with pytest.raises(OSError, match="token_vectors.npy: truncated"):  # a short join: read again run by run
        rows[np.array([0, 5, 9])]
