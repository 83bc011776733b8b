"""Highlights: the sentences of a passage that late interaction's token similarities point at.

Late interaction knows, for every query token, how similar each passage token is (``sims`` [t, q]). A sentence's
score is its windowed MaxSim: each query token's best similarity among the sentence's tokens, summed over the query
tokens, i.e. the MaxSim the passage would have if it were only that sentence (the same measure
:func:`rerank.windows.best_window` uses for fixed-width windows). The best one or two sentences are a quote that
answers the query, found in microseconds from similarities the ranking already computed (or one encoder pass of
the returned passages where the stored token vectors were pooled and have no positions).

The splitter is deliberately simple and robust for documentation text: paragraph breaks, bullet and heading lines,
a line ending with ``:``, and ``.``/``?``/``!`` followed by white space and a character that is not lower case
(so hard-wrapped man page lines and ``e.g. tar`` stay inside one sentence); an option's own line (``-C,
--directory=DIR``) stays with the text that follows it, which is how man pages and ``--help`` texts define
options. Pure Python and numpy.

Cost is bounded per passage: only its first :data:`MAX_CHARS` characters are split, tokenized and scored (a passage
is bounded in word pieces, not characters: 900,000 characters of mostly spaces made one passage, and its highlights
cost 23-61x a request's p50), the splitter looks back a bounded window for an abbreviation (it copied the text up
to every sentence end: quadratic), and scoring visits only sentences that hold a token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# A break after sentence-final punctuation (and closing quotes/brackets): white space, then not a lower-case letter.
_END = re.compile(r"""[.?!]['")\]]*(?=\s+(?![a-z]))""")
_PARAGRAPH = re.compile(r"\n[ \t]*\n\s*")
# A new line that starts a bullet, a numbered item, a heading or a table row, or follows a line ending with ':'.
_LINE_START = re.compile(r"(?:(?<=:)[ \t]*\n|\n(?=[ \t]*(?:[-*+\u2022#|>]\s|\d{1,3}[.)]\s|#)))")
# A line that names an option (man pages, --help texts), with its description after a blank line or line break.
_TERM = re.compile(r"-{1,2}[A-Za-z0-9\[][^\n]{0,78}(?<![.?!:;,])")
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "approx.", "no.", "fig.", "mr.", "dr.", "st.")
_LOOKBACK = 16  # characters before a sentence end read for its last word: the longest abbreviation is 7
# Characters of a passage that highlights consider. 224 word pieces of real text are at most ~8,700 characters on
# SciFact and NFCorpus (p99 2,600); a longer passage is mostly white space or unbroken strings, whose later
# sentences the encoder's window rarely reaches anyway.
MAX_CHARS = 10_000


@dataclass(frozen=True)
class Highlight:
    """A sentence of the passage: characters ``[start, end)`` of its text and its windowed MaxSim ``score``."""

    start: int
    end: int
    score: float


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """The sentences of ``text`` as character spans ``[start, end)``, in order, stripped of surrounding white space.

    >>> t = "Use tar -x to extract. Give -C DIR to extract elsewhere, e.g. into /tmp!\\n\\n- one\\n- two"
    >>> [t[a:b] for a, b in sentence_spans(t)]
    ['Use tar -x to extract.', 'Give -C DIR to extract elsewhere, e.g. into /tmp!', '- one', '- two']
    >>> t = "       -C, --directory=DIR\\n              Change to DIR before\\n       performing operations.  Next one"
    >>> [t[a:b] for a, b in sentence_spans(t)]
    ['-C, --directory=DIR\\n              Change to DIR before\\n       performing operations.', 'Next one']
    >>> t = "       -s, --signal=SIGNAL\\n\\n              specify the signal to be sent on timeout;\\n\\n  -k N"
    >>> [t[a:b] for a, b in sentence_spans(t)]  # an option's line and its text are one sentence
    ['-s, --signal=SIGNAL\\n\\n              specify the signal to be sent on timeout;', '-k N']
    >>> sentence_spans("   ")
    []
    """
    cuts = {0, len(text)}
    for pattern in (_PARAGRAPH, _LINE_START):
        cuts.update(m.start() for m in pattern.finditer(text))
    for m in _END.finditer(text):
        before = text[max(0, m.end() - _LOOKBACK):m.end()]  # ends with the punctuation: never only white space
        word = before.rsplit(None, 1)[-1].lower()
        # "e.g.", "etc.", a single letter ("J. Smith"); a word the window cuts is longer than any of them
        if word.endswith(_ABBREVIATIONS) or re.fullmatch(r"\(?[a-z]\.", word):
            continue
        cuts.add(m.end())
    out: list[tuple[int, int]] = []
    bounds = sorted(cuts)
    term = False  # the previous piece is an option's own line ("-s, --signal=SIGNAL"): its text follows it
    for a, b in zip(bounds, bounds[1:], strict=False):
        piece = text[a:b]
        stripped = piece.strip()
        if stripped:
            lead = len(piece) - len(piece.lstrip())
            if term:
                out[-1] = (out[-1][0], a + lead + len(stripped))
            else:
                out.append((a + lead, a + lead + len(stripped)))
            term = bool(_TERM.fullmatch(stripped)) and not term
    return out


