"""``[cross_encoder] precision``: the int8 copy made on first use where the CPU has VNNI/AMX, reused after, ranking
real SciFact pairs as fp32 does; fp32 kept where asked or where int8 would be slower (index_builder/models/int8.py)."""

from __future__ import annotations

import gzip
import json
import logging

import numpy as np
import pytest

import index_builder.models.int8 as int8
from index_builder.models.encoders import CrossEncoder
from index_builder.models.int8 import cpu_int8_dot, int8_dot_extension, is_quantized, serving_onnx
from index_builder.settings import CPU, CrossEncoderConfig
from tests.helpers import CE_MODEL, SHARED_BEIR

needs_model = pytest.mark.skipif(not (CE_MODEL / "model.onnx").is_file(),
                                 reason="../shared/models/ce-minilm-l6-beir-train is absent")
needs_int8_cpu = pytest.mark.skipif(not cpu_int8_dot(), reason="this CPU has no VNNI/AMX: precision auto keeps fp32")
SCIFACT = SHARED_BEIR / "scifact"


def test_cpu_flags_name_the_int8_extension(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n\nprocessor\t: 1\n")
    assert cpu_int8_dot(info) == "avx512_vnni"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")
    assert cpu_int8_dot(info) == ""
    assert cpu_int8_dot(tmp_path / "absent") == ""  # not Linux: no extension known, fp32 kept
    assert int8_dot_extension(["avx_vnni"]) == "avx_vnni" and int8_dot_extension([]) == ""
    assert cpu_int8_dot() in ("", "amx_int8", "avx512_vnni", "avx_vnni")


def test_precision_is_checked():
    with pytest.raises(ValueError, match="precision must be one of auto, int8, fp32"):
        CrossEncoderConfig(model="x", precision="fp16")


@needs_model
def test_auto_keeps_fp32_without_vnni_or_on_a_gpu_and_fp32_is_kept_when_asked(tmp_path, caplog):
    onnx = CE_MODEL / "model.onnx"
    sha = lambda: pytest.fail("no copy is looked up, so the model is not hashed")  # noqa: E731
    with caplog.at_level(logging.INFO, logger="index_builder.models.int8"):
        assert serving_onnx(onnx, sha, precision="auto", providers=[CPU], cache_dir=str(tmp_path),
                            cpu_ext="") == (onnx, "fp32")
    assert "fp32 kept, this CPU has no int8 dot-product instructions" in caplog.text
    assert serving_onnx(onnx, sha, precision="auto", providers=["CUDAExecutionProvider", CPU],
                        cpu_ext="avx512_vnni") == (onnx, "fp32")
    assert serving_onnx(onnx, sha, precision="fp32", providers=[CPU], cpu_ext="avx512_vnni") == (onnx, "fp32")
    ce = CrossEncoder(CrossEncoderConfig(model=str(CE_MODEL), precision="fp32", cache_dir=str(tmp_path)))
    assert ce.precision == "fp32" and ce.onnx_path == onnx and ce.describe()["precision"] == "fp32"
    assert not (tmp_path / "int8").exists()


def scifact_pairs(n_queries: int = 12, per_query: int = 5) -> list[tuple[str, str]]:
    """For each of the first test queries with a judgment: its judged abstract first, then the judged abstracts of
    the next queries (scientific text on other claims)."""
    first: dict[str, str] = {}
    for line in (SCIFACT / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        q, d, _ = line.split("\t")
        first.setdefault(q, d)
    qids = list(first)[:n_queries]
    queries = {j["_id"]: j["text"] for j in map(json.loads, (SCIFACT / "queries.jsonl").open())}
    want = {first[q] for q in qids}
    with gzip.open(SCIFACT / "corpus.jsonl.gz", "rt") as f:
        docs = {j["_id"]: f"{j['title']} {j['text']}" for j in map(json.loads, f) if j["_id"] in want}
    return [(queries[q], docs[first[qids[(i + k) % len(qids)]]]) for i, q in enumerate(qids) for k in range(per_query)]


@needs_model
@needs_int8_cpu
@pytest.mark.skipif(not (SCIFACT / "corpus.jsonl.gz").is_file(), reason="../shared/data/beir/scifact is absent")
def test_auto_makes_the_int8_copy_once_and_it_ranks_scifact_pairs_as_fp32(tmp_path, monkeypatch, caplog):
    config = CrossEncoderConfig(model=str(CE_MODEL), cache_dir=str(tmp_path))  # precision "auto", the default
    with caplog.at_level(logging.INFO, logger="index_builder.models.int8"):
        ce = CrossEncoder(config)
    made = list((tmp_path / "int8").iterdir())
    assert ce.precision == "int8" and made == [ce.onnx_path] and "made its int8 copy" in caplog.text
    assert is_quantized(ce.onnx_path) and not is_quantized(CE_MODEL / "model.onnx")
    assert ce.onnx_path.stat().st_size < (CE_MODEL / "model.onnx").stat().st_size / 2
    assert not list((tmp_path / "int8").glob(".*.tmp"))  # the temporary file was renamed into place
    stamp = ce.onnx_path.stat().st_mtime_ns

    def no_second_quantization(src, dest):
        raise AssertionError(f"quantised again: {src} -> {dest}")

    monkeypatch.setattr(int8, "quantize_atomic", no_second_quantization)
    again = CrossEncoder(config)  # a second load (another process, a restart) reuses the copy
    assert again.onnx_path == ce.onnx_path and again.precision == "int8"
    assert ce.onnx_path.stat().st_mtime_ns == stamp

    # int8 against fp32 on real pairs: 12 SciFact test claims, each against its judged abstract and 4 others.
    # Tolerance (measured 2026-12-07: Pearson 0.974, top-1 12/12, Kendall tau 0.56-1.0, mean 0.88; logits differ
    # by up to 2.5 on a -5..4 range): the same first passage for every query, Pearson >= 0.95, every query's
    # Kendall tau >= 0.4 and their mean >= 0.8.
    pairs = scifact_pairs()
    fp32 = CrossEncoder(CrossEncoderConfig(model=str(CE_MODEL), precision="fp32")).score(pairs).reshape(-1, 5)
    q8 = again.score(pairs).reshape(-1, 5)
    assert (fp32.argmax(1) == q8.argmax(1)).all()
    assert np.corrcoef(fp32.ravel(), q8.ravel())[0, 1] >= 0.95
    taus = np.array([kendall_tau(a, b) for a, b in zip(fp32, q8, strict=True)])
    assert taus.min() >= 0.4 and taus.mean() >= 0.8, taus
    # Unlike fp32, an int8 pair's logit depends on its batch (activations are quantised on one scale per batch):
    # one pair at a time against the batches above moved logits by up to 0.70 (top-1 unchanged for every query).
    alone = np.array([again.score([pair])[0] for pair in pairs]).reshape(-1, 5)
    assert (alone.argmax(1) == q8.argmax(1)).all() and np.abs(alone - q8).max() < 1.5


@needs_model
def test_an_int8_model_is_served_as_it_is(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    int8.quantize_atomic(CE_MODEL / "model.onnx", out / "model.onnx")
    (out / "tokenizer.json").write_bytes((CE_MODEL / "tokenizer.json").read_bytes())
    ce = CrossEncoder(CrossEncoderConfig(model=str(out), precision="int8", cache_dir=str(tmp_path / "cache")))
    assert ce.onnx_path == out / "model.onnx" and ce.precision == "int8"
    assert not (tmp_path / "cache" / "int8").exists() or not list((tmp_path / "cache" / "int8").iterdir())


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-a of two score vectors (no ties in real logits).

    >>> kendall_tau(np.array([3.0, 2.0, 1.0]), np.array([30.0, 20.0, 10.0]))
    1.0
    >>> kendall_tau(np.array([3.0, 2.0, 1.0]), np.array([1.0, 2.0, 3.0]))
    -1.0
    """
    i, j = np.triu_indices(len(a), 1)
    return float(np.mean(np.sign(a[i] - a[j]) * np.sign(b[i] - b[j])))
