"""``debdocs``: documentation of this machine as a corpus, with identifier and quoted-phrase queries whose one
relevant document is the only one that holds them.

The corpus (never stored in the repository; ``python -m bench.querytypes`` writes it under ``--out``): a seeded
sample of Debian's man pages (rendered by :func:`bench.harness.man.render_man`) and of ``/usr/share/doc`` files
(read by the product's readers, :func:`bench.scale_corpus.read_document`), files of packages no Debian archive has
left out (:func:`bench.scale_corpus.debian_owned`); a document is its paragraphs, whitespace collapsed, cut at a
paragraph (else a space) before ``max_chars``; short ones and duplicates dropped.

Queries: ``identifier`` (a token one of :data:`PATTERNS` finds, occurring, case-insensitively and as a substring
of anything, in the title and text of exactly one document; at most one per document and kind, kinds taken in
turn; dotted file names such as ``acpi.rst.txt`` left out), ``identifier_question`` (the same identifier in a
question; in the same half as its bare form), ``phrase`` (3-5 words taken verbatim from one paragraph, every one
a plain word, two or more not stopwords, neither the first nor the last a stopword, occurring in exactly one
document once whitespace is collapsed), asked in double quotes.
"""

from __future__ import annotations

import bisect
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.harness.man import render_man
from bench.querytypes.common import Qrels
from bench.scale_corpus import (
    Source,
    _title,
    debian_owned,
    doc_files,
    man_pages,
    man_paragraphs,
    read_document,
    section_paragraphs,
)
from index_builder.documents.analysis import LUCENE_ENGLISH_STOPWORDS

PATTERNS: dict[str, re.Pattern[str]] = {
    "flag": re.compile(r"(?<![\w-])--[a-z0-9]+(?:-[a-z0-9]+)+(?![\w-])"),
    "dotted": re.compile(r"(?<![\w.])[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?![\w])(?!\.\w)"),
    "snake_case": re.compile(r"(?<![\w.-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w-])"),
    "constant": re.compile(r"(?<![\w.-])[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+(?![\w-])"),
    "version": re.compile(r"(?<![\w.-])v?\d+\.\d+\.\d+(?![\w-])(?!\.\w)"),
    "hex": re.compile(r"(?<![\w-])(?:0x[0-9a-fA-F]{4,16}|(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40})(?![\w-])"),
    "code": re.compile(r"(?<![\w-])(?:CVE-\d{4}-\d{4,7}|[A-Z]{1,5}\d{3,6})(?![\w-])"),
}
_FILE_SUFFIXES = frozenset("txt rst html htm md ko gz c h py pl so conf cfg ini json xml yaml yml sh png svg pdf tar "
                           "zip deb rpm patch diff log".split())
QUESTIONS = ("what does {} mean", "how do I use {}")
_PLAIN_WORD = re.compile(r"^[A-Za-z][a-z'-]*$")
_STOP = LUCENE_ENGLISH_STOPWORDS | {"you", "your", "can", "from", "which", "has", "have", "all", "its", "also"}


def _dotted_ok(tok: str) -> bool:
    """A dotted token that looks like a name in code (``os.path.join``, ``opts.worker_threads``, ``fooBar.baz``),
    not a file name (``index.html``) or an abbreviation (``e.g``)."""
    parts = tok.split(".")
    if any(len(p) < 2 for p in parts) or parts[-1].lower() in _FILE_SUFFIXES:
        return False
    return len(parts) >= 3 or "_" in tok or any(re.search(r"[a-z][A-Z]", p) for p in parts)


def _read(src: Source, max_chars: int) -> tuple[str, str]:
    """(title, text) of one source, the text cut at a paragraph (else a space) before ``max_chars``; ("", "")
    when it cannot be read."""
    if src.kind == "man":
        rendered = render_man(src.path, 1000, justify=False, timeout_s=20)
        if not rendered:
            return "", ""
        found, paras = man_paragraphs(rendered)
    else:
        try:
            doc = read_document(src)
        except Exception:  # noqa: BLE001 -- a file no reader reads is skipped, never the run
            return "", ""
        paras = section_paragraphs(doc.sections)
        found = doc.title or next((p for p in paras if 1 <= len(p.split()) <= 12), "")
    text = "\n\n".join(paras)
    if len(text) > max_chars:
        cut = text.rfind("\n\n", 0, max_chars)
        cut = cut if cut > max_chars // 2 else text.rfind(" ", 0, max_chars)
        text = text[:cut if cut > 0 else max_chars].rstrip()
    return _title(src, found), text


