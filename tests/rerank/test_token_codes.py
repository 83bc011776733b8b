"""The stateless token-store codecs an index stores (index_builder/snapshot/token_codes.py) on the sample index's
real token vectors and real query tokens: round-trip error bounds, MaxSim on the codes equal to MaxSim on the decoded
vectors, today's int8 store reproduced bit for bit, saving and loading, pooling, a fitted spec refused. The fitted
codecs (PCA, residual codes) are the token-codes study's: tests/bench/test_token_codes_study.py."""

import numpy as np
import pytest

from index_builder.models.token_encoders import EmbedderTokens
from index_builder.settings import QUANTS, CodecSpec, check_storage
from index_builder.snapshot.token_codes import TokenCodec, TokenCodes, stored_codec
from index_builder.snapshot.token_pooling import pool_passage, pool_tokens
from rerank.late_interaction import LateInteractionReranker
from rerank.maxsim import token_maxsims

SPECS = ["int8", "int4", "bin", "bins", "pool2+int8", "colpool2+int8", "pool3+bins", "pool2+int4"]
QUERIES = ["which planet has the largest volcano", "how do bees share where flowers are",
           "who settles disputes between neighbours", "what makes bread rise"]


@pytest.fixture(scope="module")
def store(int8_index):
    """The sample index's token vectors stored as int8: (int8 [T, d], float32 scales [T], offsets [n + 1], float32
    [T, d])."""
    late = int8_index.late
    assert late is not None and late.scales is not None
    vectors, scales, offsets = np.asarray(late.vectors), np.asarray(late.scales), np.asarray(late.offsets)
    return vectors, scales, offsets, vectors.astype(np.float32) * scales[:, None]


@pytest.fixture(scope="module")
def queries(embedder):
    return EmbedderTokens(embedder).encode_queries(QUERIES)


def codec_of(spec: str, dim: int) -> TokenCodec:
    return TokenCodec(CodecSpec.parse(spec), dim)


@pytest.fixture(scope="module")
def codecs(store):
    _, _, offsets, floats = store
    out = {}
    for spec in SPECS:
        codec = codec_of(spec, floats.shape[1])
        out[spec] = (codec, codec.encode_passages(floats, offsets))
    return out


def heads(offsets, n=4, size=12, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.choice(len(offsets) - 1, size, replace=False) for _ in range(n)]


def test_spec_round_trips_and_refuses_nonsense():
    for text in SPECS:
        spec = CodecSpec.parse(text)
        assert CodecSpec.parse(str(spec)) == spec
    assert CodecSpec.parse("res1").centroids == 1024 and CodecSpec.parse("int8").centroids == 0
    for bad in ("int3", "pca", "int8+k4", "pool0+int8", "res2+fast"):
        with pytest.raises(ValueError):
            CodecSpec.parse(bad)
    assert set(QUANTS) == {"int8", "int4", "bin", "bins", "res1", "res2"}


@pytest.mark.parametrize("spec", ["pca64+int8", "res2", "res1+k1", "pool2+pca96+res1+k16"])
def test_a_spec_that_needs_fitting_is_not_a_product_codec(spec):
    """An index stores stateless codecs only (check_storage); the fitted ones are the token-codes study's."""
    with pytest.raises(ValueError, match="needs fitting on a corpus .*bench/studies/token_codes.py"):
        codec_of(spec, 384)
    with pytest.raises(ValueError, match="needs a codec fitted on the corpus"):
        check_storage(spec)


def test_int8_codec_is_todays_store_exactly(store, queries):
    """Re-coding the decoded stored vectors gives the stored codes and scales back, and MaxSim is bit-identical
    to rerank.maxsim.token_maxsims (what serves today)."""
    vectors, scales, offsets, floats = store
    codec = codec_of("int8", floats.shape[1])
    codes = codec.encode_passages(floats, offsets)
    assert np.array_equal(codes.codes, vectors) and np.array_equal(codes.scales, scales)
    assert np.array_equal(codes.offsets, offsets) and codes.groups is None
    stored = TokenCodes(vectors, offsets, scales)
    for q in queries:
        for head in heads(offsets):
            assert np.array_equal(codec.token_maxsims(q, stored, head), token_maxsims(q, vectors, offsets, head, scales))
    assert codec.bytes_per_token == 388 and codec.describe()["bytes_per_token"] == 388


