"""Dev evaluation with early stopping, shared by both trainers.

Every evaluation scores the dev queries' fused candidates with the current model; :func:`training.data.dev_figures`
turns the scores into nDCG@10 of the stage alone and of the stage blended with the fused order (the served
``[rerank] li_weight`` / ``ce_weight``). The state is judged by the best of those (the weight is reported, so the
figure is one that can be served); the best state is kept and ``patience`` evaluations without a gain stop training.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from training.data import dev_figures


class DevSelection:
    """``scores()`` returns the model's scores for the head of each dev query's candidates (dev query id ->
    scores); ``qrels`` and ``candidates`` are the dev judgments and fused lists; ``fused`` their nDCG@10."""

    def __init__(self, scores: Callable[[], Mapping[str, Sequence[float]]], qrels: Mapping[str, Any],
                 candidates: Mapping[str, list[str]], fused: float | None, *, patience: int,
                 progress: bool) -> None:
        self.scores, self.qrels, self.candidates, self.fused = scores, qrels, candidates, fused
        self.patience, self.progress = patience, progress
        self.enabled = bool(candidates)
        self.log: list[dict[str, Any]] = []
        self.best: dict[str, Any] = {"step": 0, "dev_ndcg@10": None, "dev_blended_ndcg@10": None, "weight": 1.0}
        self.best_state: dict[str, Any] | None = None
        self.stale = 0
        self.t0 = time.perf_counter()

    def evaluate(self, step: int, model, loss: float | None = None, write: Callable[[str], None] | None = None) -> bool:
        """Evaluate ``model`` after ``step`` steps; keep its state if best. Returns True when patience ran out."""
        if not self.enabled:
            return False
        figs = dev_figures(self.qrels, self.candidates, self.scores())
        entry: dict[str, Any] = {"step": step}
        if loss is not None:
            entry["loss"] = round(loss, 5)
        entry.update({"dev_ndcg@10": figs["ndcg"], "dev_blended_ndcg@10": figs["blended"], "dev_weight": figs["weight"],
                      "dev_by_weight": figs["by_weight"], "seconds": round(time.perf_counter() - self.t0, 1)})
        if step == 0:
            entry["dev_fused_ndcg@10"] = self.fused
        self.log.append(entry)
        if self.progress:
            (write or (lambda s: print(s, file=sys.stderr, flush=True)))(
                f"step {step}: dev nDCG@10 {figs['ndcg']:.4f}, blended with the fused order {figs['blended']:.4f} at "
                f"weight {figs['weight']} (fused {self.fused:.4f}; best so far {self._best_text()})")
        if self.best_state is None or figs["blended"] > self.best["dev_blended_ndcg@10"]:
            self.best = {"step": step, "dev_ndcg@10": figs["ndcg"], "dev_blended_ndcg@10": figs["blended"],
                         "weight": figs["weight"]}
            self.best_state, self.stale = copy.deepcopy(model.state_dict()), 0
            return False
        self.stale += 1
        return self.stale >= self.patience

    def _best_text(self) -> str:
        b = self.best
        return "none" if b["dev_blended_ndcg@10"] is None else f"{b['dev_blended_ndcg@10']:.4f} at step {b['step']}"

    def restore(self, model) -> None:
        """Load the best dev state into ``model`` (without a dev split, the last state stays)."""
        if self.best_state is not None:
            model.load_state_dict(self.best_state)


def progress_writer(bar) -> Callable[[str], None]:
    """Lines printed above a tqdm ``bar`` on stderr, as they happen (tqdm.write goes to stdout, which is
    block-buffered when redirected to a file: a long run's dev figures showed only when it ended)."""
    return lambda line: bar.write(line, file=sys.stderr)
