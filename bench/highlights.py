"""How often the highlighted sentence holds the answer, and what highlights cost (issue 43).

The questions (``bench/data/highlight_questions.json``) were written by hand over this machine's man pages: each
names its page and a short string (an option, a phrase) the answering sentence holds. The pages are read at run
time (:func:`bench.harness.man.render_man`: ``man -P cat``, 80 columns; nothing of their text is stored in the
repository) together with the distractor pages the file lists, built into an index with the served defaults (or
``--storage``), and each question retrieved with ``highlights`` on and off, alternately, in process (one caller:
the solo path the service takes when idle). Reported:

- ``page_top1`` / ``page_top3``: the question's page gives the first passage / one of the first three;
- ``answer_passage_top3``: one of the first three passages is of the page and holds the answer string;
- ``hit_top1``: the first passage's best sentence holds the answer (and the passage is of the page);
- ``hit_top3``: the best sentence of one of the first three passages of the page holds it;
- ``hit_when_retrieved``: of the questions with an answer passage in the first three, how often that passage's
  best sentence holds the answer; beside it the same for a sentence drawn at random from that passage
  (``random_sentence_when_retrieved``, its expectation) and for its first sentence, the baselines;
- the latency of a request with highlights against one without (p50, p95 and their ratio, same run).

Usage::

    python -m bench.highlights                       # all questions, the served defaults (pool3+bins)
    python -m bench.highlights --storage int8        # every token's own stored vector
    python -m bench.highlights --exact               # the passages encoded again: every token's exact state
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import percentiles, ratio, write_result
from bench.harness.man import render_man

QUESTIONS = Path(__file__).resolve().parent / "data" / "highlight_questions.json"


def documents(questions: list[dict[str, Any]], distractors: list[str]) -> tuple[list[Any], list[str]]:
    """The pages as documents (id ``man:NAME``, title ``NAME(1)``), and the pages that could not be read."""
    from index_builder.types import Document

    pages = list(dict.fromkeys([q["page"] for q in questions] + distractors))
    docs, missing = [], []
    for page in pages:
        text = render_man(page) or ""  # 80 columns, as `man` shows it
        if text.strip():
            docs.append(Document(id=f"man:{page}", text=text, title=f"{page}(1)", metadata={"source": "man"}))
        else:
            missing.append(page)
    return docs, missing


def score(result: Any, question: dict[str, Any]) -> dict[str, Any]:
    """One question's outcome (see the module docstring) from a result with highlights."""
    from rerank.highlights import sentence_spans

    want_doc, answer = f"man:{question['page']}", question["answer"]
    index = result.index
    rows = []
    for d, c in zip(result.hits.doc.tolist()[:3], result.hits.chunk.tolist()[:3], strict=False):
        text = index.passage(c)
        hl = result.highlights.get(c, [])
        best = text[hl[0].start:hl[0].end] if hl else ""
        rows.append({"doc": index.documents[d].id, "text": text, "best": best})
    of_page = [r for r in rows if r["doc"] == want_doc]
    with_answer = [r for r in of_page if answer in r["text"]]
    out = {"id": question["id"], "page_top1": bool(rows) and rows[0]["doc"] == want_doc,
           "page_top3": bool(of_page), "answer_passage_top3": bool(with_answer),
           "hit_top1": bool(rows) and rows[0]["doc"] == want_doc and answer in rows[0]["best"],
           "hit_top3": any(answer in r["best"] for r in of_page),
           "highlight": rows[0]["best"][:300] if rows else ""}
    if with_answer:
        r = with_answer[0]
        sentences = [r["text"][a:b] for a, b in sentence_spans(r["text"])]
        out["hit_when_retrieved"] = answer in r["best"]
        out["random_sentence_when_retrieved"] = sum(answer in s for s in sentences) / max(len(sentences), 1)
        out["first_sentence_when_retrieved"] = bool(sentences) and answer in sentences[0]
        out["sentences_in_answer_passage"] = len(sentences)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.harness.pipelines import opened, with_sections
    from index_builder.build.builder import build_snapshot
    from index_builder.models.encoders import Embedder
    from retrieval.config import load_config

    spec = json.loads(Path(args.questions).read_text())
    questions = spec["questions"][:args.limit or None]
    distractors = spec["distractors"][:args.distractors]
    config = load_config(environ={})
    if args.storage:
        config = with_sections(config, late_interaction={"storage": args.storage})
    if args.exact:
        config = with_sections(config, rerank={"highlight_exact": True})
    docs, missing = documents(questions, distractors)
    questions = [q for q in questions if q["page"] not in missing]
    embedder = Embedder(config.embedder)
    with tempfile.TemporaryDirectory(prefix="highlights-") as tmp:
        root = Path(args.index_dir) if args.index_dir else Path(tmp) / "index"
        t = time.perf_counter()
        summary = build_snapshot(docs, root, config.build_config(), embedder)
        build_s = time.perf_counter() - t
        with opened(root, config) as pipeline:
            outcomes, on_ms, off_ms = [], [], []
            for q in questions[:3]:  # warm-up
                pipeline.search(q["question"], args.k, highlights=True, use_cache=False)
                pipeline.search(q["question"], args.k, use_cache=False)
            for rep in range(args.repeats):
                for i, q in enumerate(questions):
                    modes = (True, False) if (i + rep) % 2 == 0 else (False, True)  # alternated
                    for on in modes:
                        t = time.perf_counter()
                        result = pipeline.search(q["question"], args.k, highlights=on, use_cache=False)
                        (on_ms if on else off_ms).append((time.perf_counter() - t) * 1000)
                        if on and rep == 0:
                            outcomes.append(score(result, q))
    n = len(outcomes)
    retrieved = [o for o in outcomes if "hit_when_retrieved" in o]

    def rate(rows: list[dict[str, Any]], key: str) -> float | None:
        return round(sum(float(o[key]) for o in rows) / len(rows), 3) if rows else None

    on, off = percentiles(on_ms), percentiles(off_ms)
    return {"questions": n, "documents": len(docs), "chunks": summary.chunks, "missing_pages": missing,
            "storage": config.late_interaction.storage, "k": args.k, "exact": config.rerank.highlight_exact,
            "highlight_passages": config.rerank.highlight_passages, "build_s": round(build_s, 1),
            "page_top1": rate(outcomes, "page_top1"), "page_top3": rate(outcomes, "page_top3"),
            "answer_passage_top3": rate(outcomes, "answer_passage_top3"),
            "hit_top1": rate(outcomes, "hit_top1"), "hit_top3": rate(outcomes, "hit_top3"),
            "retrieved": len(retrieved), "hit_when_retrieved": rate(retrieved, "hit_when_retrieved"),
            "random_sentence_when_retrieved": rate(retrieved, "random_sentence_when_retrieved"),
            "first_sentence_when_retrieved": rate(retrieved, "first_sentence_when_retrieved"),
            "latency": {"with_highlights": on, "without": off, "p50_ratio": ratio(on["p50_ms"], off["p50_ms"]),
                        "p95_ratio": ratio(on["p95_ms"], off["p95_ms"])},
            "per_question": outcomes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.highlights", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", default=str(QUESTIONS))
    ap.add_argument("--limit", type=int, default=0, help="the first N questions (0: all)")
    ap.add_argument("--distractors", type=int, default=1000, help="at most N of the file's distractor pages")
    ap.add_argument("--storage", default="", help="[late_interaction] storage (default: the served default)")
    ap.add_argument("--exact", action="store_true",
                    help="[rerank] highlight_exact: the passages encoded again (every token's own similarities)")
    ap.add_argument("--k", type=int, default=5, help="passages per request")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes over the questions")
    ap.add_argument("--index-dir", default="", help="build the index here (default: a temporary folder)")
    ap.add_argument("--json", default="results/highlights/highlights.json")
    args = ap.parse_args(argv)
    out = run(args)
    lat = out["latency"]
    print(f"{out['questions']} questions over {out['documents']} pages ({out['storage']}): page in top 3 "
          f"{out['page_top3']}, answer passage in top 3 {out['answer_passage_top3']}; highlight holds the answer: "
          f"top-1 passage {out['hit_top1']}, top 3 {out['hit_top3']}, when the answer passage is retrieved "
          f"{out['hit_when_retrieved']} (random sentence {out['random_sentence_when_retrieved']}, first "
          f"{out['first_sentence_when_retrieved']}); p50 {lat['with_highlights']['p50_ms']} ms with, "
          f"{lat['without']['p50_ms']} ms without (x{lat['p50_ratio']})", file=sys.stderr)
    config = {k: v for k, v in vars(args).items() if k not in ("json", "index_dir")}
    write_result(args.json, "highlights", config, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
