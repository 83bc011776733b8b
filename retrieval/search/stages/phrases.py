"""Quoted phrases: ``"exact phrase"`` in a query is honoured on the candidates' text already at hand (no positional
index). The phrase's words go to BM25 and the embedder with the rest of the query, as typed; then a candidate whose
passage holds every phrase verbatim (case and runs of whitespace normalised) is moved ahead of those that do not
(``first_stage.phrases = "boost"``), or the others are dropped (``"require"``). It runs on the first stage's list,
so the rerankers see the phrase matches in their head, and again on the final list, so they cannot bury them.

Bounded: at most :data:`MAX_PHRASES` phrases of at most :data:`MAX_PHRASE_CHARS` characters each; unbalanced quotes
mean no phrase (the query is plain text); each candidate costs one read of its document (at most
:data:`MAX_DOC_CHARS`; a longer one: its own passage and BM25's), a query at most :data:`MAX_CHECKED_CHARS`
characters in all."""

from __future__ import annotations

import re

import numpy as np

from index_builder.types import Hits
from retrieval.search.stages.query import Query
from retrieval.search.view import IndexView

MAX_PHRASES = 4
MAX_PHRASE_CHARS = 200
MAX_DOC_CHARS = 65_536  # a longer document is checked on its candidate passages only
MAX_CHECKED_CHARS = 2_000_000  # a pattern search reads ~1 GB/s: about a millisecond a query at most
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


def phrase_pattern(phrase: str) -> re.Pattern[str]:
    r"""A normalised phrase as a case-insensitive pattern over raw text, its words apart by any whitespace: a
    literal sequence (no backtracking), searched in C without normalising each passage first.

    >>> bool(phrase_pattern("no space left").search("write: No  space\n left on device"))
    True
    """
    return re.compile(r"\s+".join(map(re.escape, phrase.split(" "))), re.IGNORECASE)


def holds_phrases(hits: Hits, patterns: list[re.Pattern[str]], index: IndexView, other_chunk: dict[int, int],
                  known: dict[int, bool] | None = None) -> np.ndarray:
    """bool [len(hits)]: whether each candidate holds every phrase: its document's title and text when at most
    :data:`MAX_DOC_CHARS` long (one read of the document: a phrase across a chunk boundary counts), else its own
    passage or the one BM25 ranked it by (``other_chunk``); reading stops after :data:`MAX_CHECKED_CHARS`
    characters in all (the rest count as not holding). ``known``: answers by document, read and filled (a second
    pass over the same query's candidates reads nothing)."""
    found = np.zeros(len(hits), dtype=bool)
    budget = MAX_CHECKED_CHARS
    known = {} if known is None else known
    for i, (d, c) in enumerate(zip(hits.doc.tolist(), hits.chunk.tolist(), strict=True)):
        if d in known:
            found[i] = known[d]
            continue
        doc = index.documents[d]
        if len(doc.text) <= MAX_DOC_CHARS:
            texts = [f"{doc.title}\n{doc.text}"]
        else:
            texts = [index.passage_with_title(x) for x in dict.fromkeys((c, other_chunk.get(d, -1))) if x >= 0]
        for text in texts:
            budget -= len(text)
            if budget < 0:
                return found
            if all(p.search(text) for p in patterns):
                found[i] = True
                break
        known[d] = bool(found[i])
    return found


def apply_phrases(q: Query, hits: Hits, mode: str, known: dict[int, bool] | None = None) -> Hits:
    """``hits`` with the candidates holding the query's phrases first (``boost``; each group keeps its order, and
    the scores are shifted so they still descend), or only those (``require``). Unchanged when the query has no
    phrase or ``mode`` is ``off``. ``known``: the same query's answers by document (:func:`holds_phrases`)."""
    phrases = parse_phrases(q.request.query) if mode != "off" else []
    if not phrases or not len(hits):
        return hits
    bm25 = q.result.stages.get("bm25")
    other = dict(zip(bm25.doc.tolist(), bm25.chunk.tolist(), strict=True)) if bm25 is not None else {}
    found = holds_phrases(hits, [phrase_pattern(p) for p in phrases], q.index, other, known)
    if mode == "require":
        return Hits(hits.doc[found], hits.scores[found], hits.chunk[found])
    if found.all() or not found.any():
        return hits
    order = np.concatenate([np.flatnonzero(found), np.flatnonzero(~found)])
    scores = hits.scores.astype(np.float32).copy()
    scores[found] += float(scores.max() - scores[found].min()) + 1.0
    return Hits(hits.doc[order], scores[order], hits.chunk[order])
