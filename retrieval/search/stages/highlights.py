"""Highlights: for a request with ``highlights``, each of the first ``rerank.highlight_passages`` passages gets the
sentences that late interaction's token similarities point at (:func:`rerank.highlights.highlight_sentences`), as
character spans of the passage text the response returns.

Where the similarities come from: the index's stored token vectors (``late.token_sims``, the same matrix the
cross-encoder's windows use): every token's own where the store keeps them all (``int8``, ``float16``, unpooled
codes); in the default store, which pools three tokens into one vector (``pool3+bins``), each token gets its pooled
vector's similarities through the groups kept at build (each token's pooled row). A store without positions (a
pooled one built before the groups were kept) and an engine, which scores in place, have none: there the returned
passages are encoded again, one batched encoder pass (the embedder's own token states), as they are for every
request with ``[rerank] highlight_exact``. Highlights need the embedder's own token vectors (a separate ColBERT
encoder's pieces carry markers the offsets do not) and a passage that late interaction scored for this request;
otherwise a passage has none, and the request does not fail.

Cost per passage is bounded: only its first :data:`rerank.highlights.MAX_CHARS` characters are tokenized, encoded
and split (the first word pieces of a prefix are the passage's own, so the stored similarities still line up); a
passage whose title alone is longer has none. Three passages of 400,000 characters, mostly white space: the stage
took 668 ms (x38 a request's p50), now 14 ms (x2.5); of 20-50k characters: 16.5 -> 5.6 ms.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from index_builder.documents.chunking import chunk_passage
from index_builder.models.encoders import Embedder
from rerank.highlights import MAX_CHARS, Highlight, highlight_sentences
from retrieval.search.results import SearchResult
from retrieval.search.settings import RerankConfig
from retrieval.search.stages.query import Query, ms_since


class HighlightStage:
    """``embedder``: its tokenizer gives each token's characters, and its token states stand in for a pooled
    store's; ``embedder_tokens``: late interaction scores the embedder's own token vectors."""

    name = "highlights"

    def __init__(self, config: RerankConfig, embedder: Embedder, *, embedder_tokens: bool) -> None:
        self.config, self.embedder, self.embedder_tokens = config, embedder, embedder_tokens

    def chunks_for(self, result: SearchResult, li_top_k: int) -> list[int]:
        """The result's first ``highlight_passages`` chunks that late interaction scored in this request."""
        li = result.stages.get("late_interaction")
        if li is None or not self.embedder_tokens:
            return []
        scored = set(li.chunk[:li_top_k].tolist())
        return [c for c in result.hits.chunk[:self.config.highlight_passages].tolist() if c in scored]

    def compute(self, texts: list[tuple[str, str]], query_tokens: np.ndarray, late: Any,
                chunks: list[int]) -> list[list[Highlight]]:
        """Each (title, passage)'s highlights, from the stored token similarities of its chunk where ``late`` (the
        index's late interaction, None for a cached result) gives them (float [t, q] over the tokens of
        ``title\\npassage``), else from the passage encoded now (one batch for all of them)."""
        exact = self.config.highlight_exact
        stored = [late.token_sims(query_tokens, c) if late is not None and not exact else None for c in chunks]
        skip = {i for i, (title, _) in enumerate(texts) if len(title) > MAX_CHARS}  # its tokens: all title's
        texts = [("", "") if i in skip else (title, text[:MAX_CHARS]) for i, (title, text) in enumerate(texts)]
        full = [chunk_passage(title, text) for title, text in texts]
        encodings = self.embedder.model.tokenize(full)
        missing = [i for i, s in enumerate(stored) if s is None and i not in skip]
        sims = list(stored)
        if missing:
            vectors = self.embedder.encode([full[i] for i in missing], with_tokens=True).token_vectors
            assert vectors is not None
            q = np.asarray(query_tokens, dtype=np.float32).T
            for i, v in zip(missing, vectors, strict=True):
                sims[i] = np.asarray(v, dtype=np.float32) @ q
        out: list[list[Highlight]] = []
        for i, ((_, text), whole, enc, s) in enumerate(zip(texts, full, encodings, sims, strict=True)):
            if i in skip or s is None:
                out.append([])
                continue
            # an Encoding builds a new list on every read of .offsets / .special_tokens_mask: read each once (read
            # per token, they made this stage quadratic in the passage's length: 5 of its 7 ms for 3 passages)
            content = np.flatnonzero(np.asarray(enc.special_tokens_mask) == 0)[:len(s)]
            prefix = len(whole) - len(text)  # the title and its newline, before the passage's own characters
            offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)[content] - prefix
            offsets[offsets[:, 0] < 0] = -1  # the title's tokens: not part of the passage
            out.append(highlight_sentences(text, offsets, s[:len(content)]))
        return out

    async def run(self, q: Query, result: SearchResult) -> dict[int, list[Highlight]]:
        """Highlights of ``result``'s first passages by chunk (``result`` may be a cached one: its passages are
        encoded, the query's token vectors computed if this request has none yet)."""
        t = time.perf_counter()
        assert q.request.li_top_k is not None
        chunks = self.chunks_for(result, q.request.li_top_k)
        if not chunks or self.config.highlight_passages == 0:
            return {}
        with q.span("hybridrag.highlights", {"passages": len(chunks)}):
            if q.query_tokens is None:  # a cached result: the query's token vectors were not needed until now
                _, q.query_tokens, _ = await q.runner.embed_query(q.request.query)
            tokens = q.query_tokens
            assert tokens is not None
            index: Any = result.index
            doc_of = dict(zip(result.hits.chunk.tolist(), result.hits.doc.tolist(), strict=True))
            texts = [(index.documents[doc_of[c]].title, index.passage(c)) for c in chunks]
            late = q.index.late if result.index is q.index else None  # a cached result's chunks: encode them
            found = await q.runner.call(self.compute, texts, tokens, late, chunks)
        result.timings_ms[self.name] = ms_since(t)
        return dict(zip(chunks, found, strict=True))
