"""Quoted phrases: ``"exact phrase"`` in a query is honoured on the candidates' text already at hand (no positional
index). The phrase's words go to BM25 and the embedder with the rest of the query, as typed; then a candidate whose
passage holds every phrase verbatim (case and runs of whitespace normalised) is moved ahead of those that do not
(``first_stage.phrases = "boost"``), or the others are dropped (``"require"``). It runs on the first stage's list,
so the rerankers see the phrase matches in their head, and again on the final list, so they cannot bury them.

Bounded: at most :data:`MAX_PHRASES` phrases of at most :data:`MAX_PHRASE_CHARS` characters each; unbalanced quotes
mean no phrase (the query is plain text); each candidate costs at most two passages' text (its own chunk, and the
chunk BM25 ranked it by), each a chunk of the index (hundreds of words)."""

from __future__ import annotations

import numpy as np

from index_builder.types import Hits
from retrieval.search.stages.query import Query

MAX_PHRASES = 4
MAX_PHRASE_CHARS = 200
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
    return phrases[:MAX_PHRASES]


def holds_phrases(hits: Hits, phrases: list[str], passage, other_chunk: dict[int, int]) -> np.ndarray:
    """bool [len(hits)]: whether each candidate's passage (``passage(chunk) -> str``), or the passage of
    ``other_chunk[doc]`` (BM25's chunk for it), holds every phrase."""
    found = np.zeros(len(hits), dtype=bool)
    for i, (d, c) in enumerate(zip(hits.doc.tolist(), hits.chunk.tolist(), strict=True)):
        for chunk in dict.fromkeys(x for x in (c, other_chunk.get(d, -1)) if x >= 0):
            text = normalise(passage(chunk))
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
    found = holds_phrases(hits, phrases, q.index.passage_with_title, other)
    if mode == "require":
        return Hits(hits.doc[found], hits.scores[found], hits.chunk[found])
    if found.all() or not found.any():
        return hits
    order = np.concatenate([np.flatnonzero(found), np.flatnonzero(~found)])
    scores = hits.scores.astype(np.float32).copy()
    scores[found] += float(scores.max() - scores[found].min()) + 1.0
    return Hits(hits.doc[order], scores[order], hits.chunk[order])
