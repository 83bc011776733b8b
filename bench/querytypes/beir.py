"""The BEIR parts of the suite (SciFact, NFCorpus): the test split's queries in four forms, relevant documents
kept from BEIR's judgments.

- ``natural``: the query as BEIR gives it;
- ``keywords``: its 2 or 3 (seeded) words of highest IDF over the corpus (words of the corpus only, Lucene's
  stopwords left out), in the query's order: what a person types into a search box;
- ``misspelled``: 1 or 2 (seeded) of its words of 5 letters or more each given one typo (a letter dropped,
  doubled, swapped with its neighbour or replaced by a keyboard neighbour);
- ``long``: the doc-query set (:func:`retrieval.evaluate.doc_queries`: a judged abstract as the query, the other
  documents judged for the same need as its answers) of the test and train splits' judgments (SciFact's test
  split alone gives 58); its query ids are the source documents' ids, so the evaluation drops the source from
  every run as BEIR does.

The three forms of one query share its half (drawn by the BEIR query id).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from bench.querytypes.common import Qrels, words
from index_builder.documents.analysis import LUCENE_ENGLISH_STOPWORDS
from index_builder.documents.corpus import resolve_corpus_path
from retrieval.evaluate import doc_queries, document_texts, load_qrels, load_queries

_KEYBOARD = ["qwertyuiop", "asdfghjkl", "zxcvbnm"]


def _neighbours(c: str) -> str:
    for r, row in enumerate(_KEYBOARD):
        i = row.find(c)
        if i >= 0:
            near = row[max(i - 1, 0):i] + row[i + 1:i + 2]
            near += "".join(_KEYBOARD[r2][i] for r2 in (r - 1, r + 1) if 0 <= r2 < 3 and i < len(_KEYBOARD[r2]))
            return near
    return "e"


def typo(word: str, rng: random.Random) -> str:
    """One edit inside ``word`` (never its first letter): dropped, doubled, swapped or a keyboard neighbour.

    >>> typo("protein", random.Random(0)) != "protein"
    True
    """
    i = rng.randrange(1, len(word))
    op = rng.choice(("drop", "double", "swap", "near"))
    if op == "drop":
        return word[:i] + word[i + 1:]
    if op == "double":
        return word[:i] + word[i] + word[i:]
    if op == "swap" and i + 1 < len(word) and word[i] != word[i + 1]:
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    low = word[i].lower()
    return word[:i] + rng.choice(_neighbours(low) if low.isalpha() else "e") + word[i + 1:]


def misspell(text: str, rng: random.Random) -> str:
    """``text`` with 1 or 2 of its words of 5+ letters misspelled (each once); unchanged when it has none."""
    tokens = text.split(" ")
    long = [i for i, t in enumerate(tokens) if sum(ch.isalpha() for ch in t) >= 5 and t.isascii()]
    for i in rng.sample(long, min(len(long), rng.choice((1, 2)))):
        core = tokens[i].rstrip(".,;:?!)")
        tokens[i] = typo(core, rng) + tokens[i][len(core):]
    return " ".join(tokens)


def keywords(text: str, idf: dict[str, float], k: int) -> str:
    """The ``k`` words of ``text`` with the highest ``idf`` (words the corpus does not have left out), in the
    order the text has them; "" when it has none."""
    seen: list[str] = []
    for w in words(text):
        if w in idf and w not in seen and w not in LUCENE_ENGLISH_STOPWORDS:
            seen.append(w)
    top = set(sorted(seen, key=lambda w: (-idf[w], w))[:k])
    return " ".join(w for w in seen if w in top)


def corpus_idf(texts: dict[str, str]) -> dict[str, float]:
    """BM25's IDF of each word over the documents: ln(1 + (N - df + 0.5) / (df + 0.5))."""
    df: Counter[str] = Counter()
    for t in texts.values():
        df.update(set(words(t)))
    n = len(texts)
    return {w: math.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}


def generate(dataset: Path, seed: int, *, per_type: int = 400, split: str = "test",
             long_splits: tuple[str, ...] = ("train",)
             ) -> tuple[Path, Iterator[tuple[str, str, str, dict[str, object]]], Qrels, dict[str, str],
                        dict[str, object]]:
    """(the corpus file, queries ``(id, text, type, metadata)``, qrels, query id -> its half's key, info)."""
    qrels_in = load_qrels(dataset, split)
    texts = load_queries(dataset)
    docs = document_texts(dataset)
    idf = corpus_idf(docs)
    rng = random.Random(seed)
    ids = [q for q in qrels_in if q in texts]
    if len(ids) > per_type:
        ids = sorted(rng.sample(ids, per_type), key=ids.index)
    queries: list[tuple[str, str, str, dict[str, object]]] = []
    qrels: Qrels = {}
    groups: dict[str, str] = {}
    for q in ids:
        qr = random.Random(f"{seed}:{q}")
        forms = [("natural", texts[q]), ("keywords", keywords(texts[q], idf, qr.choice((2, 3)))),
                 ("misspelled", misspell(texts[q], qr))]
        for qtype, text in forms:
            if text.strip():
                qid = f"{qtype}-{q}"
                queries.append((qid, text, qtype, {"source": q}))
                qrels[qid] = qrels_in[q]
                groups[qid] = q
    judged = dict(qrels_in)
    for extra in long_splits:  # SciFact's test split alone gives 58 doc-queries
        if extra != split and (Path(dataset) / "qrels" / f"{extra}.tsv").is_file():
            judged.update({q: j for q, j in load_qrels(dataset, extra).items() if q not in judged})
    long_q, long_rel = doc_queries(judged, docs, max_queries=per_type, seed=seed)
    for d, text in long_q.items():
        queries.append((d, text, "long", {"source": d}))
        qrels[d] = long_rel[d]
    info: dict[str, object] = {"source": str(dataset), "split": split, "documents": len(docs),
                               "long_from_splits": [split, *(s for s in long_splits if s != split and
                                                             (Path(dataset) / "qrels" / f"{s}.tsv").is_file())]}
    return resolve_corpus_path(dataset), iter(queries), qrels, groups, info
