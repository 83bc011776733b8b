"""The cross-encoder: the top ``ce_top_k`` reordered by a sequence-classification model's logit of each (query,
passage) pair, blended with the order it received (``rerank.ce_weight``); everything below the head keeps its
order.

Cost levers (:class:`~retrieval.search.settings.RerankConfig`; measured in docs/results/interactive-cascade.md):
``ce_window_tokens`` scores each passage's best window of that many tokens, found by late interaction's token
similarities (:mod:`rerank.windows`); ``ce_gate_gap`` skips the stage when the head it receives is already decisive
(:meth:`CrossEncoderStage.gated`); the model calls share a pair-score cache (``ce_cache_pairs``, in the runner's
model calls)."""

from __future__ import annotations

import time

import numpy as np

from index_builder.models.encoders import Embedder
from index_builder.types import Hits
from rerank.cross_encoder import decisive_gap, rerank_by_scores
from rerank.windows import best_window, char_span
from retrieval.search.results import keep_evidence, reorder
from retrieval.search.settings import RerankConfig
from retrieval.search.stages.query import Query, ms_since
from retrieval.search.view import IndexView


class CrossEncoderStage:
    """``embedder``: its tokenizer places the windows (its word pieces are the positions of the stored token
    vectors); ``embedder_tokens``: those token vectors are the embedder's own (windows need them)."""

    name = "cross_encoder"

    def __init__(self, config: RerankConfig, embedder: Embedder, *, embedder_tokens: bool) -> None:
        self.config, self.embedder, self.embedder_tokens = config, embedder, embedder_tokens

    def gated(self, hits: Hits, li_top_k: int) -> str | None:
        """Why the stage is skipped for a head that is already decisive (its first two scores at least
        ``ce_gate_gap`` standard deviations apart), None = it runs."""
        gap_needed = self.config.ce_gate_gap
        if gap_needed > 0 and (gap := decisive_gap(hits.scores[:li_top_k])) >= gap_needed:
            return (f"gated: the head is already decisive (its first two {gap:.2f} standard deviations apart; "
                    f"rerank.ce_gate_gap = {gap_needed})")
        return None

    def passages(self, index: IndexView, chunks: np.ndarray, query_tokens: np.ndarray | None,
                 width: int = 0) -> list[str]:
        """The texts scored for ``chunks``: each passage (title + chunk), or with ``width`` > 0
        (``ce_window_tokens``) its best window by late interaction's token similarities. Windows need the
        embedder's own token vectors and an index that can give a chunk's token similarities; without them the
        whole passage is scored."""
        passages = [index.passage_with_title(int(c)) for c in chunks.tolist()]
        late = index.late
        if not width or query_tokens is None or not self.embedder_tokens or late is None:
            return passages
        out = []
        for c, passage, enc in zip(chunks.tolist(), passages, self.embedder.model.tokenize(passages), strict=True):
            sims = late.token_sims(query_tokens, int(c))
            if sims is None:  # an index that scores in place (an engine) cannot place a window
                return passages
            start, end = best_window(sims, width)
            content = [i for i, special in enumerate(enc.special_tokens_mask) if not special]
            a, b = char_span(enc.offsets, content, start, end)
            out.append(passage[a:b] if b > a else passage)
        return out

    async def run(self, q: Query, hits: Hits) -> Hits:
        """``hits`` with their head reordered by the model's scores."""
        assert q.request.ce_top_k is not None
        t = time.perf_counter()
        with q.span("hybridrag.cross_encoder", {"top_k": q.request.ce_top_k}):
            chunks = hits.chunk[:q.request.ce_top_k]
            passages = self.passages(q.index, chunks, q.query_tokens, self.config.ce_window_tokens)
            scores = await q.runner.score_pairs(q.request.query, passages)
            hits = reorder(hits, rerank_by_scores(scores, len(hits), self.config.ce_weight))
            hits = keep_evidence(hits, q.result.stages, self.config.keep_bm25_lead, self.config.keep_bm25_rank)
        q.result.stages[self.name] = hits
        q.result.timings_ms[self.name] = ms_since(t)
        return hits
