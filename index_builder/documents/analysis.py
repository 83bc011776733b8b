"""Lucene-like text analysis for BM25: tokenise, lowercase, drop English stopwords, stem (PyStemmer / Snowball).

Mirrors Lucene's ``EnglishAnalyzer`` chain as Pyserini uses it for BEIR ("flat" indexes): standard tokenisation,
possessive removal, lowercasing, Lucene's 33 English stopwords, Porter-family stemming.

With ``identifiers`` on, a span of word characters joined by ``_`` or ``-`` (``--preserve-root``,
``USE_CURL_FOR_IMAP_SEND``, ``opts.worker_threads``) gives its parts (analysed as above) and, beside them, the whole
span lowercased and unstemmed (leading dashes and outer underscores dropped) and the dotted terms the plain analysis
makes of it, as Elasticsearch's ``word_delimiter_graph`` with ``preserve_original`` does: the parts still match a
partial query, and the whole is a rare term that an exact query matches. A span joined by dots only (``os.path.join``,
``v2.14.6``, ``3.5``) stays the one term Lucene makes of it: split, its parts put every file that mentions ``path``
beside the one that holds ``os.path.join``, and the fused list lost it (dotted success@1 of the default 0.93 -> 0.83,
docs/results/query-analysis.md). Text without such spans is analysed exactly as without the option.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import Stemmer

from index_builder.settings import AnalyzerConfig  # noqa: F401  (re-exported)

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET.
LUCENE_ENGLISH_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with".split()
)

# Word characters joined by inner apostrophes or dots ("don't", "3.5", "u.s"), like Lucene's StandardTokenizer.
_TOKEN_RE = re.compile(r"[^\W_]+(?:['’.][^\W_]+)*")
# With ``identifiers``: spans of word characters (underscore included) joined by dots or dashes, and the separators
# that split a span into parts. Both linear-time (no nested quantifier can backtrack over the same characters).
_SPAN_RE = re.compile(r"[\w'’]+(?:[.\-]+[\w'’]+)*")
_SPLIT_RE = re.compile(r"[._\-]+")
_VERSION_RE = re.compile(r"v?\d+(?:\.\d+)+[a-z]{0,3}\d*")  # 3.5, v2.14.6, 1.2rc1: one term, as Lucene keeps it
PLAIN_TOKENIZER, IDENTIFIER_TOKENIZER = "lucene-standard-like", "lucene-standard-like+identifiers"
MAX_WHOLE = 64  # a longer span keeps only its parts (bounds the vocabulary that runs of joined words could add)


class Analyzer:
    """Turns text into BM25 terms. Thread-safe: each call builds its own stemmer state via PyStemmer's cache."""

    def __init__(self, config: AnalyzerConfig | None = None) -> None:
        self.config = config = config if config is not None else AnalyzerConfig()
        self._stop = LUCENE_ENGLISH_STOPWORDS if config.stopwords == "lucene" else frozenset()

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> Analyzer:
        """The analyzer a snapshot's manifest records (:meth:`settings`); one recorded before ``identifiers``
        existed has the plain tokenizer."""
        keys: dict[str, Any] = {k: settings[k] for k in ("stemmer", "stopwords", "lowercase") if k in settings}
        return cls(AnalyzerConfig(**keys, identifiers=settings.get("tokenizer") == IDENTIFIER_TOKENIZER))

    def _words(self, text: str) -> list[str]:
        """Unstemmed terms: tokenise, drop possessives and stopwords (``text`` already lowercased if configured)."""
        toks = [t[:-2] if t.endswith(("'s", "’s")) else t for t in _TOKEN_RE.findall(text)]
        return [t for t in toks if t and t not in self._stop]

    def _split(self, text: str) -> tuple[list[str], list[str]]:
        """``identifiers``: (the parts, analysed as words; the whole identifiers, kept as they are). The spans
        without a joiner (most of a text) are analysed together, in one pass, as without the option."""
        plain: list[str] = []
        parts: list[str] = []
        wholes: list[str] = []
        for span in _SPAN_RE.findall(text):
            if not ("_" in span or "-" in span) or _VERSION_RE.fullmatch(span):
                plain.append(span)
                continue
            for piece in _SPLIT_RE.split(span):
                parts.extend(self._words(piece))
            # the span, and the dotted terms the plain analysis makes of it ("certificates.crt" of
            # "ca-certificates.crt"), so that what matched before still matches
            for whole in dict.fromkeys([span.strip("_"), *(t for t in self._words(span) if "." in t)]):
                if 2 < len(whole) <= MAX_WHOLE and _SPLIT_RE.search(whole):
                    wholes.append(whole)
        return self._words(" ".join(plain)) + parts, wholes

    def _terms(self, text: str, stemmer: Stemmer.Stemmer | None) -> list[str]:
        """Terms: tokenise, lowercase, drop possessives and stopwords, stem (with ``identifiers``, the whole
        identifiers follow the parts, unstemmed)."""
        if self.config.lowercase:
            text = text.lower()
        parts, wholes = self._split(text) if self.config.identifiers else (self._words(text), [])
        return (stemmer.stemWords(parts) if stemmer else parts) + wholes

    def _stemmer(self, cache_size: int = 0) -> Stemmer.Stemmer | None:
        # A Stemmer object is not thread-safe; creating one per call is cheap (microseconds).
        return None if self.config.stemmer == "none" else Stemmer.Stemmer(self.config.stemmer, cache_size)

    def __call__(self, text: str) -> list[str]:
        """Terms of one text, in order (repeats kept: BM25 counts a repeated query term twice, as Lucene does).

        >>> Analyzer()("The cats' running quickly, don't they?")
        ['cat', 'run', 'quickli', "don't"]
        """
        return self._terms(text, self._stemmer())

    def batch(self, texts: list[str]) -> list[list[str]]:
        """Terms of many texts, sharing one stemmer with a large cache (corpus indexing)."""
        stemmer = self._stemmer(100_000)
        return [self._terms(t, stemmer) for t in texts]

    def settings(self) -> dict[str, object]:
        """What a manifest records (and a server checks): the tokenizer names the identifier option, so a snapshot
        built before it (plain tokenizer) still loads under the option's off setting."""
        tokenizer = IDENTIFIER_TOKENIZER if self.config.identifiers else PLAIN_TOKENIZER
        return {"tokenizer": tokenizer, "lowercase": self.config.lowercase,
                "stopwords": self.config.stopwords, "stemmer": self.config.stemmer}
