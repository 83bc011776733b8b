"""Keep the tuning studies (bench/studies/) alive: a tiny run of each on the sample corpus."""

import json

import pytest

from bench.harness import read_result
from tests.helpers import CE_MODEL, REPO

SAMPLE = REPO / "data" / "sample"


def test_ood_study_writes_a_beir_folder_eval_takes(tmp_path):
    from bench.studies.ood import main
    from retrieval.evaluate import judged_queries

    out = tmp_path / "docq"
    assert main(["--dataset", str(SAMPLE), "--split", "test", "--out", str(out), "--max-queries", "5"]) == 0
    info = json.loads((out / "ood.json").read_text())
    queries, qrels = judged_queries(out, "test")
    assert info["kind"] == "doc-query" and info["queries"] == len(queries) == len(qrels) <= 5
    assert all(q not in rel for q, rel in qrels.items())  # a source document is never its own answer


def test_tune_fusion_smoke(tmp_path, sample_index_dir):
    from bench.studies.tune_fusion import K_GRID, W_GRID, main

    out = tmp_path / "fusion.json"
    assert main(["--set", f"{SAMPLE}:{sample_index_dir}:test", "--limit", "10", "--json", str(out)]) == 0
    entry = read_result(out, "tune_fusion")
    sample = entry["datasets"]["sample"]
    assert len(sample["fused_by_setting"]) == len(K_GRID) * len(W_GRID) and sample["queries"] == 10
    assert entry["chosen"]["k"] in K_GRID and 0 < sample["test"]["fused_chosen"] <= 1


def test_bm25_units_smoke(tmp_path):
    from bench.studies.bm25_units import main

    out = tmp_path / "units.json"
    assert main(["--dataset", str(SAMPLE), "--splits", "test", "--json", str(out)]) == 0
    entry = read_result(out, "bm25_units")
    assert set(entry) >= {"document, porter", "chunk 224/48, english", "config"}
    assert 0 < entry["document, porter"]["test"]["ndcg@10"] <= 1


@pytest.mark.skipif(not (CE_MODEL / "model.onnx").is_file(), reason="../shared/models/ce-minilm-l6-beir-train is absent")
def test_ce_levers_smoke(tmp_path, sample_index_dir):
    """The baseline, a window and one runtime lever (the old ce_latency's) on three queries."""
    from bench.studies.ce_levers import main

    out = tmp_path / "levers.json"
    assert main(["--dataset", str(SAMPLE), "--split", "test", "--index", str(sample_index_dir), "--model", str(CE_MODEL),
                 "--limit", "3", "--repeats", "1", "--only", "^(window48 fp32|full fp32 max_length 256)$",
                 "--json", str(out)]) == 0
    entry = read_result(out, "ce_levers_sample_test")
    variants = {r["variant"] for r in entry["rows"]}
    assert variants == {"no cross-encoder (the default cascade)", "full fp32", "window48 fp32",
                        "full fp32 max_length 256"}
    assert entry["queries"] == 3 and entry["same_head_order_as_full_fp32"]["window48 fp32"] <= 1
    assert all(r["ms_p50"] > 0 for r in entry["rows"] if r["variant"] != "no cross-encoder (the default cascade)")


