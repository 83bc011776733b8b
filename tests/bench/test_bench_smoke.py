"""Keep the benchmarks alive: a tiny run of each on the sample corpus (figures come from full runs, not here; no
timing is asserted). One test per script of ``bench.SCRIPTS`` (the studies' are in test_studies_smoke.py);
tests/bench/test_inventory.py checks that none is missing."""

import json
import shutil

import pytest

from bench.harness import read_result
from tests.helpers import CE_MODEL, REPO

SAMPLE = REPO / "data" / "sample"


def test_bm25_speed_smoke(tmp_path):
    pytest.importorskip("rank_bm25")
    from bench.bm25_speed import main

    out = tmp_path / "bench.json"
    assert main(["--dataset", str(SAMPLE), "--limit", "10", "--repeats", "1", "--json", str(out)]) == 0
    entry = read_result(out, "bm25_speed")
    assert entry["queries"] == 10 and entry["bm25s"]["qps"] > 0 and entry["rank_bm25"]["qps"] > 0
    assert "qps_ratio" in entry and entry["peak_rss_mib"]["self"] > 0
    assert abs(entry["bm25s"]["ndcg@10"] - entry["rank_bm25"]["ndcg@10"]) < 0.2  # same analysis, same k1/b


def test_batching_bench_smoke(tmp_path, sample_index_dir):
    from bench.batching import main

    out = tmp_path / "bench.json"
    assert main(["--index", str(sample_index_dir), "--dataset", str(SAMPLE), "--concurrency", "1,4",
                 "--duration", "0.5", "--rounds", "1", "--limit", "8", "--json", str(out)]) == 0
    entry = read_result(out, "batching")
    for level in ("1", "4"):
        r = entry["levels"][level]
        assert r["off"]["requests"] > 0 and r["on"]["requests"] > 0 and r["on"]["errors"] == 0
        assert r["off"]["mean_batch_size"]["embed"] == 1.0 and "qps_ratio" in r  # off: one call per request
        assert len(r["rounds"]["window"]) == 1


def test_floor_smoke(tmp_path, sample_index_dir):
    from bench.floor import main

    out = tmp_path / "bench.json"
    assert main(["--index", str(sample_index_dir), "--dataset", str(SAMPLE), "--queries", "6", "--json", str(out)]) == 0
    entry = read_result(out, "floor")
    assert entry["floor_ms"] > 0 and entry["throughput_floor_qps"] > 0 and {"bm25", "dense"} <= set(entry["stage_p50_ms"])


def test_observability_bench_smoke(tmp_path, sample_index_dir):
    from bench.observability import main

    out = tmp_path / "bench.json"
    assert main(["--index", str(sample_index_dir), "--dataset", str(SAMPLE), "--limit", "4", "--rounds", "1",
                 "--json", str(out)]) == 0
    entry = read_result(out, "observability")
    assert entry["off"]["n"] == entry["on"]["n"] == 4 and entry["spans_exported"] > 0
    assert entry["instrumentation_us_per_request"] > 0


def test_live_bench_smoke(tmp_path):  # ~12 s on two idle cores (18 s busy): three small snapshots, a rebuild
    """Every part on 40 documents (three small snapshots, a rebuild, writes); the rebuild not niced, so that a busy
    machine does not starve it (its priority is the full run's concern)."""
    from bench.live import main

    config = tmp_path / "live.toml"
    config.write_text("[live]\nrebuild_nice = 0\n")
    out = tmp_path / "bench.json"
    assert main(["--corpus", str(SAMPLE), "--docs", "40", "--parts", "rebuild,writes,buffer,memory",
                 "--concurrency", "1", "--duration", "0.5", "--batch", "2", "--levels", "0,4", "--samples", "2",
                 "--rss-writes", "6", "--readers", "1", "--config", str(config), "--json", str(out)]) == 0
    entry = read_result(out, "live")
    assert entry["idle"]["n"] > 0 and entry["during_rebuild"]["n"] > 0 and "p99_ratio" in entry
    assert entry["writes"]["batch_1"]["docs_per_s"] > 0 and entry["writes"]["batch_2"]["ack_visible"]["n"] > 0
    assert [r["buffered"] for r in entry["upsert_latency"]] == [0, 4] and entry["upsert_latency"][1]["n"] == 2
    m = entry["memory"]
    assert m["writes"] == 6 and m["buffered"] >= 6 and m["rss_peak_mib"] >= m["rss_before_mib"] > 0