def highlight_sentences(text: str, offsets: np.ndarray, sims: np.ndarray, top: int = 2,
                        keep_ratio: float = 0.9, max_chars: int = MAX_CHARS) -> list[Highlight]:
    """The best sentences of ``text`` by windowed MaxSim, best first: at most ``top``, the second and later only
    when their score is at least ``keep_ratio`` times the best's. Only ``text[:max_chars]`` is considered (a
    sentence running past it ends there).

    ``offsets``: int [t, 2], each token's character span in ``text`` (tokens outside it, e.g. a title the encoder
    saw before the passage, carry negative offsets and are ignored); ``sims``: float [t, q], the same tokens x the
    query's tokens. A sentence is scored by the tokens that start inside it; sentences with no token (the encoder
    cut the passage before them) are not scored. Empty when nothing can be scored.

    >>> text = "Tar stores files. Use -C to change the directory. See also cpio."
    >>> offsets = np.array([[0, 3], [4, 10], [11, 16], [18, 21], [22, 24], [38, 41], [50, 53], [59, 63]])
    >>> sims = np.array([[.9, .1], [.3, .1], [.2, .1], [.1, .2], [.2, .6], [.2, .9], [.1, .1], [.3, .1]])
    >>> h = highlight_sentences(text, offsets, sims, top=1)
    >>> [(text[x.start:x.end], round(x.score, 2)) for x in h]
    [('Use -C to change the directory.', 1.1)]
    >>> [text[x.start:x.end] for x in highlight_sentences(text, offsets, sims, top=2, keep_ratio=0.9)]
    ['Use -C to change the directory.', 'Tar stores files.']
    """
    sims = np.asarray(sims, dtype=np.float32)
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    if sims.ndim != 2 or not len(sims) or not sims.shape[1] or len(offsets) != len(sims):
        return []
    spans = sentence_spans(text[:max_chars])
    if not spans:
        return []
    starts = offsets[:, 0]
    bounds = np.array([a for a, _ in spans], dtype=np.int64)
    ends = np.array([b for _, b in spans], dtype=np.int64)
    sentence = np.searchsorted(bounds, starts, side="right") - 1  # the sentence each token starts in
    rows = (starts >= 0) & (offsets[:, 1] > starts) & (sentence >= 0)
    rows[rows] &= starts[rows] < ends[sentence[rows]]  # not in the white space after its sentence
    if not rows.any():
        return []
    order = np.argsort(sentence[rows], kind="stable")  # the tokens grouped by sentence, at most one pass each
    held, first = np.unique(sentence[rows][order], return_index=True)
    best_per_query_token = np.maximum.reduceat(sims[rows][order], first, axis=0)
    scored = [(float(best_per_query_token[j].sum()), int(i), int(bounds[i]), int(ends[i])) for j, i in enumerate(held)]
    scored.sort(key=lambda s: (-s[0], s[1]))
    best = scored[0][0]
    out = [Highlight(scored[0][2], scored[0][3], scored[0][0])]
    for score, _, a, b in scored[1:top]:
        if score >= keep_ratio * best:
            out.append(Highlight(a, b, score))
    return out
