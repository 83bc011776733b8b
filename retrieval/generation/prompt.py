"""Prompt assembly for Generate, laid out for prefix caching.

Order: the fixed system prompt (identical for every request, so vLLM's prefix cache and llama.cpp's KV reuse keep
it), then the context passages in retrieval rank order, each with its number and document id (for citations),
then the question last (the part that differs most between requests). The same passages give a byte-identical
prompt. The context gets a token budget: passages are added best first; the first one that does not fit is cut
at a token boundary (when at least ``min_tail_tokens`` fit) and every lower-ranked passage is dropped.

Token counting uses the generator's own tokenizer where we have it (a GGUF file's vocabulary via llama.cpp, or a
Hugging Face ``tokenizer.json``), else a conservative estimate (about 3 characters a token, cut at whitespace).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from index_builder.errors import ConfigError
from retrieval.generation.settings import DEFAULT_SYSTEM_PROMPT


class TokenCounter(Protocol):
    """Counts a text's tokens and cuts a text after its first ``n`` tokens (never inside a token)."""

    name: str

    def count(self, text: str) -> int: ...

    def truncate(self, text: str, n: int) -> str: ...


class HeuristicCounter:
    """No tokenizer at hand: words and punctuation, at least one token per 3 characters (an over-estimate for
    English on BPE vocabularies, so the budget holds). Cuts only at piece boundaries.

    >>> c = HeuristicCounter()
    >>> c.count("Vitamin D deficiency"), c.truncate("Vitamin D deficiency", 4)
    (8, 'Vitamin D ')
    """

    name = "heuristic"
    _pieces = re.compile(r"\S+\s*|\s+")

    def _costs(self, text: str) -> list[tuple[str, int]]:
        return [(p, max(1, -(-len(p.strip()) // 3))) for p in self._pieces.findall(text)]

    def count(self, text: str) -> int:
        return sum(c for _, c in self._costs(text))

    def truncate(self, text: str, n: int) -> str:
        out, used = [], 0
        for piece, cost in self._costs(text):
            if used + cost > n:
                break
            out.append(piece)
            used += cost
        return "".join(out)


class HFTokenizerCounter:
    """A Hugging Face ``tokenizer.json`` (vLLM serves models that ship one)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))
        self._tok.no_truncation()
        self.name = f"tokenizer.json:{Path(path).parent.name}"

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def truncate(self, text: str, n: int) -> str:
        enc = self._tok.encode(text, add_special_tokens=False)
        if len(enc.ids) <= n:
            return text
        return text[:enc.offsets[n - 1][1]] if n > 0 else ""


class GGUFCounter:
    """The vocabulary of a GGUF model, loaded without its weights (llama.cpp ``vocab_only``): exact counts for the
    embedded model."""

    def __init__(self, path: str | Path) -> None:
        try:
            from llama_cpp import Llama
            from llama_cpp._utils import suppress_stdout_stderr
        except ImportError:
            raise ConfigError("counting tokens with a GGUF vocabulary needs llama-cpp-python") from None
        with suppress_stdout_stderr(disable=False):  # llama.cpp prints context warnings meant for generation
            self._llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.name = f"gguf:{Path(path).name}"

    def _ids(self, text: str) -> list[int]:
        return self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def count(self, text: str) -> int:
        return len(self._ids(text))

    def truncate(self, text: str, n: int) -> str:
        ids = self._ids(text)
        if len(ids) <= n:
            return text
        # Detokenising a prefix of whole tokens cuts between tokens; a multi-byte character split by the cut is dropped.
        return self._llm.detokenize(ids[:max(n, 0)]).decode("utf-8", errors="ignore")


def make_counter(path: str | Path | None) -> TokenCounter:
    """``*.gguf`` -> its vocabulary; a ``tokenizer.json`` file or a folder holding one -> HF tokenizers; None/"" ->
    the heuristic."""
    if not path:
        return HeuristicCounter()
    p = Path(path)
    if p.suffix == ".gguf":
        return GGUFCounter(p)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise ConfigError(f"generation tokenizer not found: {path} (a .gguf file, a tokenizer.json, or a folder with one)")
    return HFTokenizerCounter(p)


@dataclass(frozen=True)
class ContextPassage:
    doc_id: str
    title: str
    text: str


@dataclass(frozen=True)
class Prompt:
    messages: list[dict[str, str]]
    passages_used: int  # how many of the given passages are in the context (the last one possibly cut)
    truncated: bool  # the last passage used was cut to fit the budget
    context_tokens: int  # tokens of the context blocks, by the counter
    question_truncated: bool = False  # the question was cut to max_question_tokens


def format_passage(number: int, p: ContextPassage) -> str:
    title = f" {p.title.strip()}" if p.title.strip() else ""
    return f"[{number}] (doc {p.doc_id}){title}\n{p.text.strip()}"


def build_prompt(question: str, passages: Sequence[ContextPassage], *, counter: TokenCounter, budget_tokens: int,
                 system_prompt: str = DEFAULT_SYSTEM_PROMPT, min_tail_tokens: int = 32,
                 max_question_tokens: int = 0) -> Prompt:
    """Chat messages for ``question`` over ``passages`` (best first), the context within ``budget_tokens``; the
    question cut to ``max_question_tokens`` when > 0."""
    question = question.strip()
    question_truncated = False
    if max_question_tokens > 0 and counter.count(question) > max_question_tokens:
        question, question_truncated = counter.truncate(question, max_question_tokens).rstrip(), True
    blocks: list[str] = []
    used = 0
    truncated = False
    for i, p in enumerate(passages, start=1):
        block = format_passage(i, p)
        sep = 2 if blocks else 0  # the blank line between blocks
        cost = counter.count(block) + sep
        if used + cost <= budget_tokens:
            blocks.append(block)
            used += cost
            continue
        room = budget_tokens - used - sep
        if room >= min_tail_tokens:
            cut = counter.truncate(block, room).rstrip()
            blocks.append(cut)
            used += counter.count(cut) + sep
            truncated = True
        break
    context = "\n\n".join(blocks) if blocks else "(no passages were found)"
    user = f"Context:\n\n{context}\n\nQuestion: {question}"
    return Prompt([{"role": "system", "content": system_prompt}, {"role": "user", "content": user}],
                  passages_used=len(blocks), truncated=truncated, context_tokens=used,
                  question_truncated=question_truncated)
