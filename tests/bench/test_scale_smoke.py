"""The scale bench on a few hundred passages: the corpus generator on a small documentation tree (the sample
corpus's text laid out as markdown, text, HTML, a Sphinx tree and a man page), the bench on two sizes (one on the
real model, one on perturbed vectors), the quality run with distractors, and the vector cache the builds use
(its vectors reproduce a snapshot's; perturbed rows are deterministic and shaped like real ones)."""

import gzip
import json
import shutil
import subprocess

import numpy as np
import pytest

from bench.harness import read_result
from tests.helpers import SAMPLE

MARK = "SHOULD NOT APPEAR"
LINKED = "linked manual page"
ROLE = "tarfile.open"


def _man_available() -> bool:
    if shutil.which("man") is None:
        return False
    return subprocess.run(["man", "--version"], capture_output=True).returncode == 0


def _doc_tree(root):
    """The sample corpus's passages spread over the kinds of files /usr/share/doc holds (and a few it skips)."""
    rows = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").read_text().splitlines()]
    q = len(rows) // 4
    doc, man = root / "doc", root / "man"
    (doc / "pkg-a").mkdir(parents=True)
    (doc / "pkg-a" / "README.md").write_text("# Package A\n\n" + "\n\n".join(r["text"] for r in rows[:q])
                                             + f"\n\nSee [the {LINKED}](https://{MARK.replace(' ', '-')}.example) "
                                             + " ".join(rows[0]["text"].split()[:40]) + "\n")
    with gzip.open(doc / "pkg-a" / "manual.rst.gz", "wt") as f:  # gzipped, as Debian ships most of its docs
        f.write("Manual\n======\n\n" + f"Call :func:`{ROLE}` first. " + " ".join(rows[1]["text"].split()[:40]))
    (doc / "pkg-a" / "logo.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" * 20)  # binary: unreadable, counted
    (doc / "pkg-a" / "notes.txt").write_text("Notes\n=====\n\n" + "\n\n".join(r["text"] for r in rows[q:2 * q]))
    (doc / "pkg-a" / "copyright").write_text(MARK + " licence text " * 50)
    (doc / "pkg-b").mkdir()
    body = "".join(f"<p>{r['text']}</p>" for r in rows[2 * q:3 * q])
    (doc / "pkg-b" / "guide.html").write_text(f"<html><head><title>Guide B</title><style>{MARK}</style></head>"
                                              f"<body><script>{MARK}</script>{body}</body></html>")
    sphinx = doc / "pkg-c" / "html"
    (sphinx / "_sources").mkdir(parents=True)
    (sphinx / "_sources" / "intro.rst.txt").write_text(
        "Intro\n-----\n\n.. note::\n\n" + "\n\n".join(r["text"] for r in rows[3 * q:]))
    (sphinx / "intro.html").write_text(f"<html><body><p>{MARK} " * 40 + "</p></body></html>")
    (man / "man1").mkdir(parents=True)
    (man / "man1" / "sample.1").write_text(
        ".TH SAMPLE 1\n.SH NAME\nsample \\- a sample page\n.SH DESCRIPTION\n"
        + "\n.PP\n".join(r["text"] for r in rows[:q]) + "\n")
    return doc, man


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    from bench.scale_corpus import main

    root = tmp_path_factory.mktemp("scale")
    doc, man = _doc_tree(root)
    out = root / "corpus"
    assert main(["--out", str(out), "--doc-root", str(doc), "--man-root", str(man), "--sizes", "40,1000",
                 "--min-words", "30", "--max-words", "60", "--any-package", "--workers", "1"]) == 0
    return out


def test_scale_corpus_smoke(corpus_dir, tmp_path):
    from bench.scale_corpus import ensure_corpus

    stats = json.loads((corpus_dir / "pool-stats.json").read_text())
    assert stats["passages"] > 20 and set(stats["by_source"]) >= {"doc"}
    if _man_available():
        assert stats["by_source"].get("man", 0) > 0
    pool = (corpus_dir / "pool.jsonl").read_text()
    assert MARK not in pool  # licences, scripts, styles and a Sphinx tree's rendered pages are skipped
    # read by the product's readers (markdown-it-py, the rst rules): a link's text without its target, a role's
    # text without its markup, a gzipped file read; a binary file counted with its reason, not read
    assert f"the {LINKED}" in pool and "https://" not in pool and "](" not in pool
    assert f"Call {ROLE} first." in pool and ":func:" not in pool
    assert stats["files"]["unreadable"] == {"binary content (NUL bytes)": 1}
    rows = [json.loads(line) for line in pool.splitlines()]
    assert len({r["_id"] for r in rows}) == len(rows)  # deduplicated
    assert all(18 <= len(r["text"].split()) <= 60 for r in rows)
    small = (corpus_dir / "corpus-40.jsonl").read_text().splitlines()
    big = (corpus_dir / "corpus-1000.jsonl").read_text().splitlines()
    assert len(small) == 40 and len(big) == 1000 and big[:40] == small  # nested
    meta = json.loads((corpus_dir / "corpus-1000.json").read_text())
    assert meta["real"] == stats["passages"] and meta["recombined"] == 1000 - stats["passages"] > 0
    assert json.loads(big[-1])["metadata"]["source"] == "recombined"
    again = tmp_path / "again"
    again.mkdir()
    for name in ("pool.jsonl", "pool-stats.json"):
        shutil.copy(corpus_dir / name, again / name)
    assert ensure_corpus(again, 1000)[0].read_text() == "\n".join(big) + "\n"  # deterministic for a seed


