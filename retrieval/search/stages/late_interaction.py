"""Late interaction: the fused top ``li_top_k`` reordered by MaxSim of the query's token vectors against each
candidate passage's stored ones (the embedder's own token states, or a ColBERT model's), blended with the order it
received (``rerank.li_weight``); everything below the head keeps its order.

Policy (:class:`~retrieval.search.settings.RerankConfig`): a long query (over ``li_long_query_tokens`` query tokens,
or cut by the encoder) takes ``li_long_weight`` (0.5 by default; at 0 the stage does not reorder it and the result says
why). It cannot run when the snapshot has no token vectors or they come from another token encoder (the reason is
reported, :meth:`LateInteractionStage.unavailable`)."""

from __future__ import annotations

import time

import numpy as np

from index_builder.models.token_encoders import TokenEncoder, identity
from index_builder.types import Hits
from rerank.maxsim import maxsim
from retrieval.search.results import keep_evidence, reorder
from retrieval.search.runner import Runner
from retrieval.search.settings import RerankConfig
from retrieval.search.stages.query import Query, ms_since
from retrieval.search.view import IndexView


class LateInteractionStage:
    """``embedder_tokens``: the token vectors are the embedder's own (they come with the query embedding);
    otherwise ``token_encoder`` encodes the query apart. ``max_length``: the embedder's window, to tell a query it
    had to cut."""

    name = "late_interaction"

    def __init__(self, config: RerankConfig, token_encoder: TokenEncoder, *, embedder_tokens: bool,
                 max_length: int) -> None:
        self.config, self.token_encoder = config, token_encoder
        self.embedder_tokens, self.max_length = embedder_tokens, max_length

    def unavailable(self, index: IndexView) -> str | None:
        """Why the stage cannot serve on ``index`` with the configured token encoder (None if it can)."""
        if index.late is None:
            return "the snapshot has no token vectors"
        have = identity(index.token_encoder or {})
        want = identity(self.token_encoder.describe())
        if have != want:
            return (f"the snapshot's token vectors come from {index.token_encoder and index.token_encoder.get('name')!r}, "
                    f"the configured token encoder is {self.token_encoder.describe().get('name')!r} "
                    "(run 'hybridrag index tokens')")
        return None

    def start(self, q: Query) -> None:
        """A separate token encoder (ColBERT) encodes the query beside the first stage."""
        if not self.embedder_tokens:
            q.pending["query_tokens"] = q.runner.spawn(q.runner.encode_query_tokens(q.request.query))

    async def run(self, q: Query, hits: Hits) -> Hits:
        """``hits`` with their head reordered (or as given, with the reason in ``q.result.skipped``)."""
        rr, result = self.config, q.result
        t = time.perf_counter()
        with q.span("hybridrag.late_interaction", {"top_k": q.request.li_top_k}):
            if "query_tokens" in q.pending:
                q.query_tokens, result.timings_ms["query_tokens_queue"] = await q.pending.pop("query_tokens")
            elif q.query_tokens is None:  # dense skipped or failed, or a vector was given: encode now
                _, q.query_tokens, _ = await q.runner.embed_query(q.request.query)
            late, tokens = q.index.late, q.query_tokens
            assert late is not None and tokens is not None and q.request.li_top_k is not None
            # the embedder's token vectors skip [CLS] and [SEP]: max_length - 2 of them = the query was cut
            truncated = self.embedder_tokens and len(tokens) >= self.max_length - 2
            weight = rr.li_weight_for(len(tokens), truncated)
            if weight > 0.0:
                order = await q.runner.call(late.rerank, tokens, hits.chunk, q.request.li_top_k, weight)
                hits = keep_evidence(reorder(hits, order), result.stages, rr.keep_bm25_lead, rr.keep_bm25_rank)
        if weight > 0.0:
            result.stages[self.name] = hits
            result.timings_ms[self.name] = ms_since(t)
        elif rr.is_long(len(tokens), truncated):  # a policy, not a degradation: the response says so
            cut = f", cut at the encoder's {self.max_length} pieces" if truncated else ""
            q.skip(self.name, f"long query: {len(tokens)} query tokens{cut} (rerank.li_long_query_tokens = "
                              f"{rr.li_long_query_tokens}) and rerank.li_long_weight = 0: the fused order is kept")
        else:
            q.skip(self.name, "rerank.li_weight = 0: the fused order is kept")
        return hits

    async def score_texts(self, runner: Runner, query: str, texts: list[str]) -> np.ndarray:
        """MaxSim of the query against texts that are not in the index (``/v1/rerank``): the texts are encoded
        now. float32 ``(len(texts),)``."""
        if self.embedder_tokens:
            _, tokens, _ = await runner.embed_query(query)
        else:
            tokens, _ = await runner.encode_query_tokens(query)
        assert tokens is not None
        docs = await runner.call(self.token_encoder.encode_documents, texts)
        return np.array([maxsim(tokens, d) for d in docs], dtype=np.float32)