@pytest.mark.parametrize("spec", SPECS)
def test_maxsim_on_codes_equals_maxsim_on_decoded_vectors(codecs, queries, spec):
    codec, codes = codecs[spec]
    decoded = codec.decode(codes)
    assert decoded.shape == (codes.tokens, codec.dim) and decoded.dtype == np.float32
    for q in queries:
        for head in heads(codes.offsets):
            on_codes = codec.token_maxsims(q, codes, head)
            on_decoded = token_maxsims(q, decoded, codes.offsets, head)
            np.testing.assert_allclose(on_codes, on_decoded, atol=2e-5, rtol=1e-5)
            np.testing.assert_allclose(codec.maxsim(q, codes, head), on_decoded.sum(axis=1), atol=5e-4, rtol=1e-5)


@pytest.mark.parametrize("spec", SPECS)
def test_bytes_per_token_is_what_the_arrays_hold(codecs, spec):
    codec, codes = codecs[spec]
    per_token = sum(a.nbytes for a in (codes.codes, codes.scales) if a is not None) / codes.tokens
    assert per_token == codec.bytes_per_token
    assert codes.codes.dtype == (np.int8 if codec.spec.quant == "int8" else np.uint8)


def test_round_trip_error_bounds(codecs, store):
    _, _, offsets, floats = store
    # int8: half a step per element
    codec, codes = codecs["int8"]
    assert (np.abs(codec.decode(codes) - floats) <= 0.5 * codes.scales[:, None] + 1e-6).all()
    # int4: half a step (float16 scale: a hair more)
    codec, codes = codecs["int4"]
    s = codes.scales.astype(np.float32)[:, None]
    assert (np.abs(codec.decode(codes) - floats) <= 0.51 * s + 1e-6).all()
    # bin: the signs exactly; bins: the signs times mean |x|
    codec, codes = codecs["bin"]
    assert np.array_equal(codec.decode(codes), np.where(floats > 0, 1.0, -1.0).astype(np.float32))
    codec, codes = codecs["bins"]
    expect = np.where(floats > 0, 1.0, -1.0) * np.abs(floats).mean(axis=1, keepdims=True)
    np.testing.assert_allclose(codec.decode(codes), expect, rtol=2e-3, atol=1e-6)


