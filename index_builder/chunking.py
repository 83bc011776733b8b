"""Split long documents into overlapping token windows; every chunk knows its document and character span.

Windows are counted in the embedder's word pieces (so a chunk fits the model) and snapped to whole words. A
document no longer than one window is a single chunk holding its whole text.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from index_builder.settings import ChunkConfig  # noqa: F401  (re-exported)
from index_builder.types import Document

MAX_SNAP = 16  # word pieces a window may grow or shift to reach a word boundary (URLs, unspaced scripts)
CHUNK_DTYPE = np.dtype([("doc", np.int32), ("start", np.int32), ("end", np.int32)])


def chunk_passage(title: str, text: str) -> str:
    """The text that BM25 and the encoders see for a chunk: its document's title, then the chunk's text."""
    return f"{title}\n{text}" if title else text


class Chunker:
    def __init__(self, tokenizer_path: Path, config: ChunkConfig | None = None) -> None:
        self.config = config = config if config is not None else ChunkConfig()
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Character spans of the chunks of one text.

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
