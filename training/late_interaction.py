"""``hybridrag train late-interaction``: fine-tune a ColBERT-style model on a corpus's judgments.

Model (ColBERT conventions, :class:`index_builder.models.token_encoders.ColbertConventions`): a BERT encoder initialised
from ``--init`` (default: the bundled all-MiniLM-L6-v2) + ``Linear(hidden -> dim, no bias)`` + L2 normalisation.
Queries are ``[CLS] [unused0] tokens [SEP]`` padded with ``[MASK]`` to exactly ``query_maxlen`` ids, the masks not
attended to but scored (query augmentation); documents ``[CLS] [unused1] tokens [SEP]`` cut at ``doc_maxlen`` ids,
punctuation vectors dropped. Score: MaxSim (sum over query vectors of the best dot product with a document vector).

The projection starts from the principal directions of the encoder's own token states over a sample of the corpus
(``projection_init = "pca"``): at step 0 the model scores close to the embedder's own token vectors (the
service's default late interaction) in fewer dimensions, and training starts from there instead of from a random
projection. ``"random"`` gives the usual ColBERT start.

Loss: per query, softmax cross-entropy of its positive among every document of the step (its own hard and random
negatives and the other queries' documents: in-batch negatives), documents judged relevant to it masked out.
AdamW, linear warm-up then decay, fixed seed. Every ``eval_every`` steps: dev nDCG@10 of the served fused list
with its top ``rerank_top`` reordered by MaxSim, alone and blended with the fused order (:mod:`training.selection`);
the best state is kept, patience stops training.

Distillation (``distill`` > 0): the ColBERT conventions start an untrained encoder below the encoder's own token
vectors (the service's default late interaction: on NFCorpus the [MASK] vectors outvote 4-piece queries), and
NFCorpus's judgments are many, graded and noisy. A KL term towards that default scorer (:class:`Teacher`, the
frozen init encoder) keeps what it knows while the labels teach the rest.
"""

from __future__ import annotations

import copy
import json
import random
import string
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from index_builder.models.token_encoders import ColbertConventions
from retrieval.evaluate import evaluate
from training.data import Group, TrainingData, fused_run, make_groups
from training.runtime import CPU_FP32, TorchRuntime, resolve_runtime
from training.selection import DevSelection, progress_writer

PROJECTION_FILE = "projection.pt"


@dataclass(frozen=True)
class LateInteractionTrainConfig:
    dim: int = 128
    projection_init: str = "pca"  # "pca" (the encoder's own token space) or "random"
    pca_sample: int = 256  # passages (fixed-seed sample) whose token states give the PCA projection
    query_maxlen: int = 32
    doc_maxlen: int = 180  # training and dev evaluation
    serve_doc_maxlen: int = 256  # written to colbert_config.json (passages are cut there when served)
    hard_negatives: int = 3
    random_negatives: int = 1
    queries_per_step: int = 8
    lr: float = 2e-5
    projection_lr: float = 1e-4
    weight_decay: float = 0.01
    warmup: float = 0.1
    epochs: float = 1.0
    max_steps: int = 0
    eval_every: int = 100
    patience: int = 3
    rerank_top: int = 20
    dev_queries: int = 0  # 0 = every dev query; else a fixed-seed sample (evaluation encodes their candidates)
    distill: float = 0.0  # weight of KL(teacher || student); teacher: the init encoder's own token vectors
    seed: int = 13
    threads: int = 0
    device: str = "auto"  # training.runtime: CUDA when present, else the CPU
    precision: str = "auto"  # training.runtime: bf16 autocast where the device has it natively, else fp32

    def __post_init__(self) -> None:
        if self.projection_init not in ("pca", "random"):
            raise ValueError(f"projection_init must be 'pca' or 'random', got {self.projection_init!r}")
        if self.query_maxlen < 4 or self.doc_maxlen < 4 or self.dim < 1:
            raise ValueError("query_maxlen and doc_maxlen must be >= 4, dim >= 1")
        if self.pca_sample < 1:
            raise ValueError(f"pca_sample must be >= 1, got {self.pca_sample}")


def conventions_for(tokenizer, cfg: LateInteractionTrainConfig) -> ColbertConventions:
    """The serving conventions, with this tokenizer's ids (markers [unused0]/[unused1] as in Stanford ColBERT)."""
    vocab = tokenizer.get_vocab()
    punct = sorted({vocab[c] for c in string.punctuation if c in vocab})
    return ColbertConventions(
        dim=cfg.dim, query_marker_id=vocab.get("[unused0]", 1), doc_marker_id=vocab.get("[unused1]", 2),
        cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id, pad_token_id=tokenizer.pad_token_id,
        mask_token_id=tokenizer.mask_token_id, query_maxlen=cfg.query_maxlen, doc_maxlen=cfg.serve_doc_maxlen,
        skiplist_punctuation_ids=tuple(punct))


