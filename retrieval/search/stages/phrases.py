"""Quoted phrases: ``"exact phrase"`` in a query is honoured on the candidates' text already at hand (no positional
index). The phrase's words go to BM25 and the embedder with the rest of the query, as typed; then a candidate whose
passage holds every phrase verbatim (case and runs of whitespace normalised) is moved ahead of those that do not
(``first_stage.phrases = "boost"``), or the others are dropped (``"require"``). It runs on the first stage's list,
so the rerankers see the phrase matches in their head, and again on the final list, so they cannot bury them.

Bounded: at most :data:`MAX_PHRASES` phrases of at most :data:`MAX_PHRASE_CHARS` characters each; unbalanced quotes
mean no phrase (the query is plain text); each candidate costs at most :data:`MAX_CHUNKS_PER_DOC` passages' text
(its own chunk, the chunk BM25 ranked it by, then its document's others), and a query at most
:data:`MAX_CHECKED_CHARS` characters in all."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from index_builder.types import Hits
from retrieval.search.stages.query import Query

MAX_PHRASES = 4
MAX_PHRASE_CHARS = 200
MAX_CHUNKS_PER_DOC = 16
MAX_CHECKED_CHARS = 2_000_000  # ~1 ms of casefolding per 100 KB: a few ms a query at most
MODES = ("off", "boost", "require")


def normalise(text: str) -> str:
    """Casefolded, each run of whitespace one space.

    >>> normalise("  Exact\\n  PHRASE ")
    'exact phrase'
    """
    return " ".join(text.casefold().split())


def parse_phrases(query: str) -> list[str]:
    """The quoted phrases of ``query`` (straight or curly double quotes), normalised; none when the quotes are
    unbalanced, and only the first :data:`MAX_PHRASES` of at most :data:`MAX_PHRASE_CHARS` characters (a longer
    one is plain text). Linear time: one pass of ``str.split``.

    >>> parse_phrases('error "No space left" on "/dev/sda1"')
    ['no space left', '/dev/sda1']
    >>> parse_phrases('an "unbalanced quote'), parse_phrases('""'), parse_phrases('“curly quotes”')
    ([], [], ['curly quotes'])
    """
    text = query.replace("“", '"').replace("”", '"')
    pieces = text.split('"')
    if len(pieces) < 3 or len(pieces) % 2 == 0:
        return []
    phrases = []
    for piece in pieces[1::2]:
        if len(piece) > MAX_PHRASE_CHARS:
            continue
        phrase = normalise(piece)
        if phrase and phrase not in phrases:
            phrases.append(phrase)
            if len(phrases) == MAX_PHRASES:
                break
    return phrases


def candidate_chunks(hits: Hits, other_chunk: dict[int, int], starts: np.ndarray | None) -> list[list[int]]:
    """Each candidate's chunks to read, best guesses first: its own, BM25's for it, then the document's others
    (``starts``: each document's first chunk, n_docs + 1; None: the first two only), at most
    :data:`MAX_CHUNKS_PER_DOC`."""
    out = []
    for d, c in zip(hits.doc.tolist(), hits.chunk.tolist(), strict=True):
        rest = range(int(starts[d]), min(int(starts[d + 1]), int(starts[d]) + MAX_CHUNKS_PER_DOC)) \
            if starts is not None and d + 1 < len(starts) else ()
        out.append([x for x in dict.fromkeys((c, other_chunk.get(d, -1), *rest)) if x >= 0][:MAX_CHUNKS_PER_DOC])
    return out


def holds_phrases(chunks: list[list[int]], phrases: list[str], passage: Callable[[int], str]) -> np.ndarray:
    """bool [len(chunks)]: whether one of each candidate's ``chunks`` (``passage(chunk) -> str``) holds every
    phrase; reading stops after :data:`MAX_CHECKED_CHARS` characters in all (the rest count as not holding)."""
    found = np.zeros(len(chunks), dtype=bool)
    budget = MAX_CHECKED_CHARS
    for i, candidates in enumerate(chunks):
        for chunk in candidates:
            text = passage(chunk)
            budget -= len(text)
            if budget < 0:
                return found
            text = normalise(text)
            if all(p in text for p in phrases):
                found[i] = True
                break
    return found


def apply_phrases(q: Query, hits: Hits, mode: str) -> Hits:
    """``hits`` with the candidates holding the query's phrases first (``boost``; each group keeps its order, and
    the scores are shifted so they still descend), or only those (``require``). Unchanged when the query has no
    phrase or ``mode`` is ``off``; ``q.result.phrases`` records the phrases and how many candidates hold them."""
    phrases = parse_phrases(q.request.query) if mode != "off" else []
    if not phrases or not len(hits):
        return hits
    bm25 = q.result.stages.get("bm25")
    other = dict(zip(bm25.doc.tolist(), bm25.chunk.tolist(), strict=True)) if bm25 is not None else {}
    chunks = candidate_chunks(hits, other, getattr(q.index, "starts", None))  # an engine's view has no starts
    found = holds_phrases(chunks, phrases, q.index.passage_with_title)
    if mode == "require":
        return Hits(hits.doc[found], hits.scores[found], hits.chunk[found])
    if found.all() or not found.any():
        return hits
    order = np.concatenate([np.flatnonzero(found), np.flatnonzero(~found)])
    scores = hits.scores.astype(np.float32).copy()
    scores[found] += float(scores.max() - scores[found].min()) + 1.0
    return Hits(hits.doc[order], scores[order], hits.chunk[order])
