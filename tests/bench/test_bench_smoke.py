"""Keep the benchmark scripts alive: a tiny run of each on real data (figures come from full runs, not here)."""

import json

import pytest

from tests.helpers import CE_MODEL, REPO

SCIFACT = REPO.parent / "shared" / "data" / "beir" / "scifact"


@pytest.mark.skipif(not SCIFACT.exists(), reason="../shared/data/beir/scifact is absent")
def test_bm25_speed_smoke(tmp_path):
    pytest.importorskip("rank_bm25")
    from bench.bm25_speed import main

    out = tmp_path / "bench.json"
    assert main(["--dataset", str(SCIFACT), "--limit", "10", "--repeats", "1", "--json", str(out)]) == 0
    (entry,) = json.loads(out.read_text())["bm25_speed"].values()
    assert entry["queries"] == 10 and entry["bm25s"]["qps"] > 0 and entry["rank_bm25"]["qps"] > 0
    assert "qps_ratio" in entry  # no speed assertion in tests: the full run's figure is in the README
    assert abs(entry["bm25s"]["ndcg@10"] - entry["rank_bm25"]["ndcg@10"]) < 0.2  # same analysis, same k1/b


def test_batching_bench_smoke(tmp_path, sample_index_dir):
    from bench.batching import main

    out = tmp_path / "bench.json"
    sample = REPO / "data" / "sample"
    assert main(["--index", str(sample_index_dir), "--dataset", str(sample), "--concurrency", "1,4",
                 "--duration", "0.5", "--rounds", "1", "--limit", "8", "--json", str(out)]) == 0
    (entry,) = json.loads(out.read_text())["batching"].values()
    for level in ("1", "4"):
        r = entry["levels"][level]
        assert r["off"]["requests"] > 0 and r["on"]["requests"] > 0 and r["on"]["errors"] == 0
        assert r["off"]["mean_batch_size"]["embed"] == 1.0 and "qps_ratio" in r




@pytest.mark.skipif(not CE_MODEL.is_dir(), reason="../shared/models/ce-minilm-l6-beir-train is absent")
def test_ce_latency_bench_smoke(tmp_path, sample_index_dir):
    from bench.ce_latency import main

    out = tmp_path / "bench.json"
    assert main(["--dataset", str(REPO / "data" / "sample"), "--split", "test", "--index", str(sample_index_dir),
                 "--model", str(CE_MODEL), "--limit", "3", "--variants", "max_length 128", "--json", str(out)]) == 0
    (entry,) = json.loads(out.read_text())["ce_latency"].values()
    base = next(v for k, v in entry["variants"].items() if k.startswith("baseline"))
    assert base["same_top_k_as_baseline"] == 1.0 and entry["variants"]["max_length 128"]["p50_ms"] > 0


@pytest.mark.slow
def test_live_bench_smoke(tmp_path):
    from bench.live import main

    out = tmp_path / "bench.json"
    assert main(["--corpus", str(REPO / "data" / "sample"), "--docs", "40", "--concurrency", "2", "--duration", "0.5",
                 "--batch", "2", "--json", str(out)]) == 0
    (entry,) = json.loads(out.read_text())["live"].values()
    assert entry["idle"]["n"] > 0 and entry["during_rebuild"]["n"] > 0 and "p99_ratio" in entry
    assert entry["writes"]["batch_1"]["docs_per_s"] > 0 and entry["writes"]["batch_2"]["ack_visible"]["n"] > 0


@pytest.mark.slow  # ~15 s: starts the embedded llama.cpp server
def test_generate_bench_smoke(tmp_path, sample_index_dir):
    from bench.generate import main

    out = tmp_path / "bench.json"
    assert main(["--dataset", str(REPO / "data" / "sample"), "--index", str(sample_index_dir), "--queries", "2",
                 "--top-k", "1", "--max-tokens", "4", "--warmup", "1", "--log-sources", "3", "--generate-log-sources",
                 "2", "--load-seconds", "0.5", "--streams", "1", "--threads", "2", "--no-nice-compare", "--json",
                 str(out)]) == 0
    (entry,) = json.loads(out.read_text())["generate"].values()
    assert entry["generate"]["client_first_token"]["n"] == 2 and entry["generate"]["tokens_out_mean"] > 0
    cache = entry["cache"]
    assert cache["retrieve_cached"]["repeat"]["hit_rate"] == 1.0 and cache["retrieve_uncached"]["all"]["hit_rate"] == 0
    assert cache["generate_cached"]["repeat"]["hit_rate"] == 1.0
    assert entry["retrieve_under_generate"]["nice_10"]["n"] > 0