@pytest.mark.slow  # ~35 s: builds in child processes, spawned servers, loads, recall, rebuilds, two indexes served
def test_scale_bench_smoke(corpus_dir, tmp_path):
    from bench.scale import main

    out, plots = tmp_path / "scale.json", tmp_path / "plots"
    assert main(["--corpus-dir", str(corpus_dir), "--work", str(tmp_path / "work"), "--sizes", "40,120",
                 "--model-up-to", "40", "--dataset", str(SAMPLE), "--limit", "8", "--concurrency", "1,2",
                 "--duration", "0.5", "--warmup", "0.2", "--warmup-queries", "3", "--recall-queries", "5",
                 "--rebuild-writes", "4", "--keep-indexes", "--json", str(out), "--plots", str(plots)]) == 0
    entry = read_result(out, "scale")
    real, synth = entry["sizes"]["40"], entry["sizes"]["120"]
    assert real["vectors_mode"] == "model" and real["quality_valid"] and real["build"]["vectors"]["model"] == 40
    assert synth["vectors_mode"] == "perturbed" and not synth["quality_valid"]
    assert synth["build"]["vectors"]["synthesised"] > 0 and synth["build"]["embed_projected_s"] > 0
    for e in (real, synth):
        assert e["build"]["peak_rss_mib"] > 0 and e["build"]["chunks"] >= e["passages"]
        disk = e["disk"]
        assert sum(disk["parts"].values()) == disk["bytes"] == sum(disk["files"].values())
        assert all(disk["parts"][p] > 0 for p in ("tokens", "dense", "bm25", "text"))
        s = e["serving"]
        assert s["memory_mib"]["warm"]["rss"] > 0 and s["rss_per_passage_bytes"]["rss"] > 0
        for level in ("1", "2"):
            assert s["levels"][level]["n"] > 0 and s["levels"][level]["errors"] == {}
            assert {"bm25", "dense", "total"} <= set(s["levels"][level]["stage_ms"])
        assert 0 <= e["recall"]["recall"] <= 1 and e["recall"]["queries"] == 5
        assert 0 <= e["recall"]["in_domain"]["recall"] <= 1 and e["recall"]["in_domain"]["queries"] == 5
    assert "rss_above_smallest_per_passage_bytes" in synth["serving"] and "vs_smallest" in synth["serving"]
    for e in (real, synth):  # four documents edited: only their passages embedded, by the model, the rest reused
        r = e["rebuild"]
        assert r["writes"] == 4 and 4 <= r["embedded"] <= 8 and r["reused"] >= e["build"]["chunks"] - 8
        assert r["vectors"]["model"] == r["embedded"] and r["over_full_build"] > 0
    assert synth["rebuild"]["full_build_projected"] and not real["rebuild"]["full_build_projected"]
    # the kept indexes served alternately, two rounds: medians, ratios against the first, RSS above it per chunk
    small, large = tmp_path / "work" / "index-40", tmp_path / "work" / "index-120"
    assert main(["--corpus-dir", str(corpus_dir), "--serve-indexes", f"{small},{large}", "--rounds", "2",
                 "--dataset", str(SAMPLE), "--limit", "8", "--concurrency", "1", "--duration", "0.5",
                 "--warmup", "0.2", "--warmup-queries", "3", "--json", str(out)]) == 0
    served = read_result(out, "scale_serving")["indexes"]
    assert len(served[str(small)]["rounds"]) == 2 and served[str(large)]["vs_first"]["1"]["p50_ms"] > 0
    assert set(served[str(large)]["rss_above_first_per_chunk_bytes"]) == {"rss", "anon", "file"}
    # the kept indexes' dense stage at two ef_search values: exact search is exact whatever ef; a wider beam
    # finds at least as many of the exact neighbours on these few passages
    assert main(["--corpus-dir", str(corpus_dir), "--recall-indexes", f"{small},{large}", "--recall-ef", "8,256",
                 "--dataset", str(SAMPLE), "--recall-queries", "6", "--json", str(out)]) == 0
    swept = read_result(out, "scale_recall")["indexes"]
    for index in (small, large):
        rows = swept[str(index)]["by_ef_search"]
        assert set(rows) == {"8", "256"} and rows["256"]["ef_search"] == 256
        assert rows["256"]["recall"] == 1.0 and rows["256"]["in_domain"]["queries"] == 6
        assert rows["8"]["recall"] <= rows["256"]["recall"]
    # the kept indexes rebuilt after 3 edits each: only those embedded, each build's peaks and the growth between
    assert main(["--corpus-dir", str(corpus_dir), "--work", str(tmp_path / "work"), "--rebuild-indexes",
                 f"{small},{large}", "--rebuild-writes", "3", "--json", str(out)]) == 0
    rebuilt = read_result(out, "scale_rebuild")["rebuilds"]
    assert set(rebuilt) == {"40", "120"} and "anon_growth_per_passage_bytes" in rebuilt["120"]
    assert set(rebuilt["120"]["held_growth_per_passage_bytes"]) == {"copy", "dense_index", "bm25"}
    for r in rebuilt.values():
        assert r["writes"] == 3 and 3 <= r["embedded"] <= 6 and r["peak_anon_mib"] > 0 and r["peak_file_mib"] >= 0
    pytest.importorskip("matplotlib")
    (png,) = plots.glob("scale-*.png")  # one per code version
    assert png.stat().st_size > 10_000


