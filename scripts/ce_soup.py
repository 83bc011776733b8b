"""Dev-only experiment (issue #8): do cross-encoders trained with different seeds do better together?

Scores each model folder's dev figures (the trainer's own dev evaluation: the fused top 5 of every dev query,
alone and blended with the fused order), then a z-score average of their scores (an ensemble, which one model
folder cannot serve) and a uniform weight average of their weights (a "model soup", which it can). With
``--export DIR`` the soup is written as a servable model folder. Never reads the test split.

    .venv/bin/python scripts/ce_soup.py --dataset ../shared/data/beir/nfcorpus --index /tmp/idx/nfcorpus \\
        /tmp/tr/ce-nf-nb05-s13 /tmp/tr/ce-nf-nb05-s7
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import transformers

from hybridrag.cli import build_parser
from rerank.interpolation import standardize
from training.cli import _prepare, check_pairs
from training.cross_encoder import CrossEncoderTrainConfig, dev_scores
from training.data import dev_figures
from training.export import export_cross_encoder


def _line(name: str, scores, data) -> str:
    fig = dev_figures(data.dev, data.dev_candidates, scores)
    return f"{name}: dev alone {fig['ndcg']:.4f}, blended {fig['blended']:.4f} at {fig['weight']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--index", required=True)
    ap.add_argument("--mine-depth", default="10")
    ap.add_argument("--max-length", default="128", help="pair length the models were trained at")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--export", help="write the weight soup here (ONNX fp32 + int8, weights, tokenizer)")
    ap.add_argument("models", nargs="+", help="cross-encoder folders written by hybridrag train cross-encoder")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    train_args = build_parser().parse_args(
        ["train", "cross-encoder", "--dataset", args.dataset, "--index", args.index, "--out", args.export or "-",
         "--mine-depth", args.mine_depth, "--max-length", args.max_length, "--quiet"])
    cfg, data, _ = _prepare(train_args, CrossEncoderTrainConfig)
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.models[0])
    models = [transformers.AutoModelForSequenceClassification.from_pretrained(m, attn_implementation="eager").eval()
              for m in args.models]
    per_model = [dev_scores(m, tokenizer, torch, data, cfg) for m in models]
    for name, scores in zip(args.models, per_model, strict=True):
        print(_line(name, scores, data), flush=True)
    ensemble = {q: list(np.mean([standardize(s[q]) for s in per_model], axis=0)) for q in per_model[0]}
    print(_line("score ensemble (z-score average)", ensemble, data), flush=True)
    states = [m.state_dict() for m in models]
    soup = models[0]
    soup.load_state_dict({k: (sum(s[k].float() for s in states) / len(states)).to(states[0][k].dtype)
                          for k in states[0]})
    print(_line("weight soup (uniform)", dev_scores(soup, tokenizer, torch, data, cfg), data), flush=True)
    if args.export:
        print(export_cross_encoder(soup, tokenizer, Path(args.export), check_pairs(data), cfg.max_length))


if __name__ == "__main__":
    main()