def test_load_bench_smoke(tmp_path, sample_index_dir):
    """Spawned server, two closed-loop levels, one open-loop rate: every figure present, nothing refused."""
    from bench.load import main

    out, plots = tmp_path / "bench.json", tmp_path / "plots"
    assert main(["--index", str(sample_index_dir), "--dataset", str(REPO / "data" / "sample"), "--concurrency", "1,2",
                 "--duration", "1", "--warmup", "0.5", "--calibration-seconds", "0.5", "--open-loop-rates", "5",
                 "--transports", "grpc,http", "--floor-queries", "8", "--no-baseline", "--json", str(out),
                 "--plots", str(plots)]) == 0
    (entry,) = json.loads(out.read_text())["load"].values()
    assert entry["server"]["documents"] == 229
    f = entry["floor"]  # the stages' own compute, measured before the server started
    assert f["floor_ms"] > 0 and {"query_encoding", "bm25", "dense", "fusion", "late_interaction"} <= set(f["stage_p50_ms"])
    assert f["throughput_floor_qps"] > 0 and entry["closed_loop"]["1"]["p50_over_floor"] > 0
    assert entry["closed_loop"]["2"]["qps_over_floor"] > 0
    for level in ("1", "2"):  # the HTTP door, measured at the same levels in the same run
        h = entry["closed_loop_http"][level]
        assert h["ok"] > 0 and h["errors"] == {} and {"bm25", "dense", "total"} <= set(h["stage_ms"])
        o = h["overhead_vs_grpc"]
        assert o["p50_ratio"] > 0 and o["qps_ratio"] > 0 and o["http_health_p50_ms"] > 0
    for level in ("1", "2"):
        r = entry["closed_loop"][level]
        assert r["ok"] > 0 and r["errors"] == {} and r["cache_hits"] == 0  # bypass_cache by default
        assert {"bm25", "dense", "total"} <= set(r["stage_ms"]) and r["client_ceiling_qps"] > 0
        assert r["client_cpu_util"] is not None and "client_headroom" in r
    assert entry["ndcg@10"]["service_all"]["ndcg@10"] > 0 and entry["ndcg@10"]["service_all"]["queries"] > 0
    o = entry["open_loop"]["5"]
    assert o["sent"] == 5 and sum(o["status"].values()) == 5 and o["max_outstanding"] >= 1  # 5/s for 1 s, fixed
    for name in ("load_sample.png", "load_sample_open.png"):
        assert (plots / name).stat().st_size > 0


def test_load_bench_open_loop_rejects_past_max_in_flight(tmp_path, sample_index_dir):
    """A server admitting one request at a time, offered far more: some refused (RESOURCE_EXHAUSTED), some served."""
    from bench.load import main

    config = tmp_path / "one.toml"
    config.write_text("[server]\nmax_in_flight = 1\n")
    out = tmp_path / "bench.json"
    assert main(["--index", str(sample_index_dir), "--config", str(config), "--dataset", str(REPO / "data" / "sample"),
                 "--concurrency", "", "--duration", "1", "--warmup", "0.3", "--open-loop-rates", "150",
                 "--no-baseline", "--json", str(out)]) == 0
    (entry,) = json.loads(out.read_text())["load"].values()
    status = entry["open_loop"]["150"]["status"]
    assert status.get("RESOURCE_EXHAUSTED", 0) > 0 and status.get("OK", 0) > 0
    assert entry["open_loop"]["150"]["rejected_p50_ms"] is not None


