"""Export a trained cross-encoder for serving: ``model.onnx`` (fp32) and ``int8/model.onnx`` (dynamic int8), each a
folder the cascade loads as it is (model.onnx + tokenizer.json), each checked against the torch model.

The check scores real pairs (the first dev queries with their candidates, padded into one batch, some cut at
``max_length``) with torch and with ONNX Runtime: fp32 must match within 1e-3 (max abs logit difference); for int8
the figures are reported (max abs difference, Pearson r and top-5 agreement with torch), not required: dynamic
int8 can lose ranking quality on some CPUs and models, which the model card then shows.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from index_builder.errors import ModelError

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
FP32_TOLERANCE = 1e-3


def export_cross_encoder(model, tokenizer, out: Path, check_pairs: Sequence[tuple[str, str]], max_length: int,
                         opset: int = 17) -> dict[str, Any]:
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    model.save_pretrained(str(out))  # config.json + weights: `--init <this folder>` continues training from it
    model = model.float().eval()

    class Logits(torch.nn.Module):
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits

    wrapper = Logits(model).eval()
    trace = tokenizer(["a short query", "another query"], ["a passage", "a somewhat longer passage to trace with"],
                      padding=True, return_tensors="pt")
    axes = {n: {0: "batch", 1: "sequence"} for n in INPUTS}
    axes["logits"] = {0: "batch"}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, tuple(trace[n] for n in INPUTS), str(out / "model.onnx"), input_names=list(INPUTS),
                          output_names=["logits"], dynamic_axes=axes, opset_version=opset, do_constant_folding=True,
                          dynamo=False)
    int8_dir = out / "int8"
    int8_dir.mkdir(exist_ok=True)
    quantize_dynamic(str(out / "model.onnx"), str(int8_dir / "model.onnx"), weight_type=QuantType.QInt8)
    for name in TOKENIZER_FILES + ("config.json",):
        if (out / name).is_file():
            shutil.copy2(out / name, int8_dir / name)

    queries, passages = [q for q, _ in check_pairs], [p for _, p in check_pairs]
    enc = tokenizer(queries, passages, truncation="only_second", max_length=max_length, padding=True, return_tensors="np")
    with torch.no_grad():
        ref = wrapper(*(torch.from_numpy(enc[n]) for n in INPUTS)).numpy()[:, 0]
    report: dict[str, Any] = {"check_pairs": len(check_pairs), "check_shape": list(enc["input_ids"].shape)}
    for name, path in (("fp32", out / "model.onnx"), ("int8", int8_dir / "model.onnx")):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = session.run(["logits"], {n: enc[n].astype(np.int64) for n in INPUTS})[0][:, 0]
        report[name] = {"max_abs_diff": float(np.abs(got - ref).max()),
                        "pearson": float(np.corrcoef(got, ref)[0, 1]) if len(ref) > 1 else 1.0,
                        "top5_same": sorted(np.argsort(-got)[:5].tolist()) == sorted(np.argsort(-ref)[:5].tolist()),
                        "bytes": path.stat().st_size}
    return _verdict(out, report)


def _verdict(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """fp32 must match torch within FP32_TOLERANCE; the report goes to ``onnx_check.json`` either way."""
    report["fp32"]["passed"] = report["fp32"]["max_abs_diff"] <= FP32_TOLERANCE
    (out / "onnx_check.json").write_text(json.dumps(report, indent=1) + "\n")
    if not report["fp32"]["passed"]:
        raise ModelError(f"the fp32 ONNX export differs from torch by {report['fp32']['max_abs_diff']:.2e} "
                         f"(> {FP32_TOLERANCE}); see {out / 'onnx_check.json'}")
    return report


def write_model_card(out: Path, *, kind: str, dataset: str, summary: dict[str, Any], check: dict[str, Any],
                     command: str) -> None:
    """README.md beside the model: data, negatives, loss, hyper-parameters, steps, wall time, dev figures (test
    figures are appended by ``hybridrag train card`` once ``hybridrag eval`` has measured them)."""
    cfg = summary["config"]
    best = summary["best"]
    li = kind == "late-interaction"
    per_step = (f"{cfg['queries_per_step']} queries" if li else
                f"{cfg['groups_per_step']} {'lists' if cfg.get('lists') else 'groups'}")
    in_batch = (", plus every other document of the step (in-batch)" if li else
                ", plus the other groups' positives in the step (in-batch)" if cfg.get("in_batch") else "")
    model_line = (f"- Model: BERT encoder + Linear(hidden -> {cfg['dim']}) + L2 norm, projection initialised by "
                  f"{cfg['projection_init']}; ColBERT markers, queries [MASK]-padded to {cfg['query_maxlen']} ids, "
                  f"documents cut at {cfg['doc_maxlen']} ids in training, {cfg['serve_doc_maxlen']} when served "
                  "(`colbert_config.json`)." if li else
                  f"- Model: sequence classification, one logit; pairs `[CLS] query [SEP] passage [SEP]` cut at "
                  f"{cfg['max_length']} ids.")
    lrs = (f"lr {cfg['lr']} (projection {cfg['projection_lr']})" if li else f"lr {cfg['lr']} (head {cfg['head_lr']})")
    if li:
        onnx = (f"- ONNX (checked through the serving encoder): `model.onnx` fp32, max abs difference to torch "
                f"{check['fp32']['max_abs_diff']:.2e}; `int8/model.onnx` dynamic int8, mean token cosine "
                f"{check['int8']['mean_cosine']:.4f} (min {check['int8']['min_cosine']:.3f}), MaxSim Pearson "
                f"{check['int8']['maxsim_pearson']:.4f} ({check['queries']} queries x {check['passages']} passages).")
    else:
        onnx = (f"- ONNX: `model.onnx` fp32 (max abs logit difference to torch {check['fp32']['max_abs_diff']:.2e}); "
                f"`int8/model.onnx` dynamic int8 (max abs difference {check['int8']['max_abs_diff']:.3f}, Pearson "
                f"{check['int8']['pearson']:.4f} with torch on {check['check_pairs']} pairs).")
    stage_weight = "[rerank] li_weight" if li else "[rerank] ce_weight"
    retrieved = " that the first stage retrieves" if cfg.get("positives") == "retrieved" else ""
    pool = bool(cfg.get("lists")) and not li
    if pool:
        soft = (f", each unjudged one {cfg['neighbor_targets']} x its support among the {cfg['neighbors']} nearest "
                "training queries" if cfg.get("neighbor_targets") else "")
        prior = (f" The logits in the loss carry {cfg['prior_weight']} x the z-scored fused position (trained as a "
                 "residual over the fused order)." if cfg.get("prior_weight") else "")
        loss_line = (f"- Loss: listwise softmax cross-entropy over each pool list, the target mass spread evenly over "
                     f"its judged documents{soft}, normalised per list.{prior}")
    elif cfg.get("neighbor_targets"):
        sup = summary.get("neighbor_support") or {}
        loss_line = (f"- Loss: listwise softmax cross-entropy with soft targets: the positive 1, each negative "
                     f"{cfg['neighbor_targets']} x its support among the {cfg['neighbors']} nearest training queries "
                     f"(similarity-weighted share judging it relevant), normalised per list; mean support "
                     f"{sup.get('positives_mean')} for positives, {sup.get('negatives_mean')} for negatives.")
    else:
        loss_line = "- Loss: listwise softmax cross-entropy (the positive's log-probability within its list)."
    serve = ('`[late_interaction] model = "<this folder>"`, then `hybridrag index tokens --index DIR --out NEW` '
             "recomputes the passages' token vectors (the dense side is kept)" if li else
             '`[cross_encoder] model = "<this folder>"` (or `<this folder>/int8`) and `[rerank] cross_encoder = true`')
    serve += f"; `{stage_weight} = {best.get('weight', 1.0)}` serves the blend that did best on dev"
    lines = [
        f"# {out.name}: a {kind} model trained by `hybridrag train`",
        "",
        f"Command: `{command}`",
        "",
        f"- Data: `{dataset}`; {summary['train_queries']} training queries ("
        + (f"{summary['groups']} pool lists: a query's fused top {cfg['lists']} when it holds judged and unjudged "
           "documents" if pool else f"{summary['groups']} groups: one per judged positive{retrieved}")
        + f"); dev: {summary['dev_queries']} queries, {summary['dev_source']}. The test split was not read "
        "for training or selection.",
        *_synthetic_line(Path(dataset), summary.get("split", "train")),
        ("- Negatives: the unjudged documents of each list (this project's served fused order over the corpus "
         "index)." if pool else
         f"- Negatives per group: {cfg['hard_negatives']} hard (mined with this project's BM25 and dense first stage "
         f"over the corpus index, judged-relevant documents excluded), {cfg['random_negatives']} random{in_batch}."),
        loss_line,
        model_line,
        f"- Initialised from `{summary['init']}`; {per_step} a step; AdamW {lrs}, weight decay "
        f"{cfg['weight_decay']}, {int(cfg['warmup'] * 100)}% warm-up then linear decay; seed {cfg['seed']}.",
        f"- Steps: {summary['steps_run']} of {summary['steps_planned']} planned (early stopping: patience "
        f"{cfg['patience']} evaluations every {cfg['eval_every']} steps); wall time {summary['wall_s']} s.",
        f"- Dev nDCG@10, reranking the fused top {cfg['rerank_top']}: {best['dev_ndcg@10']} at step {best['step']}, "
        f"the state kept (step 0: {summary['log'][0]['dev_ndcg@10']}; the fused list alone: "
        f"{summary['dev_fused_ndcg@10']}); blended with the fused order (`{stage_weight}`): "
        f"{best.get('dev_blended_ndcg@10')} at weight {best.get('weight', 1.0)}, the state's best.",
        onnx,
        "",
        f"Serve it: {serve}.",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))


def _synthetic_line(dataset: Path, split: str) -> list[str]:
    """The card's line on a dataset written by ``hybridrag train synth-queries`` (none for judged data)."""
    try:
        rep = json.loads((dataset / "synthetic.json").read_text())
    except (OSError, ValueError):
        return []
    which = (f"{rep['usable']} of {rep['documents']} documents, no filter (split `unfiltered`)" if split == "unfiltered"
             else f"{rep['kept']} kept of {rep['documents']} documents, kept when the first stage ranks the source "
                  f"document in its top {rep['config']['keep_top']}")
    return [f"- Queries: synthetic, no human judgment: {which}; written by {rep.get('generator') or 'an LLM'} "
            f"(`{dataset / 'synthetic.json'}`). In-domain, label-free."]


