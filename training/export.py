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
    model.config.save_pretrained(str(out))
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
    report["fp32"]["passed"] = report["fp32"]["max_abs_diff"] <= FP32_TOLERANCE
    (out / "onnx_check.json").write_text(json.dumps(report, indent=1) + "\n")
    if not report["fp32"]["passed"]:
        raise ModelError(f"the fp32 ONNX export differs from torch by {report['fp32']['max_abs_diff']:.2e} "
                         f"(> {FP32_TOLERANCE}); see {out / 'onnx_check.json'}")
    return report


def write_model_card(out: Path, *, kind: str, dataset: str, summary: dict[str, Any], check: dict[str, Any],
                     command: str, evaluation: dict[str, Any] | None = None) -> None:
    """README.md beside the model: data, negatives, loss, hyper-parameters, steps, wall time, dev (and test) figures."""
    cfg = summary["config"]
    best = summary["best"]
    lines = [
        f"# {out.name}: a {kind} trained by `hybridrag train`",
        "",
        f"Command: `{command}`",
        "",
        f"- Data: `{dataset}`; {summary['train_queries']} training queries ({summary['groups']} groups: one per judged "
        f"positive); dev: {summary['dev_queries']} queries, {summary['dev_source']}. The test split was not read "
        "for training or selection.",
        f"- Negatives per group: {cfg['hard_negatives']} hard (mined with this project's BM25 and dense first stage "
        f"over the corpus index, judged-relevant documents excluded), {cfg['random_negatives']} random"
        + (", plus the other groups' positives in the step (in-batch)" if cfg.get("in_batch") else "") + ".",
        "- Loss: listwise softmax cross-entropy (the positive's log-probability within its group).",
        f"- Initialised from `{summary['init']}`; max length {cfg['max_length']}; {cfg['groups_per_step']} groups a "
        f"step; AdamW lr {cfg['lr']} (head {cfg['head_lr']}), weight decay {cfg['weight_decay']}, "
        f"{int(cfg['warmup'] * 100)}% warm-up then linear decay; seed {cfg['seed']}.",
        f"- Steps: {summary['steps_run']} of {summary['steps_planned']} planned (early stopping: patience "
        f"{cfg['patience']} evaluations every {cfg['eval_every']} steps); wall time {summary['wall_s']} s.",
        f"- Dev nDCG@10, reranking the fused top {cfg['rerank_top']}: best {best['dev_ndcg@10']} at step "
        f"{best['step']} (the fused list alone: {summary['dev_fused_ndcg@10']}).",
        f"- ONNX: `model.onnx` fp32 (max abs logit difference to torch {check['fp32']['max_abs_diff']:.2e}); "
        f"`int8/model.onnx` dynamic int8 (max abs difference {check['int8']['max_abs_diff']:.3f}, Pearson "
        f"{check['int8']['pearson']:.4f} with torch on {check['check_pairs']} pairs).",
    ]
    if evaluation:
        lines.append(f"- Evaluation: {json.dumps(evaluation)}")
    lines += ["", "Serve it: `[cross_encoder] model = \"<this folder>\"` (or `<this folder>/int8`) and "
              "`[rerank] cross_encoder = true`.", ""]
    (out / "README.md").write_text("\n".join(lines))