def test_cascade_robustness_offline_figures_equal_the_served_ones(tmp_path, sample_index_dir):
    """bench.cascade_robustness scores policies offline from stored arrays; a policy's figure must be what
    `hybridrag eval` serves with that policy configured (here li_weight 0.5, no gate, on the sample corpus)."""
    from bench.cascade_robustness import main as robustness
    from bench.ood import build as build_ood
    from hybridrag.cli import main as cli

    sample = REPO / "data" / "sample"
    build_ood(sample, "test", tmp_path / "docq")
    out = tmp_path / "rob.json"
    assert robustness(["--set", f"sample:tune:{sample}:{sample_index_dir}:test",
                       "--set", f"docq:tune:{tmp_path / 'docq'}:{sample_index_dir}:test",
                       "--set", f"sample-test:test:{sample}:{sample_index_dir}:test",
                       "--bm25-grid", "--json", str(out), "--per-query", str(tmp_path / "pq.json")]) == 0
    r = json.loads(out.read_text())
    assert set(r["normalised_minus_plain"].values()) == {0.0}  # the blend's z-scores absorb any per-query scale
    weights = {row["policy_label"]: row["ndcg"] for row in r["weights"]}
    config = tmp_path / "c.toml"
    config.write_text("[rerank]\nli_weight = 0.5\nli_long_query_tokens = 0\n")
    served = tmp_path / "served.json"
    assert cli(["eval", "--dataset", str(sample), "--index", str(sample_index_dir), "--rerank", "late_interaction",
                "--config", str(config), "--json", str(served), "--quiet"]) == 0
    stages = json.loads(served.read_text())["stages"]
    assert weights["li_weight=0.5"]["sample"] == pytest.approx(stages["late_interaction"]["ndcg@10"], abs=6e-5)
    assert r["sets"]["sample"]["fused"] == pytest.approx(stages["fused"]["ndcg@10"], abs=6e-5)
    assert len(r["bm25_grid"]) == 25 and r["length_class_selection"]["chosen"]["policy"]["kind"] == "gate"
    served_bm25 = next(g for g in r["bm25_grid"] if (g["k1"], g["b"]) == (0.9, 0.4))  # the build's own k1/b
    assert served_bm25["bm25"]["sample"] == pytest.approx(stages["bm25"]["ndcg@10"], abs=6e-5)


def test_backends_bench_smoke(tmp_path, sample_index_dir):
    """The backends side by side (local and the in-process Qdrant engine), one short level each, and the
    shared cache's lookups when redis-server is installed."""
    import shutil

    from bench.backends import main

    out = tmp_path / "backends.json"
    assert main(["--index", str(sample_index_dir), "--dataset", str(REPO / "data" / "sample"), "--concurrency", "1",
                 "--duration", "1", "--warmup", "0.5", "--quality-queries", "5", "--backends", "local,qdrant-in-process",
                 "--redis", shutil.which("redis-server") or "", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    local, engine = result["backends"]["local"], result["backends"]["qdrant-in-process"]
    assert local["levels"]["1"]["ok"] > 0 and engine["levels"]["1"]["ok"] > 0
    assert engine["levels"]["1"]["p50_vs_local"] > 0 and abs(local["ndcg@10"] - engine["ndcg@10"]) < 0.05
    if shutil.which("redis-server"):
        assert result["shared_cache_lookup"]["stream_local_matrix"]["p50_ms"] > 0


def test_burst_bench_smoke(tmp_path, sample_index_dir):
    """Both clients, both paths: the Python client direct to a server admitting 2 (refusals counted), and, where
    nginx and h2load are installed, h2load through the front at 2 (its refusals told apart by their HTTP 204)."""
    import shutil

    from bench.burst import main

    out = tmp_path / "burst.json"
    config = tmp_path / "two.toml"
    config.write_text("[server]\nmax_in_flight = 2\n")
    assert main(["--index", str(sample_index_dir), "--config", str(config), "--dataset", str(REPO / "data" / "sample"),
                 "--calls", "24", "--bursts", "1", "--pause-s", "0", "--json", str(out)]) == 0
    (entry,) = json.loads(out.read_text())["burst_sample"].values()
    assert entry["refused_from_burst_start"]["n"] > 0 and sum(entry["admitted_per_burst"]) >= 2
    if not (shutil.which("h2load") and (shutil.which("nginx") or shutil.which("/usr/sbin/nginx"))):
        pytest.skip("h2load or nginx is not installed (scripts/setup.sh installs nghttp2-client and nginx-light)")
    out = tmp_path / "burst-front.json"
    assert main(["--index", str(sample_index_dir), "--dataset", str(REPO / "data" / "sample"), "--calls", "24",
                 "--bursts", "1", "--pause-s", "0", "--client", "h2load", "--front", "2", "--json", str(out)]) == 0
    (entry,) = json.loads(out.read_text())["burst_sample"].values()
    assert entry["client"] == "h2load" and entry["all_from_burst_start"]["n"] == 24
    assert 0 < entry["refused_by_front_from_burst_start"]["n"] < 24 and entry["passed_from_burst_start"]["n"] >= 2
