import json
from pathlib import Path

import pytest

from hybridrag.cli import main
from index_builder.errors import ConfigError
from retrieval.config import load_config
from tests.helpers import SAMPLE


def test_toml_env_and_overrides_layer_in_order(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[fusion]\nk = 20\nbm25_weight = 0.5\n[dense]\nef_search = 64\n")
    c = load_config(f, environ={"HYBRIDRAG_FUSION__K": "30"}, overrides={"dense": {"ef_search": 99}})
    assert (c.fusion.k, c.fusion.bm25_weight, c.dense.ef_search) == (30.0, 0.5, 99)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[fusion]\nkk = 1\n", "fusion: unknown key 'kk'; did you mean 'k'"),
        ("[fusion]\nk = -1\n", r"fusion\.k must be > 0, got -1\.0"),
        ("[rerank]\nli_score = 'token_z'\n", r"rerank\.li_score was removed: measured, not better"),
        ("[dense]\nef_search = 'many'\n", "dense.ef_search: expected int"),
        ("[fusion\n", "not valid TOML"),
    ],
)
def test_bad_config_is_refused_with_the_key_named(tmp_path, text, message):
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(f, environ={})


def test_cli_build_search_json_and_errors(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps({"_id": f"d{i}", "title": f"Doc {i}", "text": t, "tenant": "t1"})
                                for i, t in enumerate(["Solar panels convert sunlight into electricity.",
                                                       "Bread rises because yeast produces carbon dioxide.",
                                                       "The Nile is a long river in Africa."])) + "\n")
    assert main(["build", "--corpus", str(corpus), "--out", str(tmp_path / "idx"), "--quiet"]) == 0
    assert "3 documents, 3 chunks" in capsys.readouterr().out
    assert main(["search", "--index", str(tmp_path / "idx"), "--json", "-k", "1", "why does dough rise"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["hits"][0]["id"] == "d1" and result["hits"][0]["text"].startswith("Bread")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "a", "text": "ok"}\n{"_id": "a", "text": "again"}\n')
    assert main(["build", "--corpus", str(bad), "--out", str(tmp_path / "idx2")]) == 2
    assert f"{bad}:2: duplicate document id 'a'" in capsys.readouterr().err
    assert main(["search", "--index", str(tmp_path / "nothing"), "q"]) == 2
    assert "has no CURRENT" in capsys.readouterr().err


def test_quickstart_builds_searches_and_generates(tmp_path, capsys):
    """The README's main command, as written: the sample index, three answered queries, one generated answer from
    the embedded llama.cpp server."""
    assert main(["quickstart", "--out", str(tmp_path / "sample")]) == 0
    out = capsys.readouterr().out
    assert out.count("total") >= 3 and "astro-001" in out  # the light-year passage answers the first question
    generated = out.split("Generate: ", 1)[1]
    assert "embedded llama.cpp" in generated and "sources: astro-001" in generated
    assert "tokens in" in generated and "(no answer generated" not in out


def _eval_json(tmp_path, index_dir, name: str, li_weight: float = 1.0) -> Path:
    """A real `hybridrag eval --json` on the sample corpus (late interaction blended at ``li_weight``)."""
    config = tmp_path / f"{name}.toml"
    config.write_text(f"[rerank]\nli_weight = {li_weight}\nli_long_query_tokens = 0\n")
    out = tmp_path / f"{name}.json"
    assert main(["eval", "--dataset", str(SAMPLE), "--index", str(index_dir), "--rerank", "late_interaction",
                 "--config", str(config), "--json", str(out), "--quiet"]) == 0
    return out


def test_train_card_appends_measured_test_figures(tmp_path, sample_index_dir):
    """`hybridrag train card` (no torch needed) appends `hybridrag eval --json` figures to a model card."""
    measured = _eval_json(tmp_path, sample_index_dir, "alone")
    figures = json.loads(measured.read_text())["stages"]
    model = tmp_path / "model"
    model.mkdir()
    (model / "README.md").write_text("# a model\n")
    assert main(["train", "card", "--model", str(model), "--eval-json", str(measured)]) == 0
    card = (model / "README.md").read_text()
    assert card.startswith("# a model\n") and "## Test figures" in card
    delta = figures["late_interaction"]["ndcg@10"] - figures["fused"]["ndcg@10"]
    assert f"| sample | test | late_interaction | {figures['late_interaction']['ndcg@10']:.4f} |" in card
    assert f"{delta:+.4f}" in card


def test_train_card_names_the_blend_weight_and_lists_first_stages_once(tmp_path, sample_index_dir):
    """Two eval runs of one model (alone and blended at a dev-chosen weight): two labelled rows, not two
    identical-looking rows, and the shared first-stage rows once."""
    runs = [_eval_json(tmp_path, sample_index_dir, "alone"), _eval_json(tmp_path, sample_index_dir, "w07", 0.7)]
    alone, blended = (json.loads(r.read_text()) for r in runs)
    assert alone["config"]["rerank"]["li_weight"] == 1.0 and blended["config"]["rerank"]["li_weight"] == 0.7
    model = tmp_path / "model"
    model.mkdir()
    (model / "README.md").write_text("# a model\n")
    assert main(["train", "card", "--model", str(model), "--eval-json", *map(str, runs)]) == 0
    card = (model / "README.md").read_text()
    assert f"| sample | test | late_interaction | {alone['stages']['late_interaction']['ndcg@10']:.4f} |" in card
    li = blended["stages"]["late_interaction"]["ndcg@10"]
    assert f"| sample | test | late_interaction (li_weight 0.7) | {li:.4f} |" in card
    assert card.count("| sample | test | fused |") == 1 and card.count("| sample | test | bm25 |") == 1


def test_cli_migrate_and_search_on_the_qdrant_backend(tmp_path, capsys, sample_index_dir):
    """``migrate`` copies a built snapshot into the collection (``build --config`` with an engine backend ends the
    same way) and refuses an existing collection without ``--replace``; ``search`` serves from it."""
    cfg = tmp_path / "q.toml"
    cfg.write_text(f'[backend]\nkind = "qdrant"\nlocation = "{tmp_path / "engine"}"\ncollection = "sample"\n')
    assert main(["migrate", "--index", str(sample_index_dir), "--config", str(cfg)]) == 0
    assert "migrated 229 documents / 241 chunks" in capsys.readouterr().out
    assert main(["migrate", "--index", str(sample_index_dir), "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "collection 'sample' already exists" in err and "--replace" in err
    assert main(["migrate", "--index", str(sample_index_dir), "--config", str(cfg), "--replace"]) == 0
    capsys.readouterr()
    assert main(["search", "--index", str(sample_index_dir), "--config", str(cfg), "--json", "-k", "3",
                 "how do bees share where flowers are"]) == 0
    hits = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["hits"]
    assert hits[0]["id"] == "bio-012" and len(hits) == 3
    assert main(["serve", "--port", "0"]) == 2  # the local backend needs --index
    assert "give --index DIR" in capsys.readouterr().err
