"""Lucene-like text analysis for BM25: tokenise, lowercase, drop English stopwords, stem (PyStemmer / Snowball).

Mirrors Lucene's ``EnglishAnalyzer`` chain as Pyserini uses it for BEIR ("flat" indexes): standard tokenisation,
possessive removal, lowercasing, Lucene's 33 English stopwords, Porter-family stemming.
"""

from __future__ import annotations

import re

import Stemmer

from index_builder.settings import AnalyzerConfig  # noqa: F401  (re-exported)

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET.
LUCENE_ENGLISH_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with".split()
)

# Word characters joined by inner apostrophes or dots ("don't", "3.5", "u.s"), like Lucene's StandardTokenizer.
_TOKEN_RE = re.compile(r"[^\W_]+(?:['’.][^\W_]+)*")


class Analyzer:
    """Turns text into BM25 terms. Thread-safe: each call builds its own stemmer state via PyStemmer's cache."""

    def __init__(self, config: AnalyzerConfig | None = None) -> None:
        self.config = config = config if config is not None else AnalyzerConfig()
        self._stop = LUCENE_ENGLISH_STOPWORDS if config.stopwords == "lucene" else frozenset()

    def _terms(self, text: str) -> list[str]:
        """Unstemmed terms: tokenise, lowercase, drop possessives and stopwords."""
        if self.config.lowercase:
            text = text.lower()
        toks = [t[:-2] if t.endswith(("'s", "’s")) else t for t in _TOKEN_RE.findall(text)]
        return [t for t in toks if t and t not in self._stop]

    def _stemmer(self, cache_size: int = 0) -> Stemmer.Stemmer | None:
        # A Stemmer object is not thread-safe; creating one per call is cheap (microseconds).
        return None if self.config.stemmer == "none" else Stemmer.Stemmer(self.config.stemmer, cache_size)

    def __call__(self, text: str) -> list[str]:
        """Terms of one text, in order (repeats kept: BM25 counts a repeated query term twice, as Lucene does).

        >>> Analyzer()("The cats' running quickly, don't they?")
        ['cat', 'run', 'quickli', "don't"]
        """
        stemmer = self._stemmer()
        terms = self._terms(text)
        return stemmer.stemWords(terms) if stemmer else terms

    def batch(self, texts: list[str]) -> list[list[str]]:
        """Terms of many texts, sharing one stemmer with a large cache (corpus indexing)."""
        stemmer = self._stemmer(100_000)
        return [stemmer.stemWords(t) if stemmer else t for t in map(self._terms, texts)]

    def settings(self) -> dict[str, object]:
        return {"tokenizer": "lucene-standard-like", "lowercase": self.config.lowercase,
                "stopwords": self.config.stopwords, "stemmer": self.config.stemmer}
