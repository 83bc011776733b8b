"""Keep the benchmark scripts alive: a tiny run of each on real data (figures come from full runs, not here)."""

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
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