def _sources(man_root: Path | None, doc_root: Path | None, seed: int, debian_only: bool = True) -> list[Source]:
    """Man pages and doc files interleaved in a seeded order; with ``debian_only`` (where dpkg and apt are here),
    files of packages no Debian archive has left out (16,000 generated gcloud man pages on this machine)."""
    man = man_pages(man_root) if man_root and Path(man_root).is_dir() else []
    doc = doc_files(doc_root) if doc_root and Path(doc_root).is_dir() else []
    owned = debian_owned() if debian_only else None
    if owned is not None:
        owner, debian = owned
        man, doc = ([s for s in lst if owner.get(str(s.path)) in debian] for lst in (man, doc))
    rng = random.Random(seed)
    rng.shuffle(man)
    rng.shuffle(doc)
    out = [s for pair in zip(man, doc, strict=False) for s in pair]
    return out + man[len(doc):] + doc[len(man):]


def read_corpus(n_docs: int, seed: int, *, max_chars: int = 2000, min_chars: int = 300,
                man_root: Path | None = Path("/usr/share/man"), doc_root: Path | None = Path("/usr/share/doc"),
                workers: int = 2, progress: bool = True, debian_only: bool = True) -> list[dict[str, Any]]:
    """``n_docs`` documents (``{"_id", "title", "text", "metadata": {"source"}}``), read in the seeded order of
    :func:`_sources` until that many are kept: the same corpus for a seed on the same installed packages."""
    t0 = time.perf_counter()
    srcs = _sources(man_root, doc_root, seed, debian_only)
    rows: list[dict[str, Any]] = []
    seen_ids: set[str] = set()
    seen_text: set[str] = set()
    batch = 64
    with ThreadPoolExecutor(max(1, workers)) as pool:
        for start in range(0, len(srcs), batch):
            chunk = srcs[start:start + batch]
            for src, (title, text) in zip(chunk, pool.map(lambda s: _read(s, max_chars), chunk), strict=True):
                did = f"{src.kind}/{src.label}"
                key = " ".join(text.lower().split())
                if len(text) < min_chars or did in seen_ids or key in seen_text:
                    continue
                seen_ids.add(did)
                seen_text.add(key)
                rows.append({"_id": did, "title": title, "text": text, "metadata": {"source": src.source}})
                if len(rows) == n_docs:
                    return rows
            if progress:
                print(f"  debdocs: {len(rows)} documents from {start + len(chunk)} files, "
                      f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return rows


class Haystack:
    """Every document's title and text, lower-cased and whitespace-collapsed, in one string: which documents
    hold a string (case-insensitively, as a substring of anything)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        parts, self.starts, pos = [], [], 0
        for r in rows:
            s = " ".join(f"{r['title']} {r['text']}".lower().split()) + "\x00"
            self.starts.append(pos)
            parts.append(s)
            pos += len(s)
        self.text = "".join(parts)

    def holders(self, needle: str, limit: int = 2) -> list[int]:
        """The documents (their numbers) holding ``needle``, at most ``limit`` of them."""
        needle = " ".join(needle.lower().split())
        out: list[int] = []
        i = self.text.find(needle)
        while i >= 0 and len(out) < limit:
            d = bisect.bisect_right(self.starts, i) - 1
            out.append(d)
            nxt = self.starts[d + 1] if d + 1 < len(self.starts) else len(self.text)
            i = self.text.find(needle, nxt)
        return out


def identifiers(rows: list[dict[str, Any]], hay: Haystack, n: int, seed: int) -> list[tuple[str, str, int]]:
    """Up to ``n`` (kind, identifier, document number), each identifier held by exactly one document."""
    found: dict[str, list[tuple[str, int]]] = {k: [] for k in PATTERNS}
    df: Counter[str] = Counter()
    per_doc: list[set[tuple[str, str]]] = []
    for r in rows:
        toks = set()
        for kind, pat in PATTERNS.items():
            for m in pat.finditer(f"{r['title']}\n{r['text']}"):
                tok = m.group(0)
                if 5 <= len(tok) <= 60 and (kind != "dotted" or _dotted_ok(tok)):
                    toks.add((kind, tok))
        per_doc.append(toks)
        df.update({t.lower() for _, t in toks})
    for d, toks in enumerate(per_doc):
        for kind, tok in sorted(toks):
            if df[tok.lower()] == 1:
                found[kind].append((tok, d))
    rng = random.Random(seed)
    for kind in PATTERNS:
        rng.shuffle(found[kind])
    out: list[tuple[str, str, int]] = []
    used: set[tuple[str, int]] = set()
    cursors = dict.fromkeys(PATTERNS, 0)
    while len(out) < n and any(cursors[k] < len(found[k]) for k in PATTERNS):
        for kind in PATTERNS:
            while cursors[kind] < len(found[kind]) and len(out) < n:
                tok, d = found[kind][cursors[kind]]
                cursors[kind] += 1
                if (kind, d) not in used and hay.holders(tok) == [d]:
                    used.add((kind, d))
                    out.append((kind, tok, d))
                    break
    return out


def phrases(rows: list[dict[str, Any]], hay: Haystack, n: int, seed: int, tries: int = 20) -> list[tuple[str, int]]:
    """Up to ``n`` (phrase, document number), one per document, each held verbatim by that document only."""
    rng = random.Random(seed + 1)
    order = list(range(len(rows)))
    rng.shuffle(order)
    out: list[tuple[str, int]] = []
    for d in order:
        if len(out) == n:
            break
        paras = [p.split() for p in rows[d]["text"].split("\n\n") if len(p.split()) >= 5]
        for _ in range(tries if paras else 0):
            words = rng.choice(paras)
            size = rng.choice((3, 4, 5))
            if len(words) < size:
                continue
            start = rng.randrange(len(words) - size + 1)
            cand = words[start:start + size]
            content = [w for w in cand if w.lower() not in _STOP]
            if (all(_PLAIN_WORD.match(w) for w in cand) and len(content) >= 2 and max(map(len, cand)) >= 5
                    and cand[0].lower() not in _STOP and cand[-1].lower() not in _STOP
                    and hay.holders(" ".join(cand)) == [d]):
                out.append((" ".join(cand), d))
                break
    return out


def generate(n_docs: int, seed: int, *, n_identifiers: int = 400, n_phrases: int = 400, max_chars: int = 2000,
             **read: Any) -> tuple[list[dict[str, Any]], Iterator[tuple[str, str, str, dict[str, object]]], Qrels,
                                   dict[str, str], dict[str, object]]:
    """(corpus rows, queries ``(id, text, type, metadata)``, qrels, query id -> its half's key, info)."""
    rows = read_corpus(n_docs, seed, max_chars=max_chars, **read)
    hay = Haystack(rows)
    ids = identifiers(rows, hay, n_identifiers, seed)
    phr = phrases(rows, hay, n_phrases, seed)
    rng = random.Random(seed + 2)
    queries: list[tuple[str, str, str, dict[str, object]]] = []
    qrels: Qrels = {}
    group: dict[str, str] = {}
    for i, (kind, tok, d) in enumerate(ids):
        base = f"identifier-{i:04d}"
        for qid, text, qtype in ((base, tok, "identifier"),
                                 (f"identifier_question-{i:04d}", rng.choice(QUESTIONS).format(tok),
                                  "identifier_question")):
            queries.append((qid, text, qtype, {"kind": kind}))
            qrels[qid] = {rows[d]["_id"]: 1}
            group[qid] = base
    for i, (phrase, d) in enumerate(phr):
        qid = f"phrase-{i:04d}"
        queries.append((qid, f'"{phrase}"', "phrase", {"words": len(phrase.split())}))
        qrels[qid] = {rows[d]["_id"]: 1}
        group[qid] = qid
    info: dict[str, object] = {"documents": len(rows), "max_chars": max_chars,
                               "identifier_kinds": dict(Counter(k for k, _, _ in ids)),
                               "sources": dict(Counter(r["metadata"]["source"] for r in rows))}
    return rows, iter(queries), qrels, group, info
