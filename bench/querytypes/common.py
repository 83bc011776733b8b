"""What every generator of the suite shares: the halves, the folder writer, the words of a text."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

Qrels = dict[str, dict[str, int]]
SPLITS = ("tune", "test")
WORD = re.compile(r"[a-z0-9]+")


def half(qid: str, seed: int) -> str:
    """``tune`` or ``test``: the parity of a seeded hash of the query id (the same id lands in the same half for a
    seed, whatever else the suite holds)."""
    return SPLITS[hashlib.sha256(f"{seed}:{qid}".encode()).digest()[0] & 1]


def words(text: str) -> list[str]:
    """Lower-cased alphanumeric runs: the unit the keyword and IDF code counts."""
    return WORD.findall(text.lower())


def write_suite(out: Path, queries: Iterable[tuple[str, str, str, dict[str, object]]], qrels: Qrels, seed: int,
                *, corpus: Path | None = None, corpus_rows: Iterable[Mapping[str, object]] | None = None,
                info: dict[str, object] | None = None, groups: Mapping[str, str] | None = None) -> dict[str, object]:
    """Write a BEIR folder at ``out``: ``queries.jsonl`` (``{"_id", "text", "metadata": {"type", ...}}``),
    ``qrels/tune.tsv`` and ``qrels/test.tsv`` split by :func:`half`, the corpus (a symlink to ``corpus``, or
    ``corpus_rows`` written as ``corpus.jsonl``) and ``suite.json`` (counts per type and half). ``groups``: query
    id -> the key its half is drawn by (the forms of one source query share a half, so that no test query is a
    rewording of a tuning one); the query id itself by default."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    counts: dict[str, dict[str, int]] = {}
    files = {s: open(out / "qrels" / f"{s}.tsv", "w", encoding="utf-8") for s in SPLITS}
    try:
        for f in files.values():
            f.write("query-id\tcorpus-id\tscore\n")
        with open(out / "queries.jsonl", "w", encoding="utf-8") as fq:
            for qid, text, qtype, extra in queries:
                fq.write(json.dumps({"_id": qid, "text": text, "metadata": {"type": qtype, **extra}},
                                    ensure_ascii=False) + "\n")
                s = half((groups or {}).get(qid, qid), seed)
                counts.setdefault(qtype, {"tune": 0, "test": 0})[s] += 1
                for d, g in sorted(qrels[qid].items()):
                    files[s].write(f"{qid}\t{d}\t{g}\n")
    finally:
        for f in files.values():
            f.close()
    for name in ("corpus.jsonl", "corpus.jsonl.gz"):
        p = out / name
        if p.is_symlink() or p.exists():
            p.unlink()
    if corpus is not None:
        (out / corpus.name).symlink_to(corpus.resolve())
    elif corpus_rows is not None:
        with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
            for row in corpus_rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    summary = {"seed": seed, "types": counts, **(info or {})}
    (out / "suite.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