def test_cascade_robustness_offline_figures_equal_the_served_ones(tmp_path, sample_index_dir):
    """bench.studies.cascade_robustness scores policies offline from stored arrays; a policy's figure must be what
    `hybridrag eval` serves with that policy configured (here li_weight 0.5, no gate, on the sample corpus)."""
    from bench.studies.cascade_robustness import main as robustness
    from hybridrag.cli import main as cli
    from retrieval.evaluate import build_ood_set

    build_ood_set(SAMPLE, "test", tmp_path / "docq")
    out = tmp_path / "rob.json"
    assert robustness(["--set", f"sample:tune:{SAMPLE}:{sample_index_dir}:test",
                       "--set", f"docq:tune:{tmp_path / 'docq'}:{sample_index_dir}:test",
                       "--set", f"sample-test:test:{SAMPLE}:{sample_index_dir}:test",
                       "--bm25-grid", "--json", str(out), "--per-query", str(tmp_path / "pq.json")]) == 0
    r = read_result(out, "cascade_robustness")
    assert set(r["normalised_minus_plain"].values()) == {0.0}  # the blend's z-scores absorb any per-query scale
    weights = {row["policy_label"]: row["ndcg"] for row in r["weights"]}
    config = tmp_path / "c.toml"
    config.write_text("[rerank]\nli_weight = 0.5\nli_long_query_tokens = 0\n")
    served = tmp_path / "served.json"
    assert cli(["eval", "--dataset", str(SAMPLE), "--index", str(sample_index_dir), "--rerank", "late_interaction",
                "--config", str(config), "--json", str(served), "--quiet"]) == 0
    stages = json.loads(served.read_text())["stages"]
    assert weights["li_weight=0.5"]["sample"] == pytest.approx(stages["late_interaction"]["ndcg@10"], abs=6e-5)
    assert r["sets"]["sample"]["fused"] == pytest.approx(stages["fused"]["ndcg@10"], abs=6e-5)
    assert len(r["bm25_grid"]) == 25 and r["length_class_selection"]["chosen"]["policy"]["kind"] == "gate"
    served_bm25 = next(g for g in r["bm25_grid"] if (g["k1"], g["b"]) == (0.9, 0.4))  # the build's own k1/b
    assert served_bm25["bm25"]["sample"] == pytest.approx(stages["bm25"]["ndcg@10"], abs=6e-5)


def test_token_codes_int8_row_is_what_an_int8_index_serves(tmp_path, int8_index_dir, sample_index_dir):
    """bench.studies.token_codes scores each codec as the served cascade does; its int8 row (the plain store) must be
    what `hybridrag eval` serves over the int8 index, every option gets bytes, nDCG and a timing, and an index
    already stored compact (the default) is refused: its vectors cannot be coded again."""
    from bench.studies.token_codes import main as token_codes
    from hybridrag.cli import main as cli
    from retrieval.evaluate import build_ood_set

    build_ood_set(SAMPLE, "test", tmp_path / "docq")
    out = tmp_path / "codes.json"
    assert token_codes(["--set", f"sample:tune:{SAMPLE}:{int8_index_dir}:test",
                        "--set", f"sample-docq:tune:{tmp_path / 'docq'}:{int8_index_dir}:test",
                        "--set", f"sample-test:test:{SAMPLE}:{int8_index_dir}:test",
                        "--options", "int4,bins,res2+k8,pool2+pca64+res1+k8", "--fit-passages", "60",
                        "--rounds", "1", "--timing-queries", "5", "--json", str(out)]) == 0
    r = read_result(out, "token_codes")
    served = tmp_path / "served.json"
    assert cli(["eval", "--dataset", str(SAMPLE), "--index", str(int8_index_dir), "--rerank", "late_interaction",
                "--json", str(served), "--quiet"]) == 0
    stages = json.loads(served.read_text())["stages"]
    assert r["sets"]["sample-test"]["int8"] == pytest.approx(stages["late_interaction"]["ndcg@10"], abs=6e-5)
    assert r["sets"]["sample-test"]["fused"] == pytest.approx(stages["fused"]["ndcg@10"], abs=6e-5)
    rows = {row["option"]: row for row in r["rows"]}
    assert set(rows) == {"int8", "int4", "bins", "res2+k8", "pool2+pca64+res1+k8"}
    assert rows["int8"]["bytes_per_token"] == 388 and rows["pool2+pca64+res1+k8"]["bytes_per_token"] == 9
    assert all(0 < v <= 1 for row in rows.values() for v in row["ndcg"].values())
    timing = next(iter(r["maxsim_timing"].values()))["rows"]
    assert set(timing) == set(rows) | {"int8 (served path)"} and all(t["p50_ms"] > 0 for t in timing.values())
    assert next(iter(r["indexes"].values()))["int8_recoded_identical"] is True
    assert r["chosen"] is None or r["chosen"]["option"] in rows
    with pytest.raises(SystemExit, match="stores its token vectors as pool3"):
        token_codes(["--set", f"sample:tune:{SAMPLE}:{sample_index_dir}:test", "--options", "int4",
                     "--json", str(tmp_path / "refused.json")])


