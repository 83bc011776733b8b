"""Training data pieces that need no torch (so they run in CI): neighbour support from the real first stage's
query embeddings on the sample corpus, the soft targets built from it, and the model card's loss line."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import SAMPLE, train_cross_encoder_cli
from training.cross_encoder import neighbor_support_summary, soft_targets
from training.data import find_neighbors, load_training_data, make_groups, mine


@pytest.fixture(scope="module")
def mined(sample_train, pipeline):
    data = load_training_data(sample_train, "train", dev_fraction=0.25, seed=3)
    mine(data, pipeline, depth=5, dev_depth=5, neighbors=2)
    return data


def test_neighbors_are_other_training_queries_by_similarity(mined):
    data = mined
    assert set(data.neighbors) == set(data.train)
    for qid, near in data.neighbors.items():
        others = {q for q, _ in near}
        assert len(near) == 2 and qid not in others and others <= set(data.train) and not others & set(data.dev)
        assert near[0][1] >= near[1][1] >= 0.0
    # identical vectors: the neighbour is the other query, never the query itself; weights are cosine ** power
    assert find_neighbors(["a", "b"], np.eye(2, dtype=np.float32)[[0, 0]], 1) == {"a": [("b", 1.0)], "b": [("a", 1.0)]}
    v = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]], dtype=np.float32)
    near = find_neighbors(["x", "y", "z"], v, 2, power=2.0)["x"]
    assert [q for q, _ in near] == ["y", "z"] and near[0][1] == pytest.approx(0.36) and near[1][1] == 0.0
    assert find_neighbors(["x"], v[:1], 3) == {}


def test_support_is_the_weighted_share_of_neighbours_judging_a_document(mined):
    data = mined
    qid = next(q for q in sorted(data.train) if sum(w for _, w in data.neighbors[q]) > 0)
    (n1, w1), (n2, w2) = data.neighbors[qid]
    doc = data.positives(n1)[0]
    expected = (w1 + (w2 if doc in data.positives(n2) else 0.0)) / (w1 + w2)
    assert data.support(qid, doc) == pytest.approx(expected) and 0.0 < data.support(qid, doc) <= 1.0
    assert data.support("no-such-query", doc) == 0.0
    assert data.support(qid, "no-such-doc") == 0.0


def test_soft_targets_give_supported_negatives_part_of_the_mass(mined):
    data = mined
    groups = make_groups(data, hard=2, random_negatives=1, seed=0)
    lists = [[g.positive, *g.negatives] for g in groups]
    width = 4
    for mass, docs, g in zip(soft_targets(groups, lists, width, data, 0.5), lists, groups, strict=True):
        raw = [1.0] + [0.5 * data.support(g.qid, d) for d in docs[1:width]]
        assert sum(mass) == pytest.approx(1.0) and mass == pytest.approx([r / sum(raw) for r in raw])
    assert any(max(m[1:]) > 0 for m in soft_targets(groups, lists, width, data, 0.5)), \
        "the sample should have a negative that a neighbour judges relevant"
    summary = neighbor_support_summary(groups, data)
    negatives = [data.support(g.qid, d) for g in groups for d in g.negatives]
    assert summary["negatives_mean"] == pytest.approx(np.mean(negatives), abs=1e-4) and summary["negatives_mean"] > 0
    assert summary["negatives_supported"] == pytest.approx(np.mean([x > 0 for x in negatives]), abs=1e-4)
    assert summary["positives_mean"] == pytest.approx(np.mean([data.support(g.qid, g.positive) for g in groups]),
                                                      abs=1e-4)


def _train_sample_cross_encoder(tmp_path, sample_train, sample_index_dir, *extra: str) -> tuple[dict, str]:
    pytest.importorskip("torch")
    return train_cross_encoder_cli(tmp_path / "ce", sample_train, sample_index_dir, *extra)


@pytest.mark.slow  # a real hybridrag train cross-encoder run (mining, training, export)
def test_model_card_describes_the_soft_targets(tmp_path, sample_train, sample_index_dir):
    """The card of a real --neighbor-targets run names the targets, the support and the positives; without the
    targets the card says nothing of them."""
    from training.export import write_model_card

    summary, card = _train_sample_cross_encoder(tmp_path, sample_train, sample_index_dir, "--positives", "retrieved",
                                                "--neighbor-targets", "0.5")
    assert summary["config"]["neighbor_targets"] == 0.5 and summary["config"]["positives"] == "retrieved"
    support = summary["neighbor_support"]
    assert "soft targets" in card and "0.5 x its support among the" in card
    assert f"mean support {support['positives_mean']} for positives, {support['negatives_mean']} for negatives" in card
    assert "one per judged positive that the first stage retrieves" in card
    summary["config"]["neighbor_targets"] = 0.0
    write_model_card(tmp_path, kind="cross-encoder", dataset="sample", summary=summary, check=summary["onnx_check"],
                     command="hybridrag train cross-encoder ...")
    assert "soft targets" not in (tmp_path / "README.md").read_text()


@pytest.mark.slow  # a real hybridrag train cross-encoder run (mining, training, export)
def test_model_card_describes_pool_lists_and_the_residual_prior(tmp_path, sample_train, sample_index_dir):
    """The card of a real --lists 4 --prior-weight 1.0 run names the lists, their targets and the prior term;
    without the prior the term is gone."""
    from training.export import write_model_card

    summary, card = _train_sample_cross_encoder(tmp_path, sample_train, sample_index_dir, "--lists", "4",
                                                "--prior-weight", "1.0", "--neighbor-targets", "0.5")
    assert summary["config"]["lists"] == 4 and summary["config"]["prior_weight"] == 1.0
    assert f"{summary['groups']} pool lists: a query's fused top 4" in card and "2 lists a step" in card
    assert "spread evenly over its judged documents, each unjudged one 0.5 x its support" in card
    assert "1.0 x the z-scored fused position" in card and "hard (mined" not in card
    summary["config"]["prior_weight"] = 0.0
    write_model_card(tmp_path, kind="cross-encoder", dataset="sample", summary=summary, check=summary["onnx_check"],
                     command="hybridrag train cross-encoder ...")
    assert "fused position" not in (tmp_path / "README.md").read_text()


def test_bad_neighbour_settings_are_refused_before_mining(capsys):
    from hybridrag.cli import main

    base = ["train", "cross-encoder", "--dataset", str(SAMPLE), "--index", "/nonexistent-index", "--out", "/nonexistent"]
    assert main([*base, "--neighbor-targets", "-0.5"]) == 2
    assert "--neighbor-targets must be >= 0" in capsys.readouterr().err
    assert main([*base, "--neighbor-targets", "0.5", "--neighbors", "0"]) == 2
    assert "--neighbors must be >= 1" in capsys.readouterr().err
    assert main([*base, "--lists", "1"]) == 2
    assert "--lists must be 0 (groups) or a list length >= 2" in capsys.readouterr().err
    assert main([*base, "--prior-weight", "1.0"]) == 2
    assert "--prior-weight needs --lists N" in capsys.readouterr().err
    assert main([*base, "--lists", "20", "--mine-depth", "10"]) == 2
    assert "--lists 20 needs --mine-depth >= 20" in capsys.readouterr().err
    assert main([*base, "--lists", "10", "--mine-depth", "10", "--hard-negatives", "4", "--positives", "retrieved"]) == 2
    assert "--positives, --hard-negatives shape the groups, and --lists 10 trains on pool lists" in capsys.readouterr().err
