"""Synthetic training queries for a corpus without judgments (InPars / Promptagator style), for ``hybridrag train``.

- Generation: a fixed-seed sample of the corpus's documents; for each, the embedded LLM (or any OpenAI-compatible
  server, e.g. vLLM) writes one search query that the document answers, from a few-shot chat prompt with
  domain-neutral examples, greedy decoding. The answer is cleaned (first line, no "Query:" prefix or quotes) and
  dropped when it is not a usable query (:func:`clean_query`: too short, too long, or a copy of the title).
- Filter (round-trip consistency, as in Promptagator and InPars-v2's filtering step): the query is kept only when
  the project's own first stage (the fused BM25 + dense list over the corpus's index, the code that serves) ranks
  its source document in the top ``keep_top``. A query the first stage cannot map back to its document is either
  off-topic or too generic to teach the reranker anything.
- Output: a BEIR-layout folder that the trainers read as they read a judged dataset: ``corpus.jsonl`` (a symbolic
  link to the source corpus, never a copy), ``queries.jsonl`` (every usable query, ids ``syn-<n>``, with its source
  document and that document's rank in the first stage), ``qrels/train.tsv`` (each kept query judges its source
  document relevant), ``qrels/unfiltered.tsv`` (the same for every usable query: ``--split unfiltered`` trains
  without the filter, to measure it) and ``synthetic.json`` (settings, counts, timings, dropped reasons, examples).
  The trainers hold out a share of the queries as their dev split (there is no dev judgment).

No torch here: generation talks HTTP to the LLM server; the filter is the serving pipeline.
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from index_builder.errors import ConfigError
from index_builder.types import Document
from retrieval.errors import BackendUnavailable

SYSTEM = "You write one short search query that the given document answers. Reply with the query only."
# Domain-neutral few-shot examples (written for this project, not taken from any dataset).
EXAMPLES = (
    ("Aspirin use and the risk of colorectal cancer: a cohort study of 80,000 women. Regular aspirin use was "
     "associated with a lower risk of colorectal cancer after ten years of use.",
     "Does regular aspirin use lower the risk of colorectal cancer?"),
    ("Thermal expansion of railway tracks. Steel rails lengthen in summer heat; expansion joints and pre-stressing "
     "keep continuously welded track from buckling.",
     "why do railway tracks need expansion joints"),
)


@dataclass(frozen=True)
class SynthConfig:
    """``docs``: documents sampled (0 = all); ``keep_top``: the filter's depth (0 = no filter); ``passage_chars``:
    the document text shown to the LLM; ``max_tokens``: the query's length cap."""

    docs: int = 500
    seed: int = 13
    keep_top: int = 3
    passage_chars: int = 700
    max_tokens: int = 40
    min_words: int = 3
    max_words: int = 32

    def __post_init__(self) -> None:
        if self.docs < 0 or self.keep_top < 0 or self.passage_chars < 50 or self.max_tokens < 4:
            raise ConfigError("synthetic queries need docs >= 0, keep_top >= 0, passage_chars >= 50, max_tokens >= 4")
        if not 1 <= self.min_words <= self.max_words:
            raise ConfigError("synthetic queries need 1 <= min_words <= max_words")


def sample_documents(docs: Sequence[Document], n: int, seed: int) -> list[Document]:
    """``n`` documents with text (all when ``n`` is 0 or larger than the corpus), in a fixed-seed order."""
    usable = [d for d in docs if (d.title + d.text).strip()]
    order = list(range(len(usable)))
    random.Random(seed).shuffle(order)
    return [usable[i] for i in (order[:n] if n else order)]


def messages(doc: Document, passage_chars: int) -> list[dict[str, str]]:
    """The chat prompt for one document: system line, the few-shot pairs, then the document."""
    text = f"{doc.title}. {doc.text}" if doc.title else doc.text
    out = [{"role": "system", "content": SYSTEM}]
    for passage, query in EXAMPLES:
        out += [{"role": "user", "content": f"Document: {passage}\nQuery:"}, {"role": "assistant", "content": query}]
    return out + [{"role": "user", "content": f"Document: {text[:passage_chars].strip()}\nQuery:"}]


_PREFIX = re.compile(r"^\s*(?:search\s+)?(?:query|question)\s*[:\-]\s*", re.IGNORECASE)


def clean_query(raw: str, doc: Document, cfg: SynthConfig) -> tuple[str | None, str]:
    """(the query, "") or (None, why it was dropped): the first non-empty line, without a "Query:" prefix, list
    marker or surrounding quotes; between ``min_words`` and ``max_words`` words; not the document's title."""
    line = next((x.strip() for x in raw.splitlines() if x.strip()), "")
    line = _PREFIX.sub("", line)
    line = re.sub(r"^\s*(?:[-*\u2022]|\d+[.)])\s+", "", line).strip().strip("\"'\u201c\u201d`").strip()
    words = line.split()
    if not words:
        return None, "empty"
    if len(words) < cfg.min_words:
        return None, "too short"
    if len(words) > cfg.max_words:
        return None, "too long"
    if doc.title and line.rstrip("?.").strip().lower() == doc.title.rstrip("?.").strip().lower():
        return None, "copies the title"
    return line, ""


