"""A folder of real documentation files, indexed and kept in step as a user does (issue 43).

The folder: the files of ``bench/data/folder_questions.json`` plus a seeded sample of other files the readers
take (markdown, reStructuredText, HTML, text, PDF) from ``--doc-root`` (``/usr/share/doc``), copied into a
temporary folder (never into the repository). Then, each command in its own process:

1. **read**: the folder reader alone (in process): files/s, MB/s, skipped files by reason;
2. **build**: ``hybridrag build --corpus DIR --out IDX`` into an empty folder: seconds, peak RSS, chunks;
3. **re-run unchanged**: the same command again: its seconds as a fraction of (2) (nothing is embedded);
4. **re-run after edits**: ``--changed N`` files edited, 2 deleted, 2 added, then the same command: the summary,
   the passages embedded, its seconds as a fraction of (2);
5. **quality**: the questions against the built index, in process: the right file at rank 1 and in the top 3
   (the issue's user saw 10 of 10 in the top 3); with ``highlights`` where the request offers them, whether the
   top passage's highlight holds the answer string;
6. **sync**: ``build --store`` then ``serve --store``; the same edits again, ``hybridrag sync DIR``: its seconds
   as a fraction of (2), and each edited file's new text served (its file's passages) once it returns.

    python -m bench.folder [--files 400] [--changed 10] [--seed 0] [--json results/folder/folder.json]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.harness import ratio, write_result
from bench.harness.server import run_measured, served

QUESTIONS = Path(__file__).resolve().parent / "data" / "folder_questions.json"


def candidates(doc_root: Path) -> list[str]:
    """The files under ``doc_root`` the folder reader would try, of 1 KB or more."""
    from index_builder.documents.folder import FolderOptions
    from index_builder.documents.folder import candidates as readable

    return [rel for rel, path in readable(doc_root, FolderOptions()) if path.stat().st_size >= 1024]


def make_folder(doc_root: Path, out: Path, wanted: list[str], files: int, seed: int) -> tuple[list[str], list[str]]:
    """Copy the wanted files and a seeded sample of the rest; returns (copied, spares not copied)."""
    pool = sorted(set(candidates(doc_root)) - set(wanted))
    rng = random.Random(seed)
    rng.shuffle(pool)
    chosen = [w for w in wanted if (doc_root / w).is_file()] + pool[:max(0, files - len(wanted))]
    for rel in chosen:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(doc_root / rel, out / rel)
    return chosen, pool[max(0, files - len(wanted)):]


def edit(folder: Path, chosen: list[str], spares: list[str], doc_root: Path, changed: int, seed: int,
         tag: str) -> dict[str, Any]:
    """Append a marked sentence to ``changed`` text files, delete 2 files and add 2 new ones."""
    rng = random.Random(seed)
    texts = [r for r in chosen if (folder / r).suffix in (".md", ".txt", ".rst") and (folder / r).exists()]
    edited = rng.sample(texts, min(changed, len(texts)))
    for i, rel in enumerate(edited):
        with open(folder / rel, "a", encoding="utf-8", errors="replace") as f:
            f.write(f"\n\nRelease note {tag}{i}: the option --frobnicate{tag}{i} was added here.\n")
    rest = [r for r in chosen if r not in edited and (folder / r).exists()]
    deleted = rng.sample(rest, 2)
    for rel in deleted:
        (folder / rel).unlink()
    added = [s for s in spares if not (folder / s).exists()][:2]
    for rel in added:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(doc_root / rel, folder / rel)
    return {"edited": edited, "deleted": deleted, "added": added}


def parse_run(log: str) -> dict[str, Any]:
    text = Path(log).read_text(encoding="utf-8", errors="replace")
    out: dict[str, Any] = {}
    if m := re.search(r"added (\d+), updated (\d+), deleted (\d+), unchanged (\d+), skipped (\d+)", text):
        out["summary"] = dict(zip(("added", "updated", "deleted", "unchanged", "skipped"), map(int, m.groups()), strict=True))
    if m := re.search(r"(\d+) documents, (\d+) chunks", text):
        out["documents"], out["chunks"] = int(m.group(1)), int(m.group(2))
    if m := re.search(r"(\d+) passages embedded, (\d+) chunks reused", text):
        out["embedded"], out["reused"] = int(m.group(1)), int(m.group(2))
    return out


def measured(cmd: list[str], work: Path, name: str) -> dict[str, Any]:
    """A command alone in its own process (seconds, peak RSS), with what its output says (summary, chunks)."""
    run = run_measured(cmd, work, name)
    return {**{k: v for k, v in run.items() if k != "log"}, **parse_run(run["log"])}


def read_alone(folder: Path) -> dict[str, Any]:
    from index_builder.documents.folder import FolderReport, iter_folder

    report = FolderReport(root=str(folder))
    t = time.perf_counter()
    docs = list(iter_folder(folder, report=report))
    seconds = time.perf_counter() - t
    size = sum((folder / d.id).stat().st_size for d in docs)
    return {"files": len(docs), "seconds": round(seconds, 2), "files_per_s": round(len(docs) / seconds, 1),
            "mb_per_s": round(size / 2**20 / seconds, 2), "text_chars": sum(len(d.text) for d in docs),
            "skipped": len(report.skipped), "skipped_by_reason": dict(Counter(s.reason.split(":")[0][:48]
                                                                              for s in report.skipped)),
            "other_types": dict(report.other_types.most_common(8))}


def quality(index: Path, questions: list[dict]) -> dict[str, Any]:
    from bench.harness.pipelines import opened
    from retrieval.config import load_config
    from retrieval.search.request import SearchRequest

    rows = []
    with opened(index, load_config()) as pipeline:
        offers = "highlights" in SearchRequest.__dataclass_fields__
        for q in questions:
            result = pipeline.search(q["question"], 3, use_cache=False, **({"highlights": True} if offers else {}))
            ids = result.doc_ids()
            row = {"id": q["id"], "file": q["file"], "top3": ids,
                   "rank": ids.index(q["file"]) + 1 if q["file"] in ids else 0}
            if offers and len(result.hits):
                chunk = int(result.hits.chunk[0])
                text = result.index.passage(chunk)
                marks = result.highlights.get(chunk, [])
                row["highlight"] = text[marks[0].start:marks[0].end] if marks else ""
                row["highlight_holds_answer"] = q["answer"].lower() in row["highlight"].lower()
            rows.append(row)
    n = len(rows)
    out = {"questions": n, "hit_at_1": sum(r["rank"] == 1 for r in rows), "hit_at_3": sum(r["rank"] > 0 for r in rows),
           "rows": rows}
    marked = [r for r in rows if "highlight_holds_answer" in r and r["rank"] == 1]
    if marked:
        out["highlight_holds_answer_when_top1_right"] = f"{sum(r['highlight_holds_answer'] for r in marked)}/{len(marked)}"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hybridrag bench folder", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--doc-root", default="", help="where the files come from (default: the question set's)")
    ap.add_argument("--questions", default=str(QUESTIONS))
    ap.add_argument("--files", type=int, default=400, help="files in the folder (the questions' included)")
    ap.add_argument("--changed", type=int, default=10, help="files edited before the re-run and the sync")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-sync", action="store_true", help="skip the server part (6)")
    ap.add_argument("--json", help="merge the result into this JSON file")
    args = ap.parse_args(argv)
    qs = json.loads(Path(args.questions).read_text(encoding="utf-8"))
    doc_root = Path(args.doc_root or qs["doc_root"])
    questions = [q for q in qs["questions"] if (doc_root / q["file"]).is_file()]
    py = [sys.executable, "-m", "hybridrag"]
    out: dict[str, Any] = {"doc_root": str(doc_root), "missing_question_files": len(qs["questions"]) - len(questions)}
    with tempfile.TemporaryDirectory(prefix="hybridrag-bench-folder-") as tmp:
        work = Path(tmp)
        folder = work / "docs"
        folder.mkdir()
        chosen, spares = make_folder(doc_root, folder, [q["file"] for q in questions], args.files, args.seed)
        out["folder"] = {"files": len(chosen), "bytes": sum((folder / r).stat().st_size for r in chosen),
                         "by_type": dict(Counter(Path(r).suffix or Path(r).name for r in chosen))}
        out["read"] = read_alone(folder)
        print(f"read {out['read']['files']} files in {out['read']['seconds']} s", file=sys.stderr)
        build = [*py, "build", "--corpus", str(folder), "--out", str(work / "idx"), "--quiet"]
        out["build"] = measured(build, work, "build")
        print(f"build {out['build']['seconds']} s", file=sys.stderr)
        out["rerun_unchanged"] = measured(build, work, "rerun")
        out["rerun_unchanged"]["over_build"] = ratio(out["rerun_unchanged"]["seconds"], out["build"]["seconds"])
        out["edits"] = edit(folder, chosen, spares, doc_root, args.changed, args.seed, "a")
        out["rerun_edited"] = measured(build, work, "rerun2")
        out["rerun_edited"]["over_build"] = ratio(out["rerun_edited"]["seconds"], out["build"]["seconds"])
        out["quality"] = quality(work / "idx", questions)
        print(f"quality: {out['quality']['hit_at_1']}/{len(questions)} at 1, {out['quality']['hit_at_3']} in the top 3",
              file=sys.stderr)
        if not args.no_sync:
            out["sync"] = sync_part(work, folder, chosen, spares, doc_root, args, out["build"]["seconds"])
    print(json.dumps({k: out[k] for k in ("read", "build", "rerun_unchanged", "rerun_edited") if k in out}, indent=1))
    print(json.dumps({k: v for k, v in out["quality"].items() if k != "rows"}))
    if "sync" in out:
        print(json.dumps(out["sync"]))
    if args.json:
        write_result(args.json, "folder", {"files": args.files, "changed": args.changed, "seed": args.seed}, out)
    return 0


def sync_part(work: Path, folder: Path, chosen: list[str], spares: list[str], doc_root: Path, args: argparse.Namespace,
              build_seconds: float) -> dict[str, Any]:
    from retrieval.client import ClientOptions, RetrieverClient

    py = [sys.executable, "-m", "hybridrag"]
    store = work / "store.db"
    run_measured([*py, "build", "--corpus", str(folder), "--store", str(store), "--out", str(work / "idx-live"),
                  "--quiet"], work, "build-store")
    out: dict[str, Any] = {}
    with served(work / "idx-live", work, args=("--store", str(store))) as server:
        edits = edit(folder, [r for r in chosen if (folder / r).exists()], spares[2:], doc_root, args.changed,
                     args.seed + 1, "b")
        sync = [*py, "sync", str(folder), "--server", server.target]
        out["sync"] = measured(sync, work, "sync")
        out["sync_over_build"] = ratio(out["sync"]["seconds"], build_seconds)
        with RetrieverClient(server.target, ClientOptions(timeout=60)) as c:
            hits = 0  # each edited file's new sentence is served at once (its file's passages, by its path)
            for i, rel in enumerate(edits["edited"]):
                top = c.retrieve(f"Release note b{i}: the option --frobnicateb{i} was added here", top_k=3,
                                 filters={"path": rel}).passages
                hits += any(f"--frobnicateb{i}" in p.text for p in top)
            out["edited_found"] = f"{hits}/{len(edits['edited'])}"
            gone = [d for d in edits["deleted"]
                    if d in [x.id for x in c.list_documents(after=d[:-1] if d else "", limit=5).documents]]
            out["deleted_still_listed"] = len(gone)
        unchanged = [*py, "sync", str(folder), "--server", server.target]
        out["sync_unchanged"] = measured(unchanged, work, "sync2")
    return out


if __name__ == "__main__":
    sys.exit(main())