@pytest.mark.slow  # ~25 s: three servers, each with the embedded llama.cpp server
def test_generate_bench_smoke(tmp_path, sample_index_dir):
    from bench.generate import main

    out = tmp_path / "bench.json"
    assert main(["--dataset", str(SAMPLE), "--index", str(sample_index_dir), "--queries", "2",
                 "--top-k", "1", "--max-tokens", "4", "--warmup", "1", "--log-sources", "3", "--generate-log-sources",
                 "2", "--load-seconds", "0.5", "--streams", "1", "--threads", "2", "--no-nice-compare", "--json",
                 str(out)]) == 0
    entry = read_result(out, "generate")
    assert entry["generate"]["client_first_token"]["n"] == 2 and entry["generate"]["tokens_out_mean"] > 0
    cache = entry["cache"]
    assert cache["retrieve_cached"]["repeat"]["hit_rate"] == 1.0 and cache["retrieve_uncached"]["all"]["hit_rate"] == 0
    assert cache["generate_cached"]["repeat"]["hit_rate"] == 1.0
    assert entry["retrieve_under_generate"]["nice_10"]["n"] > 0 and entry["cache_overhead"]["hit"]["n"] > 0


def test_load_bench_smoke(tmp_path, sample_index_dir):
    """Spawned server, two closed-loop levels, one open-loop rate: every figure present, nothing refused."""
    from bench.load import main

    out, plots = tmp_path / "bench.json", tmp_path / "plots"
    assert main(["--index", str(sample_index_dir), "--dataset", str(SAMPLE), "--concurrency", "1,2",
                 "--duration", "1", "--warmup", "0.5", "--calibration-seconds", "0.5", "--open-loop-rates", "5",
                 "--transports", "grpc,http", "--floor-queries", "8", "--quality-queries", "5", "--no-baseline",
                 "--json", str(out), "--plots", str(plots)]) == 0
    entry = read_result(out, "load")
    assert entry["server"]["documents"] == 229 and entry["peak_rss_mib"]["children"] > 0
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
    assert entry["ndcg@10"]["service_first_n"]["queries"] == 5
    o = entry["open_loop"]["5"]
    assert o["sent"] == 5 and sum(o["status"].values()) == 5 and o["max_outstanding"] >= 1  # 5/s for 1 s, fixed
    for name in ("load_sample.png", "load_sample_open.png"):
        assert (plots / name).stat().st_size > 0


def test_load_bench_open_loop_rejects_past_max_in_flight(tmp_path, sample_index_dir):
    """A server admitting one request at a time, offered far more: some refused (RESOURCE_EXHAUSTED), some served;
    and through ``hybridrag bench load`` (the CLI's wiring)."""
    from hybridrag.cli import main

    config = tmp_path / "one.toml"
    config.write_text("[server]\nmax_in_flight = 1\n")
    out = tmp_path / "bench.json"
    assert main(["bench", "load", "--index", str(sample_index_dir), "--config", str(config), "--dataset", str(SAMPLE),
                 "--concurrency", "", "--duration", "1", "--warmup", "0.3", "--open-loop-rates", "150",
                 "--floor-queries", "0", "--no-baseline", "--json", str(out)]) == 0
    entry = read_result(out, "load")
    status = entry["open_loop"]["150"]["status"]
    assert status.get("RESOURCE_EXHAUSTED", 0) > 0 and status.get("OK", 0) > 0
    assert entry["open_loop"]["150"]["rejected_p50_ms"] is not None


def test_cascade_load_smoke(tmp_path, sample_index_dir):
    """Two configurations one after the other, the second's levels as ratios of the first's."""
    from bench.cascade_load import main

    no_li = tmp_path / "no-li.toml"
    no_li.write_text("[rerank]\nlate_interaction = false\n")
    out = tmp_path / "bench.json"
    assert main(["--index", str(sample_index_dir), "--dataset", str(SAMPLE), "--config", "default=",
                 "--config", f"fused={no_li}", "--concurrency", "1", "--duration", "0.5", "--warmup", "0.3",
                 "--floor-queries", "4", "--calibration-seconds", "0", "--json", str(out)]) == 0
    entry = read_result(out, "cascade_load")
    runs = entry["runs"]
    assert entry["reference"] == "default" and set(runs) == {"default", "fused"}
    assert runs["default"]["vs_reference"]["1"]["p50_ratio"] == 1.0 and runs["fused"]["vs_reference"]["1"]["qps_ratio"] > 0
    assert runs["fused"]["floor"]["floor_ms"] > 0 and "late_interaction" not in runs["fused"]["floor"]["stage_p50_ms"]