def test_qdrant_tokens_study_scores_as_the_snapshot_in_qdrants_engine(tmp_path, sample_index_dir):
    """On Qdrant's own engine (Edge), the multivectors the backend stores (the compact store's vectors, float16,
    on disk) give the snapshot's MaxSim, and so its ranking, exactly; a quantized copy scored alone may not."""
    pytest.importorskip("qdrant_edge")
    from bench.studies.qdrant_tokens import main

    out = tmp_path / "qt.json"
    assert main(["--set", f"sample:test:{SAMPLE}:{sample_index_dir}:test", "--limit", "8", "--all-chunks",
                 "--work", str(tmp_path), "--json", str(out)]) == 0
    r = read_result(out, "qdrant_tokens")
    assert r["storage"] == "pool3+bins" and r["reranked"] > 0 and r["passages_stored"] > 0
    assert r["vectors_per_passage"] > 0 and set(r["forms"]) == {"ram-f32", "disk-f16", "disk-f16+bq",
                                                                "disk-f16+bq+rescore", "disk-f16+sq8"}
    for form in ("ram-f32", "disk-f16", "disk-f16+bq+rescore"):
        row = r["forms"][form]
        assert row["max_abs_score_diff"] < 1e-3 and row["same_top10"] == 1.0 and row["delta_vs_snapshot"] == 0
        assert row["ndcg"] == r["snapshot_ndcg"] and row["disk_bytes_per_passage"] > 0
    assert r["forms"]["disk-f16+bq"]["maxsim_ms"]["n"] == r["reranked"]


def test_bm25_build_memory_study_smoke(tmp_path):
    import json

    from bench.studies.bm25_build_memory import main

    corpus = tmp_path / "corpus.jsonl"
    with open(corpus, "w") as f:
        for line in (SAMPLE / "corpus.jsonl").read_text().splitlines():
            d = json.loads(line)
            f.write(json.dumps({"title": d.get("title", ""), "text": d["text"]}) + "\n")
    out = tmp_path / "mem.json"
    assert main(["--corpus", str(corpus), "--passages", "100", "--json", str(out)]) == 0
    entry = read_result(out, "bm25_build_memory")
    assert entry["passages"] == 100 and entry["postings"] > 1000
    assert entry["finish_peak_mib"] >= entry["held_mib"] > 0 and entry["matrix_mib"] > 0
    spilled = tmp_path / "spilled.json"  # the build's way: the postings on disk, the same matrix written
    assert main(["--corpus", str(corpus), "--passages", "100", "--spill", str(tmp_path / "scratch"),
                 "--json", str(spilled)]) == 0
    s = read_result(spilled, "bm25_build_memory")
    assert s["postings"] == entry["postings"] and s["matrix_mib"] == entry["matrix_mib"]
    assert s["held_mib"] < entry["held_mib"]


def test_highlights_bench_smoke(tmp_path):
    """Three questions over their man pages (skipped where man pages are not installed)."""
    import shutil
    import subprocess

    if shutil.which("man") is None or subprocess.run(["man", "-w", "tar"], capture_output=True).returncode != 0:
        pytest.skip("man pages are not installed")
    from bench.highlights import main

    out = tmp_path / "highlights.json"
    assert main(["--limit", "3", "--distractors", "2", "--repeats", "1", "--json", str(out)]) == 0
    entry = read_result(out, "highlights")
    assert entry["questions"] == 3 and 0 <= entry["hit_top3"] <= 1 and entry["latency"]["p50_ratio"] > 0
    assert entry["storage"] == "pool3+bins" and len(entry["per_question"]) == 3
