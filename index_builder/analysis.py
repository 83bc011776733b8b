"""Lucene-like text analysis for BM25: tokenise, lowercase, drop English stopwords, stem (PyStemmer / Snowball).

Mirrors Lucene's ``EnglishAnalyzer`` chain as Pyserini uses it for BEIR ("flat" indexes): standard tokenisation,
possessive removal, lowercasing, Lucene's 33 English stopwords, Porter-family stemming.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import Stemmer

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET.
LUCENE_ENGLISH_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with".split()
)

# Word characters joined by inner apostrophes or dots ("don't", "3.5", "u.s"), like Lucene's StandardTokenizer.
_TOKEN_RE = re.compile(r"[^\W_]+(?:['’.][^\W_]+)*")


@dataclass(frozen=True)
class AnalyzerConfig:
    """``stemmer``: a PyStemmer algorithm ("porter", "english" = Porter2, ...) or "none"."""

    stemmer: str = "porter"
    stopwords: str = "lucene"  # "lucene" or "none"
    lowercase: bool = True

    def __post_init__(self) -> None:
        if self.stemmer != "none" and self.stemmer not in Stemmer.algorithms():
            raise ValueError(f"unknown stemmer {self.stemmer!r}; choose 'none' or one of {Stemmer.algorithms()}")
        if self.stopwords not in ("lucene", "none"):
            raise ValueError(f"unknown stopwords {self.stopwords!r}; choose 'lucene' or 'none'")


class Analyzer:
    """Turns text into BM25 terms. Thread-safe: each call builds its own stemmer state via PyStemmer's cache."""

    def __init__(self, config: AnalyzerConfig = AnalyzerConfig()) -> None:
        self.config = config
        self._stop = LUCENE_ENGLISH_STOPWORDS if config.stopwords == "lucene" else frozenset()

    @cached_property
    def _stemmer_algorithm(self) -> str | None:
        return None if self.config.stemmer == "none" else self.config.stemmer

    def __call__(self, text: str) -> list[str]:
        """Terms of one text, in order (repeats kept: BM25 counts a repeated query term twice, as Lucene does).

        >>> Analyzer()("The cats' running quickly, don't they?")
        ['cat', 'run', 'quickli', "don't"]
        """
        if self.config.lowercase:
            text = text.lower()
        tokens = []
        for tok in _TOKEN_RE.findall(text):
            if tok.endswith(("'s", "’s")):
                tok = tok[:-2]
            if tok and tok not in self._stop:
                tokens.append(tok)
        if self._stemmer_algorithm is None:
            return tokens
        # A Stemmer object is not thread-safe; creating one is cheap (microseconds).
        return Stemmer.Stemmer(self._stemmer_algorithm).stemWords(tokens)

    def batch(self, texts: list[str]) -> list[list[str]]:
        stemmer = None if self._stemmer_algorithm is None else Stemmer.Stemmer(self._stemmer_algorithm, 100_000)
        out = []
        for text in texts:
            if self.config.lowercase:
                text = text.lower()
            toks = [t[:-2] if t.endswith(("'s", "’s")) else t for t in _TOKEN_RE.findall(text)]
            toks = [t for t in toks if t and t not in self._stop]
            out.append(stemmer.stemWords(toks) if stemmer else toks)
        return out

    def settings(self) -> dict[str, object]:
        return {"tokenizer": "lucene-standard-like", "lowercase": self.config.lowercase,
                "stopwords": self.config.stopwords, "stemmer": self.config.stemmer}
