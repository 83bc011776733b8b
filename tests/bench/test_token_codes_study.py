"""The token-codes study's fitted codecs (bench/studies/token_codes.py: PCA, residual codes over k-means centroids,
which no index stores) on the sample index's real token vectors and real query tokens: MaxSim on the codes equal to
MaxSim on the decoded vectors, round-trip error bounds, a full-rank projection lossless, saving and loading, coding
in blocks, a reused k-means; and the stateless specs coded exactly as the product's codec codes them."""

import numpy as np
import pytest

from bench.studies.fitted_codes import FittedCodec, FittedCodes
from index_builder.models.token_encoders import EmbedderTokens
from index_builder.settings import CodecSpec
from index_builder.snapshot.token_codes import TokenCodec
from rerank.maxsim import token_maxsims

SPECS = ["res1+k1", "res2+k1", "res1+k32", "res2+k32", "pca96+int8", "pca64+int4", "pca128+bin", "pca64+res2+k16",
         "pool3+res2+k1", "pool2+pca96+res1+k16"]
QUERIES = ["which planet has the largest volcano", "how do bees share where flowers are",
           "who settles disputes between neighbours", "what makes bread rise"]


@pytest.fixture(scope="module")
def store(int8_index):
    """The sample index's token vectors: (offsets [n + 1], float32 [T, d] decoded from the stored int8)."""
    late = int8_index.late
    assert late is not None and late.scales is not None
    vectors, scales, offsets = np.asarray(late.vectors), np.asarray(late.scales), np.asarray(late.offsets)
    return offsets, vectors.astype(np.float32) * scales[:, None]


@pytest.fixture(scope="module")
def queries(embedder):
    return EmbedderTokens(embedder).encode_queries(QUERIES)


@pytest.fixture(scope="module")
def codecs(store):
    offsets, floats = store
    out = {}
    for spec in SPECS:
        codec = FittedCodec.fit(spec, floats, offsets, seed=0)
        out[spec] = (codec, codec.encode_passages(floats, offsets))
    return out


def heads(offsets, n=4, size=12, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.choice(len(offsets) - 1, size, replace=False) for _ in range(n)]


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
    assert isinstance(codes, FittedCodes)
    per_token = sum(a.nbytes for a in (codes.codes, codes.scales, codes.ids) if a is not None) / codes.tokens
    assert per_token == codec.bytes_per_token
    assert codes.codes.dtype == (np.int8 if codec.spec.quant == "int8" else np.uint8)


@pytest.mark.parametrize("spec", ["int8", "int4", "bins", "pool3+bins"])
def test_a_stateless_spec_codes_and_scores_as_the_products_codec(store, queries, spec):
    """The study's int8 row is the served store: fitting a stateless spec fits nothing and codes, decodes and
    scores bit for bit as the product's codec (what a build stores and a server scores)."""
    offsets, floats = store
    fitted = FittedCodec.fit(spec, floats[:100])
    product = TokenCodec(CodecSpec.parse(spec), floats.shape[1])
    a, b = fitted.encode_passages(floats, offsets), product.encode_passages(floats, offsets)
    for name in ("codes", "offsets", "scales", "groups", "group_offsets"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None and y is None) or np.array_equal(x, y), name
    assert a.ids is None and fitted.params_nbytes == 0 and fitted.bytes_per_token == product.bytes_per_token
    for q in queries:
        for head in heads(offsets):
            assert np.array_equal(fitted.token_maxsims(q, a, head), product.token_maxsims(q, b, head))


def test_round_trip_error_bounds(codecs, store):
    """Residual codes: inside the grid, half a step per element; the cosine to the original rises with bits and k."""
    _, floats = store
    cos = {}
    for spec in ("res1+k1", "res2+k1", "res1+k32", "res2+k32"):
        codec, codes = codecs[spec]
        decoded = codec.decode(codes)
        ids = np.zeros(len(floats), int) if codes.ids is None else codes.ids.astype(int)
        resid = floats - codec.centroids[ids]
        levels = 2 ** int(spec[3])
        inside = (resid >= codec.low - codec.step / 2) & (resid <= codec.low + (levels - 0.5) * codec.step)
        err = np.abs(decoded - floats)
        assert inside.mean() > 0.8 and (err[inside] <= np.broadcast_to(codec.step / 2, err.shape)[inside] + 1e-5).all()
        cos[spec] = float(((decoded * floats).sum(1) / np.linalg.norm(decoded, axis=1)).mean())
    assert cos["res1+k1"] < cos["res2+k1"] and cos["res1+k1"] < cos["res1+k32"] < cos["res2+k32"]
    assert cos["res2+k32"] > 0.9