def _stage_label(name: str, rerank: dict[str, Any]) -> str:
    """A reranked stage's name with the blend weight it was served at, when it blends (< 1)."""
    keys = {"late_interaction": ("li_weight",), "cross_encoder": ("ce_weight",), "cascade": ("li_weight", "ce_weight")}
    blends = [f"{k} {rerank[k]}" for k in keys.get(name, ()) if rerank.get(k, 1.0) < 1.0]
    if "li_weight" in keys.get(name, ()):
        if rerank.get("li_long_query_tokens", 0):
            blends.append(f"li_long_weight {rerank.get('li_long_weight', 1.0)} over {rerank['li_long_query_tokens']} "
                          "tokens")
        if rerank.get("li_score", "maxsim") != "maxsim":
            blends.append(f"li_score {rerank['li_score']}")
    return f"{name} ({', '.join(blends)})" if blends else name


def append_test_figures(model: Path, evaluations: Sequence[dict[str, Any]]) -> str:
    """Append the test figures measured by ``hybridrag eval --json`` (one dict per run) to the model card."""
    lines = ["", "## Test figures (measured after selection with `hybridrag eval`; in-domain)", "",
             "| dataset | split | stage | nDCG@10 | Recall@100 | vs fused |", "|---|---|---|---|---|---|"]
    seen: set[str] = set()
    for ev in evaluations:
        stages = ev["stages"]
        fused = stages.get("fused", {}).get("ndcg@10")
        rerank = ev.get("config", {}).get("rerank", {})
        for name, st in stages.items():
            delta = f"{st['ndcg@10'] - fused:+.4f}" if fused is not None and name != "fused" else ""
            row = (f"| {Path(ev['dataset']).name} | {ev['split']} | {_stage_label(name, rerank)} | {st['ndcg@10']:.4f} | "
                   f"{st.get('recall@100', float('nan')):.4f} | {delta} |")
            if row not in seen:  # the first-stage rows of several runs over one index are the same
                seen.add(row)
                lines.append(row)
    text = "\n".join(lines) + "\n"
    with open(model / "README.md", "a", encoding="utf-8") as f:
        f.write(text)
    return text