def test_backends_bench_smoke(tmp_path, sample_index_dir):
    """The backends side by side (local and the in-process Qdrant engine), one short level each, and the
    shared cache's lookups when redis-server is installed."""
    from bench.backends import main

    out = tmp_path / "backends.json"
    assert main(["--index", str(sample_index_dir), "--dataset", str(SAMPLE), "--concurrency", "1",
                 "--duration", "1", "--warmup", "0.5", "--quality-queries", "5", "--backends", "local,qdrant-in-process",
                 "--redis", shutil.which("redis-server") or "", "--json", str(out)]) == 0
    result = read_result(out, "backends")
    local, engine = result["backends"]["local"], result["backends"]["qdrant-in-process"]
    assert local["levels"]["1"]["ok"] > 0 and engine["levels"]["1"]["ok"] > 0
    assert engine["vs_reference"]["1"]["p50_ratio"] > 0 and abs(local["ndcg@10"] - engine["ndcg@10"]) < 0.05
    if shutil.which("redis-server"):
        assert result["shared_cache_lookup"]["stream_local_matrix"]["p50_ms"] > 0


def test_burst_bench_smoke(tmp_path, sample_index_dir):
    """Both clients, both paths: the Python client direct to a server admitting 2 (refusals counted), and, where
    nginx and h2load are installed, h2load through the front at 2 (its refusals told apart by their HTTP 204)."""
    from bench.burst import main

    out = tmp_path / "burst.json"
    config = tmp_path / "two.toml"
    config.write_text("[server]\nmax_in_flight = 2\n")
    assert main(["--index", str(sample_index_dir), "--config", str(config), "--dataset", str(SAMPLE),
                 "--calls", "24", "--bursts", "1", "--pause-s", "0", "--json", str(out)]) == 0
    entry = read_result(out, "burst_sample")
    assert entry["refused_from_burst_start"]["n"] > 0 and sum(entry["admitted_per_burst"]) >= 2
    if not (shutil.which("h2load") and (shutil.which("nginx") or shutil.which("/usr/sbin/nginx"))):
        pytest.skip("h2load or nginx is not installed (scripts/setup.sh installs nghttp2-client and nginx-light)")
    out = tmp_path / "burst-front.json"
    assert main(["--index", str(sample_index_dir), "--dataset", str(SAMPLE), "--calls", "24",
                 "--bursts", "1", "--pause-s", "0", "--client", "h2load", "--front", "2", "--json", str(out)]) == 0
    entry = read_result(out, "burst_sample")
    assert entry["client"] == "h2load" and entry["all_from_burst_start"]["n"] == 24
    assert 0 < entry["refused_by_front_from_burst_start"]["n"] < 24 and entry["passed_from_burst_start"]["n"] >= 2


@pytest.mark.skipif(not (CE_MODEL / "model.onnx").is_file(), reason="../shared/models/ce-minilm-l6-beir-train is absent")
def test_gpu_check_on_the_cpu_falls_back_and_times_each_role(tmp_path):
    """A session asked for TensorRT then CUDA falls back to what this build has instead of failing; each role is
    timed per batch size (fp32 models: fp16 ones on the CPU provider run through casts, slowly)."""
    from bench.gpu_check import main

    out = tmp_path / "gpu.json"
    assert main(["--embedder", "", "--cross-encoder", str(CE_MODEL), "--providers",
                 "CPUExecutionProvider,NoSuchExecutionProvider", "--repeats", "2", "--ce-requests", "2",
                 "--batches", "1,2", "--json", str(out)]) == 0
    entry = read_result(out, "gpu_check")
    fallback = entry["fallback"]
    assert fallback["ok"] is True and "CPUExecutionProvider" in fallback["runs_on"], fallback
    assert [r["provider"] for r in entry["roles"]] == ["CPUExecutionProvider"]  # the unknown one is skipped
    role = entry["roles"][0]
    for key in ("query_encoding_ms", "query_encoding_batch2_per_item_ms", "ce_top5_whole_ms", "ce_top5_window48_ms",
                "ce_10pairs_per_pair_ms"):
        assert role[key] > 0, key
    for scaling in ("query_encoding_scaling", "cross_encoder_scaling"):
        assert set(role[scaling]["items_per_s"]) == {"1", "2"} and role[scaling]["gain_largest_vs_1"] > 0