def test_a_full_rank_projection_is_a_rotation(store):
    """PCA to every dim loses nothing but the quantiser's rounding."""
    offsets, floats = store
    codec = FittedCodec.fit(f"pca{floats.shape[1]}+int8", floats)
    np.testing.assert_allclose(codec.projection @ codec.projection.T, np.eye(floats.shape[1]), atol=1e-4)
    codes = codec.encode_passages(floats, offsets)
    err = np.abs(codec.decode(codes) - floats).max()
    assert err < 0.01
    ranked = FittedCodec.fit("pca64+int8", floats)
    coded = ranked.encode(floats)
    assert np.abs(ranked.decode(coded) - floats).mean() > np.abs(codec.decode(codes) - floats).mean()


@pytest.mark.parametrize("spec", ["res2+k32", "pool2+pca96+res1+k16", "pca64+int4"])
def test_saved_and_loaded_as_npy_files_scores_the_same(codecs, queries, tmp_path, spec):
    codec, codes = codecs[spec]
    for name, a in {**codec.to_arrays(), **codes.to_arrays()}.items():
        np.save(tmp_path / f"{name}.npy", a, allow_pickle=False)
    arrays = {p.stem: np.load(p, allow_pickle=False, mmap_mode="r") for p in tmp_path.glob("*.npy")}
    codec2, codes2 = FittedCodec.from_arrays(arrays), FittedCodes.from_arrays(arrays)
    assert codec2.spec == codec.spec and codec2.describe() == codec.describe()
    assert (codes2.ids is None) == (codes.ids is None)
    for q in queries:
        for head in heads(codes.offsets):
            assert np.array_equal(codec2.token_maxsims(q, codes2, head), codec.token_maxsims(q, codes, head))


@pytest.mark.parametrize("spec", ["res2+k32", "pool3+res2+k1", "res1+k1"])
def test_a_store_coded_in_blocks_equals_one_coded_at_once(codecs, store, spec):
    """Coded in two blocks or at once, the same store (no projection here: a matrix product over blocks of another
    size may round the last bit otherwise)."""
    offsets, floats = store
    codec, whole = codecs[spec]
    cut = len(offsets) // 3
    parts = [codec.encode_passages(floats, offsets[:cut + 1]), codec.encode_passages(floats, offsets[cut:])]
    joined = FittedCodes.concat(parts)
    for name in ("codes", "offsets", "scales", "ids", "groups", "group_offsets"):
        a, b = getattr(joined, name), getattr(whole, name)
        assert (a is None and b is None) or np.array_equal(a, b), name


def test_empty_passages_and_heads(codecs, queries):
    codec, _ = codecs["res2+k32"]
    q = queries[0]
    codes = FittedCodes.concat([codec.encode(np.zeros((0, codec.dim), np.float32)),
                                codec.encode(q[:3]), codec.encode(np.zeros((0, codec.dim), np.float32))])
    out = codec.token_maxsims(q, codes, np.array([0, 1, 2]))
    assert out.shape == (3, len(q)) and (out[[0, 2]] == 0).all() and (out[1] != 0).any()
    assert codec.token_maxsims(q, codes, np.array([], dtype=np.int64)).shape == (0, len(q))
    assert codec.token_maxsims(q, codes, np.array([0, 2])).tolist() == np.zeros((2, len(q))).tolist()


def test_a_codec_reuses_another_ones_projection_and_centroids(codecs, store, queries):
    """res1 over res2's k-means (one k-means for both in the study): the same centroids, its own residual grid."""
    offsets, floats = store
    res2, _ = codecs["pool2+pca96+res1+k16"]
    res1 = FittedCodec.fit("pool2+pca96+res2+k16", floats, offsets, reuse=res2)
    assert res1.centroids is res2.centroids and res1.projection is res2.projection
    assert not np.array_equal(res1.step, res2.step)
    codes = res1.encode_passages(floats, offsets)
    head = heads(codes.offsets, n=1)[0]
    np.testing.assert_allclose(res1.token_maxsims(queries[0], codes, head),
                               token_maxsims(queries[0], res1.decode(codes), codes.offsets, head), atol=2e-5)
    other = FittedCodec.fit("pca64+int8", floats, reuse=res2)  # another projection: fitted afresh
    assert other.projection.shape == (64, floats.shape[1])