def generate(docs: Sequence[Document], complete: Callable[[list[dict[str, str]]], str], cfg: SynthConfig, *,
             log_every: int = 0) -> tuple[list[tuple[Document, str]], Counter[str]]:
    """One cleaned query per document through ``complete`` (chat messages -> reply text); returns the
    (document, query) pairs and the count of dropped answers by reason."""
    pairs: list[tuple[Document, str]] = []
    dropped: Counter[str] = Counter()
    for i, doc in enumerate(docs):
        query, why = clean_query(complete(messages(doc, cfg.passage_chars)), doc, cfg)
        if query is None:
            dropped[why] += 1
        else:
            pairs.append((doc, query))
        if log_every and (i + 1) % log_every == 0:
            print(f"generated {i + 1}/{len(docs)} ({len(pairs)} usable)", file=sys.stderr, flush=True)
    return pairs, dropped


def chat_completer(base_url: str, model: str = "", *, max_tokens: int = 40, timeout_s: float = 120.0
                   ) -> Callable[[list[dict[str, str]]], str]:
    """``complete(messages)`` over an OpenAI-compatible ``/chat/completions`` (llama.cpp's server, vLLM),
    greedy decoding."""
    import httpx

    client = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s)

    def complete(msgs: list[dict[str, str]]) -> str:
        body: dict[str, Any] = {"messages": msgs, "max_tokens": max_tokens, "temperature": 0.0}
        if model:
            body["model"] = model
        try:
            r = client.post("/chat/completions", json=body)
            r.raise_for_status()
            return r.json()["choices"][0]["message"]["content"] or ""
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
            raise BackendUnavailable(f"the query generator at {base_url} failed: {type(e).__name__}: {e}") from None

    return complete


def filter_consistent(pairs: Sequence[tuple[Document, str]], pipeline, keep_top: int
                      ) -> tuple[list[tuple[Document, str, int]], list[tuple[Document, str, int]]]:
    """Round-trip filter: (kept, dropped) with the source document's 1-based rank in the pipeline's fused list
    (BM25 + dense, depth ``keep_top``); 0 = not found. ``keep_top`` = 0 keeps everything (rank 0)."""
    if keep_top <= 0:
        return [(d, q, 0) for d, q in pairs], []
    kept, dropped = [], []
    for doc, query in pairs:
        ids = pipeline.search(query, keep_top, stages=("bm25", "dense"), candidates=max(keep_top, 10),
                              use_cache=False).doc_ids()
        rank = ids.index(doc.id) + 1 if doc.id in ids[:keep_top] else 0
        (kept if rank else dropped).append((doc, query, rank))
    return kept, dropped


def write_dataset(out: Path, corpus: Path, kept: Sequence[tuple[Document, str, int]],
                  dropped: Sequence[tuple[Document, str, int]], report: dict[str, Any]) -> None:
    """The BEIR-layout folder (see the module doc). ``corpus`` is linked, not copied."""
    out.mkdir(parents=True, exist_ok=True)
    link = out / ("corpus.jsonl.gz" if corpus.suffix == ".gz" else "corpus.jsonl")
    for name in ("corpus.jsonl", "corpus.jsonl.gz"):
        if (out / name).is_symlink() or (out / name).exists():
            (out / name).unlink()
    link.symlink_to(corpus.resolve())
    (out / "qrels").mkdir(exist_ok=True)
    header = "query-id\tcorpus-id\tscore\n"
    with (open(out / "queries.jsonl", "w", encoding="utf-8") as qf,
          open(out / "qrels" / "train.tsv", "w", encoding="utf-8") as tf,
          open(out / "qrels" / "unfiltered.tsv", "w", encoding="utf-8") as uf):
        tf.write(header)
        uf.write(header)
        for n, (doc, query, rank) in enumerate([*kept, *dropped]):
            qid = f"syn-{n}"
            qf.write(json.dumps({"_id": qid, "text": query, "metadata": {"source_doc": doc.id, "source_rank": rank}})
                     + "\n")
            uf.write(f"{qid}\t{doc.id}\t1\n")
            if n < len(kept):
                tf.write(f"{qid}\t{doc.id}\t1\n")
    (out / "synthetic.json").write_text(json.dumps(report, indent=1) + "\n")


def synthesize(docs: Sequence[Document], corpus: Path, out: Path, complete: Callable[[list[dict[str, str]]], str],
               pipeline, cfg: SynthConfig, *, generator: str = "", command: str = "", log_every: int = 0
               ) -> dict[str, Any]:
    """Sample, generate, clean, filter and write (see the module doc); returns the report written to
    ``synthetic.json``."""
    sample = sample_documents(docs, cfg.docs, cfg.seed)
    if not sample:
        raise ConfigError(f"the corpus {corpus} has no document with text to write queries for")
    t0 = time.perf_counter()
    pairs, dropped = generate(sample, complete, cfg, log_every=log_every)
    t_gen = time.perf_counter() - t0
    kept, inconsistent = filter_consistent(pairs, pipeline, cfg.keep_top)
    if inconsistent:
        dropped[f"source not in the first stage's top {cfg.keep_top}"] = len(inconsistent)
    report = {"command": command, "config": asdict(cfg), "generator": generator, "corpus": str(corpus),
              "documents": len(sample), "usable": len(pairs), "kept": len(kept), "dropped": dict(dropped),
              "rank_of_source": dict(sorted(Counter(r for _, _, r in kept).items())),
              "generate_s": round(t_gen, 1), "filter_s": round(time.perf_counter() - t0 - t_gen, 1),
              "examples_kept": [{"doc": d.id, "title": d.title[:80], "query": q, "rank": r} for d, q, r in kept[:8]],
              "examples_dropped": [{"doc": d.id, "title": d.title[:80], "query": q} for d, q, _ in inconsistent[:8]]}
    if not kept:
        raise ConfigError(f"no synthetic query survived ({dict(dropped)}): nothing to train on; try a larger "
                          "--keep-top or more --docs")
    write_dataset(out, corpus, kept, inconsistent, report)
    return report