def test_gpu_run_script_names_real_steps():
    """bench/gpu_run.sh (run on a lent GPU, not here): valid bash, and every module and config it names exists."""
    import re
    import subprocess

    script = REPO / "bench" / "gpu_run.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for module in set(re.findall(r"-m (bench\.[\w.]+)", text)):
        assert (REPO / (module.replace(".", "/") + ".py")).is_file(), module
    for config in set(re.findall(r"(bench/configs/[\w.-]+\.toml)", text)):
        assert (REPO / config).is_file(), config


def test_build_bench_smoke(tmp_path):
    from bench.build import main

    out = tmp_path / "build.json"
    assert main(["--corpus", str(SAMPLE), "--limit", "40", "--changed", "3", "--json", str(out)]) == 0
    entry = read_result(out, "build")
    enc, build, rebuild = entry["encoder"], entry["build"], entry["rebuild"]
    assert enc["passages"] == build["chunks"] and build["embedded"] == build["chunks"] > 40
    assert 0 < entry["build_over_encoder"] and build["peak_rss_mib"] > 0
    assert 0 < rebuild["embedded"] < build["chunks"] / 4 and rebuild["reused"] > 0  # only the edited passages
    assert 0 < entry["rebuild_over_build"]


@pytest.mark.slow  # ~25 s: starts a local Ray cluster
def test_ray_build_bench_smoke(tmp_path):
    pytest.importorskip("ray", reason="the ray extra (setup.sh --ray) is not installed")
    from bench.ray_build import main

    out = tmp_path / "ray-build.json"
    assert main(["--corpus", str(SAMPLE), "--limit", "30", "--workers", "1", "--embed-batch", "16",
                 "--json", str(out)]) == 0
    entry = read_result(out, "ray_build")
    floor, local, one = entry["encoder"], entry["local"], entry["ray"]["1"]
    assert floor["passages"] == local["chunks"] == one["chunks"] > 30
    assert one["passages_per_s"] > 0 and one["x_local"] > 0 and one["x_first"] == 1.0


def test_folder_bench_smoke(tmp_path):
    """The folder bench on a tiny folder of the sample corpus's passages as files (the questions name two)."""
    from bench.folder import main

    rows = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    root = tmp_path / "root"
    for i, r in enumerate(rows[:12]):
        kind = ("md", "txt", "html")[i % 3]
        path = root / r["metadata"]["topic"] / f"{r['_id']}.{kind}"
        path.parent.mkdir(parents=True, exist_ok=True)
        body = (r["text"] + "\n\n") * 4  # over the bench's 1 KB floor for sampled files
        path.write_text(f"<h1>{r['title']}</h1><p>{body}</p>" if kind == "html" else f"# {r['title']}\n\n{body}",
                        encoding="utf-8")
    first, second = rows[0], rows[1]
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps({"doc_root": str(root), "questions": [
        {"id": "a", "file": f"{first['metadata']['topic']}/{first['_id']}.md", "question": first["title"],
         "answer": first["text"].split()[0]},
        {"id": "b", "file": f"{second['metadata']['topic']}/{second['_id']}.txt", "question": second["title"],
         "answer": second["text"].split()[0]}]}), encoding="utf-8")
    out = tmp_path / "folder.json"
    assert main(["--questions", str(questions), "--files", "10", "--changed", "2", "--json", str(out)]) == 0
    entry = read_result(out, "folder")
    assert entry["build"]["summary"]["added"] == 10 and entry["rerun_unchanged"]["embedded"] == 0
    assert entry["rerun_edited"]["summary"] == {"added": 2, "updated": 2, "deleted": 2, "unchanged": 6, "skipped": 0}
    assert entry["quality"]["questions"] == 2 and entry["quality"]["hit_at_3"] >= 1
    assert entry["sync"]["sync"]["summary"]["updated"] == 2 and entry["sync"]["edited_found"] == "2/2"
    assert entry["sync"]["sync_unchanged"]["summary"]["unchanged"] >= 8