def export_late_interaction(model, tokenizer, conv, out: Path, queries: Sequence[str], passages: Sequence[str],
                            doc_maxlen: int, opset: int = 17) -> dict[str, Any]:
    """``model.onnx`` (fp32, output ``token_embeddings``) and ``int8/model.onnx``, each with the tokenizer and
    ``colbert_config.json``; checked by loading each folder with the serving side's
    :class:`index_builder.models.token_encoders.ColbertEncoder` and comparing its query and passage vectors (and the
    MaxSim scores of every query against every passage) with torch's."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from index_builder.models.token_encoders import ColbertEncoder
    from index_builder.settings import TokenEncoderConfig
    from training.late_interaction import save_torch, write_conventions

    out.mkdir(parents=True, exist_ok=True)
    save_torch(out, model, torch)
    tokenizer.save_pretrained(str(out))
    model.bert.config.save_pretrained(str(out))
    write_conventions(out, conv, model.bert.config.hidden_size)
    model = model.float().eval()
    ids, mask = conv.query_ids([[2023, 2003]] * 2, conv.query_maxlen)
    trace = (torch.from_numpy(ids), torch.from_numpy(mask), torch.zeros_like(torch.from_numpy(ids)))
    axes = {n: {0: "batch", 1: "sequence"} for n in INPUTS}
    axes["token_embeddings"] = {0: "batch", 1: "sequence"}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, trace, str(out / "model.onnx"), input_names=list(INPUTS),
                          output_names=["token_embeddings"], dynamic_axes=axes, opset_version=opset,
                          do_constant_folding=True, dynamo=False)
    int8_dir = out / "int8"
    int8_dir.mkdir(exist_ok=True)
    quantize_dynamic(str(out / "model.onnx"), str(int8_dir / "model.onnx"), weight_type=QuantType.QInt8)
    for name in TOKENIZER_FILES + ("config.json", "colbert_config.json"):
        if (out / name).is_file():
            shutil.copy2(out / name, int8_dir / name)

    # torch reference, built with the same ids the serving side builds
    content = lambda texts: tokenizer(list(texts), add_special_tokens=False, truncation=False)["input_ids"]  # noqa: E731
    with torch.no_grad():
        qi, qm = conv.query_ids(content(queries), conv.query_maxlen)
        ref_q = model(torch.from_numpy(qi), torch.from_numpy(qm)).numpy()
        ref_d = []
        for text in passages:
            di, dm, keep = conv.doc_batch([conv.doc_row(content([text])[0], doc_maxlen)])
            ref_d.append(model(torch.from_numpy(di), torch.from_numpy(dm)).numpy()[0][keep[0]])
    ref_scores = np.array([[(q @ d.T).max(axis=1).sum() for d in ref_d] for q in ref_q])
    report: dict[str, Any] = {"queries": len(queries), "passages": len(passages), "doc_maxlen": doc_maxlen}
    for name, folder in (("fp32", out), ("int8", int8_dir)):
        enc = ColbertEncoder(TokenEncoderConfig(model=str(folder), doc_maxlen=doc_maxlen))
        got_q = np.stack(enc.encode_queries(list(queries)))
        got_d = [d.astype(np.float32) for d in enc.encode_documents(list(passages))]
        if any(g.shape != r.shape for g, r in zip(got_d, ref_d, strict=True)):
            raise ModelError(f"{name}: the serving side keeps different token positions than training")
        flat_got = np.concatenate([got_q.reshape(-1, got_q.shape[-1])] + got_d)
        flat_ref = np.concatenate([ref_q.reshape(-1, ref_q.shape[-1])] + ref_d)
        cos = (flat_got * flat_ref).sum(axis=1)
        scores = np.array([[(q @ d.T).max(axis=1).sum() for d in got_d] for q in got_q])
        report[name] = {"max_abs_diff": float(np.abs(flat_got - flat_ref).max()),
                        "mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()),
                        "maxsim_pearson": float(np.corrcoef(scores.ravel(), ref_scores.ravel())[0, 1]),
                        "maxsim_max_abs_diff": float(np.abs(scores - ref_scores).max()),
                        "bytes": (folder / "model.onnx").stat().st_size}
    # stored vectors are float16 / int8 on the serving side: 1e-3 on unit vectors is well inside that
    return _verdict(out, report)
