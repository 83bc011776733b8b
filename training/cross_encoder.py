"""``hybridrag train cross-encoder``: fine-tune a cross-encoder on a corpus's judgments and export it for serving.

Model: ``BertForSequenceClassification`` with one logit, initialised from ``--init`` (default: the bundled
all-MiniLM-L6-v2 weights; any local transformers folder), a new classification head. Pairs are
``[CLS] query [SEP] passage [SEP]``, passage = title + text, truncated on the passage side to ``max_length`` (the
serving side's convention, :class:`index_builder.models.encoders.CrossEncoder`).

Loss: listwise softmax cross-entropy: per group (query, positive, hard and random negatives; see
:mod:`training.data`) the positive's log-probability among the group's logits. In-batch negatives: the other groups'
positives in the step are added to each group (``in_batch``), except those judged relevant to its query. ``positives
= "retrieved"`` trains only on positives the first stage finds (:func:`training.data.make_groups`).
``neighbor_targets`` = beta > 0 makes the targets soft: each negative gets target mass beta x its neighbour support
(:meth:`training.data.TrainingData.support`, the share of similar training queries that judge it relevant), the
positive 1, normalised over the group; 0 = the positive alone.

Pool lists (``lists`` = N > 0) replace the groups: the unit is a training query's served fused top N
(:func:`training.data.make_lists`), scored as one list; the target mass is spread evenly over its judged documents
(ListNet), and with ``neighbor_targets`` each unjudged one gets beta x its neighbour support. That is the task the
stage serves: order a fused head in which, on NFCorpus, several documents are judged. ``prior_weight`` = lambda > 0
adds lambda x the z-scored fused position to the logits inside the loss (the prior of
:func:`rerank.interpolation.blend_with_prior`), so the model is trained as a residual over the order it blends
with when served (CLEAR's residual learning over a lexical score). Device and
precision come from :mod:`training.runtime` (bf16 autocast on CPUs with AMX, CUDA when present). AdamW, linear
warm-up then linear decay, a fixed seed. Every ``eval_every`` steps the model reranks the top ``rerank_top`` of the
served fused list of every dev query; nDCG@10 of that list against the fused list's is logged, the best state is
kept, and training stops after ``patience`` evaluations without a gain. The best state is exported
(:mod:`training.export`).

Needs torch and transformers (the ``bench`` extra); imported inside the functions.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.evaluate import evaluate
from training.data import Group, PoolList, TrainingData, fused_run, make_groups, make_lists
from training.distill import Teacher, distill_loss, load_student
from training.runtime import CPU_FP32, TorchRuntime, resolve_runtime
from training.selection import DevSelection, progress_writer


@dataclass(frozen=True)
class CrossEncoderTrainConfig:
    max_length: int = 128
    hard_negatives: int = 7
    random_negatives: int = 1
    positives: str = "all"  # "retrieved": only positives the first stage found (training.data.make_groups)
    in_batch: bool = True
    neighbor_targets: float = 0.0  # beta: soft target mass of a negative = beta x its neighbour support (0 = off)
    neighbors: int = 5  # training queries per neighbourhood when neighbor_targets > 0 (training.data.mine)
    lists: int = 0  # N > 0: train on each training query's fused top N (pool lists) instead of groups
    prior_weight: float = 0.0  # lambda: with lists, lambda x z(fused position) is added to the logits in the loss
    groups_per_step: int = 4
    lr: float = 3e-5
    head_lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: float = 0.1  # share of the steps
    epochs: float = 1.0
    max_steps: int = 0  # 0 = from epochs
    eval_every: int = 100
    patience: int = 3
    rerank_top: int = 5
    seed: int = 13
    threads: int = 0  # torch threads (0 = torch's default)
    device: str = "auto"  # training.runtime: CUDA when present, else the CPU
    precision: str = "auto"  # training.runtime: bf16 autocast where the device has it natively, else fp32
    teacher: str = ""  # an ONNX cross-encoder folder: its listwise softmax is the target (training.distill)
    layers: int = 0  # N > 0: the student keeps N of the init model's layers (training.distill.kept_layers)
    distill_weight: float = 1.0  # with a teacher: the KL term's share of the loss (the label loss has the rest)

    def __post_init__(self) -> None:
        from index_builder.errors import ConfigError

        if self.neighbor_targets < 0:
            raise ConfigError(f"--neighbor-targets must be >= 0 (0 = off), got {self.neighbor_targets}")
        if self.neighbor_targets > 0 and self.neighbors < 1:
            raise ConfigError(f"--neighbors must be >= 1 with --neighbor-targets, got {self.neighbors}")
        if self.lists < 0 or self.lists == 1:
            raise ConfigError(f"--lists must be 0 (groups) or a list length >= 2, got {self.lists}")
        if self.prior_weight < 0:
            raise ConfigError(f"--prior-weight must be >= 0, got {self.prior_weight}")
        if self.prior_weight > 0 and not self.lists:
            raise ConfigError("--prior-weight needs --lists N: only a pool list has a fused position per document")
        if self.layers < 0:
            raise ConfigError(f"--layers must be >= 0 (0 = all of the init model's), got {self.layers}")
        if not 0.0 <= self.distill_weight <= 1.0:
            raise ConfigError(f"--distill-weight must be in [0, 1], got {self.distill_weight}")
        if self.teacher and not (Path(self.teacher) / "model.onnx").is_file():
            raise ConfigError(f"--teacher {self.teacher}: no model.onnx there (an ONNX cross-encoder folder)")


def _pairs_logits(model, tokenizer, torch, queries: list[str], passages: list[str], max_length: int,
                  runtime: TorchRuntime = CPU_FP32):
    """fp32 logits [n] of the pairs (computed under ``runtime``'s autocast, on its device)."""
    enc = tokenizer(queries, passages, truncation="only_second", max_length=max_length, padding=True,
                    return_tensors="pt").to(runtime.device)
    with runtime.autocast(torch):
        return model(**enc).logits.squeeze(-1).float()


def score(model, tokenizer, torch, query: str, passages: list[str], max_length: int, batch: int = 32,
          runtime: TorchRuntime = CPU_FP32) -> list[float]:
    model.eval()
    out: list[float] = []
    with torch.no_grad():
        for i in range(0, len(passages), batch):
            chunk = passages[i:i + batch]
            out.extend(_pairs_logits(model, tokenizer, torch, [query] * len(chunk), chunk, max_length, runtime).tolist())
    return out


def dev_scores(model, tokenizer, torch, data: TrainingData, cfg: CrossEncoderTrainConfig,
               runtime: TorchRuntime = CPU_FP32) -> dict[str, list[float]]:
    """The model's logits for each dev query's fused top ``rerank_top``."""
    return {qid: score(model, tokenizer, torch, data.queries[qid], [data.passages[d] for d in docs[:cfg.rerank_top]],
                       cfg.max_length, runtime=runtime)
            for qid, docs in data.dev_candidates.items()}


def _with_teacher(loss, logits, queries: list[str], passages: list[str], cfg: CrossEncoderTrainConfig,
                  teacher: Teacher | None, torch):
    """``loss`` mixed with the KL term towards the teacher's softmax over the same rows (when there is one)."""
    if teacher is None:
        return loss
    kl = distill_loss(logits, teacher.logits(queries, passages), torch)
    return cfg.distill_weight * kl + (1.0 - cfg.distill_weight) * loss


def step_loss(model, tokenizer, torch, groups: list[Group], data: TrainingData, cfg: CrossEncoderTrainConfig,
              runtime: TorchRuntime = CPU_FP32, teacher: Teacher | None = None):
    """Listwise softmax cross-entropy of one step's groups (positive at index 0 of each group's list; with
    ``cfg.neighbor_targets`` the soft targets of the module docstring)."""
    lists = []
    for g in groups:
        docs = [g.positive, *g.negatives]
        if cfg.in_batch:  # the other groups' positives, unless judged relevant to this query too
            relevant = set(data.positives(g.qid))
            docs += [o.positive for o in groups if o is not g and o.positive not in docs and o.positive not in relevant]
        lists.append(docs)
    width = min(len(d) for d in lists)  # equal widths: one logits matrix
    queries = [g.query for g, docs in zip(groups, lists, strict=True) for _ in docs[:width]]
    passages = [data.passages[d] for docs in lists for d in docs[:width]]
    logits = _pairs_logits(model, tokenizer, torch, queries, passages, cfg.max_length, runtime).view(len(groups), width)
    if cfg.neighbor_targets <= 0:
        target = torch.zeros(len(groups), dtype=torch.long, device=logits.device)
        loss = torch.nn.functional.cross_entropy(logits, target)
    else:
        mass = torch.tensor(soft_targets(groups, lists, width, data, cfg.neighbor_targets), device=logits.device)
        loss = -(mass * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
    return _with_teacher(loss, logits, queries, passages, cfg, teacher, torch)


def list_loss(model, tokenizer, torch, lists: list[PoolList], data: TrainingData, cfg: CrossEncoderTrainConfig,
              runtime: TorchRuntime = CPU_FP32, teacher: Teacher | None = None):
    """Pool-list loss (module docstring): softmax cross-entropy of each list's logits, plus ``cfg.prior_weight`` x
    the z-scored fused position, against its judged documents' share of the mass."""
    width = min(len(p.docs) for p in lists)
    queries = [p.query for p in lists for _ in range(width)]
    passages = [data.passages[d] for p in lists for d in p.docs[:width]]
    logits = _pairs_logits(model, tokenizer, torch, queries, passages, cfg.max_length, runtime).view(len(lists), width)
    if cfg.prior_weight > 0:
        prior = -torch.arange(width, dtype=torch.float32, device=logits.device)
        logits = logits + cfg.prior_weight * (prior - prior.mean()) / prior.std(unbiased=False)
    mass = torch.tensor(list_targets(lists, width, data, cfg.neighbor_targets), device=logits.device)
    loss = -(mass * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
    return _with_teacher(loss, logits, queries, passages, cfg, teacher, torch)


def list_targets(lists: list[PoolList], width: int, data: TrainingData, beta: float) -> list[list[float]]:
    """Per list: 1 for each judged document, ``beta`` x neighbour support for each unjudged one, normalised."""
    return [_target_mass(p.qid, p.docs[:width], p.labels[:width], data, beta) for p in lists]


def soft_targets(groups: list[Group], lists: list[list[str]], width: int, data: TrainingData, beta: float
                 ) -> list[list[float]]:
    """Per group: 1 for the positive (index 0), ``beta`` x neighbour support for each negative, normalised."""
    return [_target_mass(g.qid, docs[:width], [1.0] + [0.0] * (width - 1), data, beta)
            for g, docs in zip(groups, lists, strict=True)]


def _target_mass(qid: str, docs, labels, data: TrainingData, beta: float) -> list[float]:
    """A list's target distribution: each labelled document its label, each other ``beta`` x its neighbour support."""
    mass = [y if y > 0 else beta * data.support(qid, d) for d, y in zip(docs, labels, strict=True)]
    total = sum(mass)
    return [m / total for m in mass]


def neighbor_support_summary(groups: list[Group], data: TrainingData) -> dict[str, float]:
    """Mean neighbour support of the groups' positives and negatives, and the share of negatives with any."""
    pos = [data.support(g.qid, g.positive) for g in groups]
    neg = [data.support(g.qid, d) for g in groups for d in g.negatives]
    return {"positives_mean": round(float(np.mean(pos)), 4) if pos else 0.0,
            "negatives_mean": round(float(np.mean(neg)), 4) if neg else 0.0,
            "negatives_supported": round(float(np.mean([x > 0 for x in neg])), 4) if neg else 0.0}


def train_cross_encoder(data: TrainingData, init: Path, cfg: CrossEncoderTrainConfig, *, progress: bool = True
                        ) -> tuple[Any, Any, dict[str, Any]]:
    """Train; returns (best model, tokenizer, summary). ``data`` must be mined (:func:`training.data.mine`)."""
    import torch
    import transformers
    from tqdm import tqdm

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(init), local_files_only=True)
    if cfg.layers or not any((init / f).is_file() for f in ("model.safetensors", "pytorch_model.bin")):
        model = load_student(init, cfg.layers, torch, transformers)  # fewer layers, or an ONNX-only folder
    else:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            str(init), num_labels=1, local_files_only=True, attn_implementation="eager")
    teacher = Teacher(Path(cfg.teacher), cfg.max_length, cfg.threads) if cfg.teacher else None
    runtime = resolve_runtime(torch, cfg.device, cfg.precision)
    model.to(runtime.device)
    if progress:
        print(f"training on {runtime.describe()}", file=sys.stderr)
    if cfg.lists:
        groups = make_lists(data, depth=cfg.lists, seed=cfg.seed)
        if not groups:
            raise ValueError(f"no pool lists: no training query's fused top {cfg.lists} holds both a judged and an "
                             "unjudged document (mine at least that deep)")
    else:
        groups = make_groups(data, hard=cfg.hard_negatives, random_negatives=cfg.random_negatives, seed=cfg.seed,
                             positives=cfg.positives)
        if not groups:
            raise ValueError("no training groups: no judged query has a positive in the corpus")
    steps = cfg.max_steps or max(1, int(len(groups) * cfg.epochs / cfg.groups_per_step))
    support = neighbor_support_summary(groups, data) if cfg.neighbor_targets > 0 and not cfg.lists else None
    if support and progress:
        print(f"neighbour support: positives {support['positives_mean']}, negatives {support['negatives_mean']} "
              f"({support['negatives_supported']} of negatives above 0)", file=sys.stderr)
    head = [p for n, p in model.named_parameters() if n.startswith(("classifier", "bert.pooler"))]
    body = [p for n, p in model.named_parameters() if not n.startswith(("classifier", "bert.pooler"))]
    optimizer = torch.optim.AdamW([{"params": body, "lr": cfg.lr}, {"params": head, "lr": cfg.head_lr}],
                                  weight_decay=cfg.weight_decay)
    warm = max(1, int(steps * cfg.warmup))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warm if s < warm else max(0.0, (steps - s) / max(1, steps - warm)))
    fused = evaluate(data.dev, fused_run(data.dev_candidates))["ndcg@10"] if data.dev_candidates else None
    dev = DevSelection(lambda: dev_scores(model, tokenizer, torch, data, cfg, runtime), data.dev, data.dev_candidates,
                       fused, patience=cfg.patience, progress=progress)
    dev.evaluate(0, model)
    t0, losses = time.perf_counter(), []
    bar = tqdm(range(steps), desc="train cross-encoder", disable=not progress, file=sys.stderr)
    for step in bar:
        model.train()
        batch = [groups[(step * cfg.groups_per_step + i) % len(groups)] for i in range(cfg.groups_per_step)]
        loss = (list_loss if cfg.lists else step_loss)(model, tokenizer, torch, batch, data, cfg, runtime, teacher)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
        if (step + 1) % cfg.eval_every == 0 or step + 1 == steps:
            if dev.evaluate(step + 1, model, float(np.mean(losses[-cfg.eval_every:])), progress_writer(bar)):
                break
    dev.restore(model)
    model.to("cpu").eval()
    summary = {"config": asdict(cfg), "runtime": runtime.describe(), "init": str(init), "groups": len(groups),
               "steps_planned": steps, "steps_run": len(losses), "losses": [round(x, 5) for x in losses], "best": dev.best,
               "dev_fused_ndcg@10": fused, "dev_queries": len(data.dev_candidates), "dev_source": data.dev_source,
               "train_queries": len(data.train), "neighbor_support": support,
               "wall_s": round(time.perf_counter() - t0, 1), "log": dev.log}
    return model, tokenizer, summary


def write_log(out: Path, summary: dict[str, Any]) -> None:
    (out / "train_log.json").write_text(json.dumps(summary, indent=1) + "\n")