def test_scale_quality_smoke(corpus_dir, tmp_path, int8_index_dir):  # ~7 s: two builds, two evaluations
    from bench.scale import main

    out = tmp_path / "quality.json"
    assert main(["--quality", "--corpus-dir", str(corpus_dir), "--work", str(tmp_path / "work"),
                 "--vectors-dir", str(tmp_path / "vectors"), "--dataset", str(SAMPLE), "--distractors", "30",
                 "--seed-index", str(int8_index_dir), "--json", str(out)]) == 0
    entry = read_result(out, "scale_quality")
    assert entry["alone"]["build"]["vectors"]["model"] == 0  # every sample passage from the seeded cache
    assert entry["with_distractors"]["build"]["vectors"]["model"] == 30  # the distractors, embedded once
    assert entry["with_distractors"]["build"]["documents"] == entry["alone"]["build"]["documents"] + 30
    assert {"bm25", "dense", "fused"} <= set(entry["ndcg@10_change"])
    assert entry["alone"]["stages"]["fused"]["ndcg@10"] > 0.5


def test_vector_cache_reproduces_a_snapshot(int8_index_dir, sample_index_dir, embedder, config, tmp_path):
    """A build from the cache seeded with a snapshot's vectors makes no model call and the same dense vectors."""
    from bench.harness.vectors import CachedEmbedder, VectorCache, model_identity, seed_cache_from_snapshot
    from index_builder.build.builder import build_snapshot
    from index_builder.documents.corpus import read_corpus
    from index_builder.snapshot.format import load_snapshot

    cache = VectorCache(tmp_path / "vectors", model_identity(embedder))
    original = load_snapshot(int8_index_dir, checksums=False)
    assert seed_cache_from_snapshot(cache, int8_index_dir, embedder) == len(original.chunks)
    with pytest.raises(ValueError, match="cannot seed a cache"):  # the default compact store has no per-token rows
        seed_cache_from_snapshot(cache, sample_index_dir, embedder)
    cached = CachedEmbedder(embedder, [cache])
    docs, _ = read_corpus(SAMPLE / "corpus.jsonl")
    build_snapshot(docs, tmp_path / "index", config.build_config(), embedder=cached)
    assert cached.stats()["model"] == 0 and cached.stats()["cached"] == len(original.chunks)
    rebuilt = load_snapshot(tmp_path / "index", checksums=False)
    np.testing.assert_array_equal(np.asarray(rebuilt.vectors), np.asarray(original.vectors))
    with pytest.raises(ValueError, match="another model"):
        VectorCache(tmp_path / "vectors", {**model_identity(embedder), "dim": 1})


def test_perturbed_rows_are_deterministic_and_shaped_like_real_ones(embedder, tmp_path):
    from bench.harness.vectors import PerturbedEmbedder, RecordingEmbedder, VectorCache, model_identity

    cache = VectorCache(tmp_path / "vectors", model_identity(embedder))
    real = ["bees dance to tell the hive where flowers are", "venus is hotter than mercury because of its air"]
    RecordingEmbedder(embedder, cache).encode(real)
    cache.flush()
    assert len(cache) == 2
    texts = ["a passage no model has seen, of a dozen words or so", real[0]]
    a = PerturbedEmbedder(embedder, [cache], cache).encode(texts, with_tokens=True)
    b = PerturbedEmbedder(embedder, [cache], cache).encode(texts, with_tokens=True)
    np.testing.assert_array_equal(a.embeddings, b.embeddings)
    np.testing.assert_allclose(np.linalg.norm(a.embeddings, axis=1), 1.0, atol=1e-5)
    pieces = len(embedder.model.tokenize([texts[0]])[0].ids) - 2
    assert a.token_vectors[0].shape == (pieces, embedder.dim) and a.token_vectors[0].dtype == np.float16
    base = [cache.get(k)[0] for k in cache.index]
    assert 0.8 < max(float(a.embeddings[0] @ v) for v in base) < 0.98  # a perturbation of a real row
    exact = embedder.encode([real[0]]).embeddings[0]
    assert float(a.embeddings[1] @ exact) > 0.9999  # a cached passage keeps its real vector
