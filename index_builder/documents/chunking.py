"""Split long documents into overlapping token windows; every chunk knows its document and character span.

Windows are counted in the embedder's word pieces (so a chunk fits the model) and snapped to whole words. A
document no longer than one window is a single chunk holding its whole text.

A document read from a file (:mod:`index_builder.documents.folder`) holds sections separated by a form feed
(``SECTION_BREAK``). Its chunks never straddle two sections: each section is chunked alone, by whole paragraphs
(blank-line separated) packed up to the window, and only a paragraph longer than a window is cut into overlapping
windows as above. Text without a form feed (every JSONL corpus) is chunked exactly as before.

Every chunk is also bounded in characters (``MAX_CHARS_PER_PIECE`` per word piece of the window, 3,584 at the
default 224): whitespace and punctuation make no word pieces, so a window of 224 pieces over a document of 900,000
mostly-space characters spanned all of it, one passage of 900 KB. A longer span is cut at whitespace into pieces
of at most that many characters, and pieces holding only whitespace are dropped. No BEIR passage comes near the
bound (SciFact's longest chunk is 1,422 characters, NFCorpus's 1,418), so their chunks are unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from index_builder.documents.readers import SECTION_BREAK
from index_builder.settings import ChunkConfig  # noqa: F401  (re-exported)
from index_builder.types import Document

MAX_SNAP = 16  # word pieces a window may grow or shift to reach a word boundary (URLs, unspaced scripts)
MAX_CHARS_PER_PIECE = 16  # a chunk's characters per word piece of its window at most (English averages 4-6)
CHUNK_DTYPE = np.dtype([("doc", np.int32), ("start", np.int32), ("end", np.int32)])
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_NON_SPACE = re.compile(r"\S")


def bound_chars(text: str, spans: list[tuple[int, int]], max_chars: int) -> list[tuple[int, int]]:
    """Spans of at most ``max_chars`` characters: a longer one is cut at its last whitespace before the bound (at
    the bound in a word longer than half of it), each piece stripped of whitespace, pieces of whitespace dropped.

    >>> bound_chars("a" + " " * 50 + "b c d", [(0, 56)], 8)
    [(0, 1), (51, 56)]
    >>> bound_chars("abcdefghij", [(0, 10)], 4)
    [(0, 4), (4, 8), (8, 10)]
    """
    out: list[tuple[int, int]] = []
    for s, e in spans:
        if e - s <= max_chars:
            out.append((s, e))
            continue
        pos = s
        while pos < e:
            m = _NON_SPACE.search(text, pos, e)
            if m is None:
                break
            pos = m.start()
            end = min(pos + max_chars, e)
            if end < e and not text[end].isspace():
                cut = max(text.rfind(" ", pos, end), text.rfind("\n", pos, end), text.rfind("\t", pos, end))
                if cut > pos + max_chars // 2:
                    end = cut
            piece_end = end
            while piece_end > pos and text[piece_end - 1].isspace():
                piece_end -= 1
            out.append((pos, piece_end))
            pos = end
    return out


def chunk_passage(title: str, text: str) -> str:
    """The text that BM25 and the encoders see for a chunk: its document's title, then the chunk's text."""
    return f"{title}\n{text}" if title else text


class Chunker:
    def __init__(self, tokenizer_path: Path, config: ChunkConfig | None = None) -> None:
        self.config = config = config if config is not None else ChunkConfig()
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.max_chars = config.max_tokens * MAX_CHARS_PER_PIECE

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Character spans of the chunks of one text: by sections and paragraphs when it holds section breaks."""
        if SECTION_BREAK not in text:
            return bound_chars(text, self.window_spans(text), self.max_chars)
        out: list[tuple[int, int]] = []
        pos = 0
        for section in text.split(SECTION_BREAK):
            out.extend(self._section_spans(section, pos))
            pos += len(section) + len(SECTION_BREAK)
        return bound_chars(text, out or [(0, len(text))], self.max_chars)

    def _pieces(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def _section_spans(self, section: str, base: int) -> list[tuple[int, int]]:
        """Whole paragraphs packed up to ``max_tokens`` pieces; a longer paragraph is cut into windows."""
        paras: list[tuple[int, int]] = []
        start = 0
        for m in _PARAGRAPH_BREAK.finditer(section):
            paras.append((start, m.start()))
            start = m.end()
        paras.append((start, len(section)))
        paras = [(s + (len(section[s:e]) - len(section[s:e].lstrip())), e - (len(section[s:e]) - len(section[s:e].rstrip())))
                 for s, e in paras if section[s:e].strip()]
        size = self.config.max_tokens
        out: list[tuple[int, int]] = []
        cur: tuple[int, int] | None = None
        cur_pieces = 0
        for s, e in paras:
            n = self._pieces(section[s:e])
            if n > size:  # a paragraph longer than a window: flush, then its own windows
                if cur is not None:
                    out.append(cur)
                    cur, cur_pieces = None, 0
                out.extend((s + a, s + b) for a, b in self.window_spans(section[s:e]))
                continue
            if cur is not None and cur_pieces + n + 1 <= size:
                cur, cur_pieces = (cur[0], e), cur_pieces + n + 1
            else:
                if cur is not None:
                    out.append(cur)
                cur, cur_pieces = (s, e), n
        if cur is not None:
            out.append(cur)
        return [(base + s, base + e) for s, e in out]

    def window_spans(self, text: str) -> list[tuple[int, int]]:
        """Character spans of the overlapping windows of one text.

        Windows start every ``max_tokens - overlap`` word pieces; a start inside a whitespace-delimited word moves
        to the next word, an end inside a word moves to the end of that word.
        """
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        n = len(enc.ids)
        size, step = self.config.max_tokens, self.config.max_tokens - self.config.overlap
        if n <= size:
            return [(0, len(text))]
        offsets = enc.offsets

        def inside_word(i: int) -> bool:  # token i continues the whitespace-delimited word of token i-1
            return offsets[i][0] == offsets[i - 1][1]

        out: list[tuple[int, int]] = []
        start = 0
        while start < n:
            end = min(start + size, n)
            limit = min(n, end + MAX_SNAP)
            while end < limit and inside_word(end):
                end += 1
            span = (offsets[start][0], offsets[end - 1][1])
            if not out or span[1] > out[-1][1]:
                out.append(span)
            if end >= n:
                break
            nxt = start + step
            limit = min(n, nxt + MAX_SNAP)
            while nxt < limit and inside_word(nxt):
                nxt += 1
            start = nxt
        return out

    def chunk(self, docs: Sequence[Document], first_doc_index: int = 0) -> np.ndarray:
        """A structured array (doc, start, end) with one row per chunk, documents in order."""
        rows: list[tuple[int, int, int]] = []
        for i, d in enumerate(docs):
            spans = self.spans(d.text)
            if self.config.max_chunks_per_doc:
                spans = spans[: self.config.max_chunks_per_doc]
            for s, e in spans:
                rows.append((first_doc_index + i, s, e))
        return np.array(rows, dtype=CHUNK_DTYPE)


def chunk_passages(docs: Sequence[Document], chunks: np.ndarray) -> list[str]:
    """Each chunk's passage as it is embedded and scored (title + chunk text)."""
    return [chunk_passage(docs[c["doc"]].title, docs[c["doc"]].text[c["start"]:c["end"]]) for c in chunks]