def test_pooling_keeps_a_factor_of_the_tokens_as_unit_rows(store):
    _, _, offsets, floats = store
    lengths = np.diff(offsets)
    for factor, method in ((1, "ward"), (2, "ward"), (3, "ward"), (2, "colbert")):
        pooled, new = pool_tokens(floats, offsets, factor, method)
        counts = np.diff(new)
        if factor == 1:
            assert np.array_equal(pooled, floats) and np.array_equal(new, offsets)
            continue
        assert (counts <= np.maximum(lengths // factor, 1)).all() and (counts >= 1).all()
        assert counts.sum() >= 0.95 * np.maximum(lengths // factor, 1).sum()  # maxclust rarely falls short
        np.testing.assert_allclose(np.linalg.norm(pooled, axis=1), 1.0, atol=1e-5)
    # duplicates merge exactly; a passage of one token is kept
    v = floats[offsets[0]:offsets[0] + 4]
    doubled = np.repeat(v, 2, axis=0)
    np.testing.assert_allclose(pool_passage(doubled, 2), v / np.linalg.norm(v, axis=1, keepdims=True), atol=1e-6)
    np.testing.assert_allclose(pool_passage(v[:1], 3), v[:1])


def test_pooled_store_scores_close_to_the_full_one(codecs, store, queries):
    """Pool factor 2 keeps MaxSim close: each query token's best match loses at most what its cluster averaged."""
    vectors, scales, offsets, _ = store
    codec, codes = codecs["pool2+int8"]
    for q in queries:
        for head in heads(offsets):
            full = token_maxsims(q, vectors, offsets, head, scales)
            pooled = codec.token_maxsims(q, codes, head)
            assert np.abs(pooled - full).mean() < 0.03


@pytest.mark.parametrize("spec", ["int8", "int4", "bins", "pool3+bins"])
def test_saved_and_loaded_as_npy_files_scores_the_same(codecs, queries, tmp_path, spec):
    codec, codes = codecs[spec]
    for name, a in codes.to_arrays().items():
        np.save(tmp_path / f"{name}.npy", a, allow_pickle=False)
    arrays = {p.stem: np.load(p, allow_pickle=False, mmap_mode="r") for p in tmp_path.glob("*.npy")}
    codes2 = TokenCodes.from_arrays(arrays)
    codec2 = stored_codec(spec, codes2.codes.shape[1]) or codec  # what a server reads the store with (int8: plain)
    assert codec2.describe() == codec.describe() and codes2.nbytes == codes.nbytes
    for q in queries:
        for head in heads(codes.offsets):
            assert np.array_equal(codec2.token_maxsims(q, codes2, head), codec.token_maxsims(q, codes, head))


@pytest.mark.parametrize("spec", ["int4", "bin", "pool2+int8", "pool3+bins"])
def test_a_store_coded_in_blocks_equals_one_coded_at_once(codecs, store, spec):
    _, _, offsets, floats = store
    codec, whole = codecs[spec]
    cut = len(offsets) // 3
    parts = [codec.encode_passages(floats, offsets[:cut + 1]), codec.encode_passages(floats, offsets[cut:])]
    joined = TokenCodes.concat(parts)
    for name in ("codes", "offsets", "scales", "groups", "group_offsets"):
        a, b = getattr(joined, name), getattr(whole, name)
        assert (a is None and b is None) or np.array_equal(a, b), name


def test_empty_passages_and_heads(codecs, queries):
    codec, _ = codecs["int4"]
    q = queries[0]
    codes = TokenCodes.concat([codec.encode(np.zeros((0, codec.dim), np.float32)),
                               codec.encode(q[:3]), codec.encode(np.zeros((0, codec.dim), np.float32))])
    out = codec.token_maxsims(q, codes, np.array([0, 1, 2]))
    assert out.shape == (3, len(q)) and (out[[0, 2]] == 0).all() and (out[1] != 0).any()
    assert codec.token_maxsims(q, codes, np.array([], dtype=np.int64)).shape == (0, len(q))
    assert codec.token_maxsims(q, codes, np.array([0, 2])).tolist() == np.zeros((2, len(q))).tolist()


def test_the_served_reranker_scores_a_compact_store_on_its_codes(store, queries):
    """LateInteractionReranker over a stored codec (what a snapshot with storage ``bins`` or ``pool3+bins`` serves):
    the codec's own MaxSim on the codes, its windows' similarities where the store keeps token positions, none where
    tokens were pooled; ``int8`` stays today's path exactly."""
    vectors, scales, offsets, floats = store
    today = LateInteractionReranker(vectors, offsets, scales)
    assert today.codec is None and not today.pooled
    for storage in ("bins", "pool3+bins", "pool2+int4"):
        codec = codec_of(storage, floats.shape[1])
        codes = codec.encode_passages(floats, offsets)
        late = LateInteractionReranker(codes.codes, codes.offsets, codes.scales, storage)
        assert late.codec is not None and late.codec.dim == floats.shape[1]
        for q in queries:
            chunks = heads(codes.offsets, n=1, size=30)[0]
            r = late.rerank(q, chunks, 20)
            expect = np.argsort(-codec.maxsim(q, codes, chunks[:20]), kind="stable")
            assert np.array_equal(r.order[:20], expect) and np.array_equal(r.order[20:], np.arange(20, 30))
            sims = late.token_sims(q, int(chunks[0]))
            if storage == "bins":
                lo, hi = codes.offsets[chunks[0]], codes.offsets[chunks[0] + 1]
                np.testing.assert_allclose(sims, codec.decode(codes, np.arange(lo, hi)) @ q.T, atol=1e-4)
            else:
                assert sims is None  # pooled: no token positions to place a window on