def make_model(torch, bert, dim: int):
    class Colbert(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert
            self.linear = torch.nn.Linear(bert.config.hidden_size, dim, bias=False)

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            h = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return torch.nn.functional.normalize(self.linear(h.last_hidden_state).float(), dim=-1)

    return Colbert()


class Encoder:
    """Ids (exactly as the serving side builds them) and torch encoding for one model."""

    def __init__(self, torch, model, tokenizer, conv: ColbertConventions, cfg: LateInteractionTrainConfig,
                 runtime: TorchRuntime = CPU_FP32) -> None:
        self.torch, self.model, self.tokenizer, self.conv, self.cfg = torch, model, tokenizer, conv, cfg
        self.runtime = runtime

    def _run(self, ids, mask):
        t, dev = self.torch, self.runtime.device
        with self.runtime.autocast(t):
            return self.model(t.from_numpy(ids).to(dev), t.from_numpy(mask).to(dev))

    def _content(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=False, truncation=False)["input_ids"]

    def queries(self, texts: list[str]):
        ids, mask = self.conv.query_ids(self._content(texts), self.cfg.query_maxlen)
        return self._run(ids, mask)  # [n, query_maxlen, dim], all scored

    def documents(self, texts: list[str], maxlen: int | None = None):
        maxlen = maxlen or self.cfg.doc_maxlen
        rows = [self.conv.doc_row(c, maxlen) for c in self._content(texts)]
        ids, mask, keep = self.conv.doc_batch(rows)
        return self._run(ids, mask), self.torch.from_numpy(keep).to(self.runtime.device)


def maxsim(torch, q, d, keep):
    """q [B, Lq, dim], d [N, Ld, dim], keep [N, Ld] -> scores [B, N]."""
    sim = torch.einsum("bqd,ntd->bnqt", q, d)
    sim = sim.masked_fill(~keep[None, :, None, :], -1e4)
    return sim.max(dim=-1).values.sum(dim=-1)


def pca_projection(torch, model, enc: Encoder, passages: list[str], dim: int) -> Any:
    """[dim, hidden]: the top principal directions (uncentred, as dot products are what MaxSim keeps) of the
    encoder's token states over ``passages``."""
    model.eval()
    states = []
    with torch.no_grad():
        for i in range(0, len(passages), 32):
            rows = [enc.conv.doc_row(c, enc.cfg.doc_maxlen) for c in enc._content(passages[i:i + 32])]
            ids, mask, keep = (torch.from_numpy(x).to(enc.runtime.device) for x in enc.conv.doc_batch(rows))
            h = model.bert(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state
            h = torch.nn.functional.normalize(h, dim=-1)
            states.append(h[keep])
    x = torch.cat(states).double()
    _, vecs = torch.linalg.eigh(x.T @ x)  # ascending eigenvalues
    return vecs[:, -dim:].flip(-1).T.float().contiguous()


def dev_scores(torch, enc: Encoder, data: TrainingData, dev_ids: list[str], cfg: LateInteractionTrainConfig
               ) -> dict[str, list[float]]:
    """MaxSim of each dev query against its fused top ``rerank_top`` (each passage encoded once)."""
    enc.model.eval()
    candidates = {q: data.dev_candidates[q] for q in dev_ids}
    docs = sorted({d for q in dev_ids for d in candidates[q][:cfg.rerank_top]})
    # encode longest first in batches of similar length (less padding)
    order = sorted(docs, key=lambda d: -len(data.passages[d]))
    vectors: dict[str, Any] = {}
    scores: dict[str, list[float]] = {}
    with torch.no_grad():
        for i in range(0, len(order), 32):
            chunk = order[i:i + 32]
            d, keep = enc.documents([data.passages[x] for x in chunk])
            for j, x in enumerate(chunk):
                vectors[x] = d[j][keep[j]]
        for i in range(0, len(dev_ids), 64):
            qids = dev_ids[i:i + 64]
            qv = enc.queries([data.queries[q] for q in qids])
            for j, q in enumerate(qids):
                scores[q] = [float((qv[j] @ vectors[x].T).max(dim=-1).values.sum()) for x in candidates[q][:cfg.rerank_top]]
    return scores


class Teacher:
    """Distillation teacher: the init encoder's own token vectors scored by MaxSim, as the service's default late
    interaction scores them (``[CLS] text [SEP]``, special tokens dropped, vectors L2-normalised), frozen.

    The mean over the query's tokens is scaled by ``query_maxlen`` so the teacher's logits sit on the student's
    scale (a sum over ``query_maxlen`` vectors)."""

    def __init__(self, torch, bert, tokenizer, cfg: LateInteractionTrainConfig, runtime: TorchRuntime = CPU_FP32
                 ) -> None:
        self.torch, self.bert, self.tokenizer, self.cfg = torch, bert, tokenizer, cfg
        self.runtime = runtime
        for p in bert.parameters():
            p.requires_grad_(False)
        bert.eval()

    def _encode(self, texts: list[str], maxlen: int):
        t = self.torch
        enc = self.tokenizer(texts, truncation=True, max_length=maxlen, padding=True, return_tensors="pt",
                             return_special_tokens_mask=True).to(self.runtime.device)
        with self.runtime.autocast(t):
            h = self.bert(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                          token_type_ids=t.zeros_like(enc["input_ids"])).last_hidden_state.float()
        keep = enc["attention_mask"].bool() & ~enc["special_tokens_mask"].bool()
        return t.nn.functional.normalize(h, dim=-1), keep

    def scores(self, queries: list[str], passages: list[str]):
        """[B, N] teacher logits."""
        with self.torch.no_grad():
            q, qk = self._encode(queries, 64)
            d, dk = self._encode(passages, self.cfg.doc_maxlen)
            sim = self.torch.einsum("bqd,ntd->bnqt", q, d).masked_fill(~dk[None, :, None, :], -1e4)
            best = sim.max(dim=-1).values.masked_fill(~qk[:, None, :], 0.0)  # [B, N, Lq]
            return best.sum(-1) / qk.sum(-1, keepdim=True).clamp(min=1) * self.cfg.query_maxlen


def step_loss(torch, enc: Encoder, groups: list[Group], data: TrainingData, teacher: Teacher | None = None,
              distill: float = 0.0):
    """Listwise cross-entropy of each query's positive among the step's documents; with a ``teacher``, plus
    ``distill`` x KL(teacher || student) over the same lists."""
    docs: list[str] = []
    for g in groups:
        for d in (g.positive, *g.negatives):
            if d not in docs:
                docs.append(d)
    q = enc.queries([g.query for g in groups])
    d, keep = enc.documents([data.passages[x] for x in docs])
    scores = maxsim(torch, q, d, keep)  # [B, N]
    index = {x: i for i, x in enumerate(docs)}
    target = torch.tensor([index[g.positive] for g in groups], device=scores.device)
    relevant = torch.zeros_like(scores, dtype=torch.bool)
    for b, g in enumerate(groups):  # the query's other judged-relevant documents are not negatives
        for x in data.positives(g.qid):
            if x in index and x != g.positive:
                relevant[b, index[x]] = True
    logits = scores.masked_fill(relevant, -1e4)
    loss = torch.nn.functional.cross_entropy(logits, target)
    if teacher is not None and distill > 0:
        t = teacher.scores([g.query for g in groups], [data.passages[x] for x in docs]).masked_fill(relevant, -1e4)
        kl = torch.nn.functional.kl_div(torch.log_softmax(logits, -1), torch.log_softmax(t, -1), log_target=True,
                                        reduction="batchmean")
        loss = loss + distill * kl
    return loss


def initial_model(torch, transformers, init: Path, cfg: LateInteractionTrainConfig, data: TrainingData,
                  runtime: TorchRuntime = CPU_FP32):
    """(model, tokenizer, conventions, encoder) at step 0: ``init``'s encoder and the projection (PCA over a
    fixed-seed sample of the corpus, or random), on ``runtime``'s device."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(init), local_files_only=True)
    previous = Path(init) / "torch" / PROJECTION_FILE  # a folder this trainer wrote: continue from its weights
    bert = transformers.AutoModel.from_pretrained(str(previous.parent if previous.is_file() else init),
                                                  local_files_only=True, attn_implementation="eager",
                                                  add_pooling_layer=False)
    if previous.is_file():
        model = make_model(torch, bert, cfg.dim)
        model.linear.weight.data.copy_(torch.load(previous))
        model.to(runtime.device)
        conv = conventions_for(tokenizer, cfg)
        return model, tokenizer, conv, Encoder(torch, model, tokenizer, conv, cfg, runtime)
    if cfg.projection_init == "pca" and cfg.dim > bert.config.hidden_size:
        raise ValueError(f"projection_init 'pca' needs dim <= {bert.config.hidden_size}, got {cfg.dim}")
    model = make_model(torch, bert, cfg.dim).to(runtime.device)
    conv = conventions_for(tokenizer, cfg)
    enc = Encoder(torch, model, tokenizer, conv, cfg, runtime)
    if cfg.projection_init == "pca":
        sample = random.Random(cfg.seed).sample(sorted(data.passages), min(cfg.pca_sample, len(data.passages)))
        with torch.no_grad():
            model.linear.weight.copy_(pca_projection(torch, model, enc, [data.passages[d] for d in sample], cfg.dim))
    return model, tokenizer, conv, enc


def train_late_interaction(data: TrainingData, init: Path, cfg: LateInteractionTrainConfig, *, progress: bool = True
                           ) -> tuple[Any, Any, ColbertConventions, dict[str, Any]]:
    """Train; returns (best model, tokenizer, conventions, summary). ``data`` must be mined."""
    import torch
    import transformers
    from tqdm import tqdm

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    runtime = resolve_runtime(torch, cfg.device, cfg.precision)
    if progress:
        print(f"training on {runtime.describe()}", file=sys.stderr)
    model, tokenizer, conv, enc = initial_model(torch, transformers, init, cfg, data, runtime)
    groups = make_groups(data, hard=cfg.hard_negatives, random_negatives=cfg.random_negatives, seed=cfg.seed)
    if not groups:
        raise ValueError("no training groups: no judged query has a positive in the corpus")
    steps = cfg.max_steps or max(1, int(len(groups) * cfg.epochs / cfg.queries_per_step))
    proj = list(model.linear.parameters())
    body = list(model.bert.parameters())
    optimizer = torch.optim.AdamW([{"params": body, "lr": cfg.lr}, {"params": proj, "lr": cfg.projection_lr}],
                                  weight_decay=cfg.weight_decay)
    warm = max(1, int(steps * cfg.warmup))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warm if s < warm else max(0.0, (steps - s) / max(1, steps - warm)))
    teacher = None
    if cfg.distill > 0:
        teacher = Teacher(torch, copy.deepcopy(model.bert), tokenizer, cfg, runtime)  # the step-0 encoder, frozen
    dev_ids = sorted(data.dev_candidates)
    if cfg.dev_queries and cfg.dev_queries < len(dev_ids):
        dev_ids = sorted(random.Random(cfg.seed).sample(dev_ids, cfg.dev_queries))
    dev_qrels = {q: data.dev[q] for q in dev_ids}
    dev_candidates = {q: data.dev_candidates[q] for q in dev_ids}
    fused = evaluate(dev_qrels, fused_run(dev_candidates))["ndcg@10"] if dev_ids else None
    dev = DevSelection(lambda: dev_scores(torch, enc, data, dev_ids, cfg), dev_qrels, dev_candidates, fused,
                       patience=cfg.patience, progress=progress)
    t0 = time.perf_counter()
    dev.evaluate(0, model)
    losses: list[float] = []
    bar = tqdm(range(steps), desc="train late-interaction", disable=not progress, file=sys.stderr)
    for step in bar:
        model.train()
        batch = [groups[(step * cfg.queries_per_step + i) % len(groups)] for i in range(cfg.queries_per_step)]
        loss = step_loss(torch, enc, batch, data, teacher, cfg.distill)
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
               "dev_fused_ndcg@10": fused, "dev_queries": len(dev_ids), "dev_source": data.dev_source,
               "train_queries": len(data.train), "wall_s": round(time.perf_counter() - t0, 1), "log": dev.log}
    return model, tokenizer, conv, summary


def write_conventions(out: Path, conv: ColbertConventions, hidden: int) -> None:
    raw = asdict(conv)
    raw["skiplist_punctuation_ids"] = list(conv.skiplist_punctuation_ids)
    raw.update({
        "architecture": f"BertModel + Linear({hidden}->{conv.dim}, no bias) + L2 normalise (in the graph)",
        "similarity": "maxsim",
        "onnx_inputs": ["input_ids", "attention_mask", "token_type_ids"],
        "query_augmentation": "queries padded with [MASK] to exactly query_maxlen ids, not attended to, all scored",
        "doc_vectors_kept": "attention_mask == 1 and id not in skiplist_punctuation_ids",
        "token_type_ids": "all zeros",
    })
    (out / "colbert_config.json").write_text(json.dumps(raw, indent=1) + "\n")


def save_torch(out: Path, model, torch) -> None:
    """``torch/``: the encoder (transformers layout) and the projection, so ``--init <this folder>`` continues."""
    (out / "torch").mkdir(parents=True, exist_ok=True)
    model.bert.save_pretrained(str(out / "torch"))
    torch.save(model.linear.weight.detach().clone(), out / "torch" / PROJECTION_FILE)
