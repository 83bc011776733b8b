"""The scale bench's corpora (issue #41): real passages cut from Debian's documentation, then recombined sentences
of them to reach sizes the real text does not give. Deterministic for a seed (on a given set of installed
packages: the real pool is what this machine has).

Sources (``bash scripts/setup.sh --scale`` installs ``python3-doc``, ``linux-doc``, ``perl-doc``,
``debian-reference-en`` and ``man-db``):

- **man**: every English man page under ``MAN_ROOT/man[1-9]``, rendered as text by ``man --nh --nj -P cat -l``
  (:func:`bench.harness.man.render_man`) with a wide ``MANWIDTH`` (no hyphenation, no justification, one line per
  paragraph); the header and footer lines and the section headings dropped;
- **doc**: ``DOC_ROOT`` (``/usr/share/doc``): plain text, markdown, reStructuredText (also gzipped) and HTML,
  each read by the product's reader for its kind (:mod:`index_builder.documents.readers`, what a folder build
  reads them with: the encoding detected, markdown-it-py, lxml, the reStructuredText line rules), a document's
  paragraphs taken from the sections it gives; a Sphinx tree is read from its ``_sources`` (its HTML skipped);
  licences, changelogs and name lists skipped; a file no reader can read is counted in the statistics
  (``files.unreadable``, by reason). ``source`` is ``python3-doc`` under ``python3.*/html``, ``linux-doc`` under
  ``linux-doc-*``, else ``doc``.

Each document is cut at paragraph boundaries into passages of ``--min-words`` to ``--max-words`` words (a
paragraph longer than that is cut at sentence boundaries), each trimmed to ``--max-pieces`` word pieces of the
embedder's tokenizer so that a passage is one chunk of the default build (``[chunking] max_tokens`` 224);
paragraphs that are mostly not words (tables, hex dumps) are dropped; passages are deduplicated on their
lower-cased, whitespace-collapsed text. The result is ``OUT/pool.jsonl`` (every real passage, in file order) and
``OUT/pool-stats.json``.

A corpus of N passages (``OUT/corpus-N.jsonl``): the first N passages of a seeded permutation of the pool; past
the pool's size, *recombined* passages (``metadata.source = "recombined"``): sentences of the pool drawn at
random (seeded per passage) until a length drawn from the real passages' lengths, under a real passage's title.
Corpora are nested: corpus-10000 is the first 10,000 lines of corpus-100000. Distractors for quality runs are
real passages only (:func:`real_passages`).

    python -m bench.scale_corpus --out /work/data/scale --sizes 10000,100000,1000000
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import ints, median
from bench.harness.man import render_man
from index_builder.documents.readers import TEXT_READERS, Extracted, Unreadable, decode, read_rst, read_text

POOL = "pool.jsonl"
POOL_STATS = "pool-stats.json"
_ALPHA = re.compile(r"^[A-Za-z][A-Za-z'’\-]*[A-Za-z][.,;:!?)]*$")
_SENTENCE = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[\"'(\[]?[A-Z0-9])")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
MAX_FILE_BYTES = 64 * 2**20  # a file's bytes (gunzipped) read at most: the folder build's default --max-file-mb
_SKIP_NAMES = re.compile(r"^(copyright|changelog.*|.*\.debian.*|authors|thanks|credits|acks|contributors|"
                         r"maintainers|test_results|license.*|licence.*|copying.*)(\.gz)?$", re.I)
_TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".rst", ".text")
_HTML_SUFFIXES = (".html", ".htm")
_PLAIN_NAMES = re.compile(r"^(readme|news|todo|faq|history|install|usage|bugs|notes|hacking|tips)([._-].*)?$", re.I)


# ---------------------------------------------------------------------------------------------- reading sources


@dataclass(frozen=True)
class Source:
    path: Path
    kind: str  # "man" (rendered by man) | "doc" (read by the product's reader for its name)
    source: str  # metadata.source: man, doc, python3-doc, linux-doc
    label: str  # what the title starts from


def man_pages(root: Path) -> list[Source]:
    """English man pages (``man1``-``man9``), links to other pages skipped (the target is read itself)."""
    out = []
    for section in sorted(Path(root).glob("man[1-9]")):
        for p in sorted(section.iterdir()):
            if p.is_symlink() or not p.is_file():
                continue
            name = p.name[:-3] if p.name.endswith(".gz") else p.name
            out.append(Source(p, "man", "man", name))
    return out


def _doc_source(rel: Path) -> str:
    top = rel.parts[0] if rel.parts else ""
    if top.startswith("linux-doc"):
        return "linux-doc"
    if re.match(r"python3(\.\d+)?$", top) and "html" in rel.parts:
        return "python3-doc"
    return "doc"


def doc_files(root: Path) -> list[Source]:
    """Readable documentation under ``root`` (see the module docstring for what is kept)."""
    root = Path(root)
    out = []
    sphinx_roots: set[Path] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        dirnames.sort()
        if "_sources" in dirnames:  # a Sphinx HTML tree: read its sources, not the rendered pages
            sphinx_roots.add(d)
        sphinx = d in sphinx_roots or any(a in sphinx_roots for a in d.parents)
        dirnames[:] = [n for n in dirnames if n not in ("_static", "_images", "_downloads", "examples")]
        in_sources = "_sources" in d.relative_to(root).parts
        for name in sorted(filenames):
            p = d / name
            if p.is_symlink() or _SKIP_NAMES.match(name):
                continue
            base = name[:-3] if name.endswith(".gz") else name
            low = base.lower()
            if low.endswith(_HTML_SUFFIXES):
                if sphinx or in_sources:
                    continue
            elif not (low.endswith(_TEXT_SUFFIXES) or _PLAIN_NAMES.match(base)):
                continue
            rel = p.relative_to(root)
            out.append(Source(p, "doc", _doc_source(rel), str(rel.with_name(base))))
    return out


def _reader(name: str, in_sources: bool) -> Callable[[str], Extracted]:
    """The product's reader for a file name (``.gz`` already dropped): by its suffix; a Sphinx source
    (``_sources/x.rst.txt``, or ``x.txt`` in an older tree) by the suffix before ``.txt``, else as
    reStructuredText; a plain name (``README``, ``NEWS.Debian``) as plain text."""
    low = name.lower()
    if in_sources and low.endswith(".txt"):
        return TEXT_READERS.get(os.path.splitext(low[:-4])[1], read_rst)
    return TEXT_READERS.get(os.path.splitext(low)[1], read_text)


def read_document(src: Source) -> Extracted:
    """A documentation file's title and sections by the product's readers (:mod:`index_builder.documents.readers`:
    the encoding detected, markdown-it-py, lxml, the reStructuredText line rules), gunzipped first; at most
    ``MAX_FILE_BYTES`` of it. :class:`Unreadable` (the reason) when it cannot be read."""
    try:
        with gzip.open(src.path) if src.path.name.endswith(".gz") else open(src.path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise Unreadable(f"cannot be read: {e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise Unreadable(f"over {MAX_FILE_BYTES // 2**20} MiB")
    text, encoding = decode(data)
    out = _reader(src.label.rpartition("/")[2], "_sources" in src.path.parts)(text)
    return Extracted(out.title, out.sections, encoding)


def man_paragraphs(text: str) -> tuple[str, list[str]]:
    """(the NAME line, paragraphs) of a man page rendered without justification: the header and footer lines
    and the section headings (NAME, DESCRIPTION) dropped, a paragraph's lines joined by spaces."""
    lines = text.splitlines()
    body = [i for i, ln in enumerate(lines) if ln.strip()]
    if len(body) >= 2:  # the header and footer lines (LS(1)  User Commands  LS(1))
        lines = [ln for i, ln in enumerate(lines) if i not in (body[0], body[-1])]
    title = ""
    out: list[str] = []
    cur: list[str] = []
    heading_next = True
    for line in lines:
        if line and not line[0].isspace() and line.strip().upper() == line.strip():
            if cur:  # a section heading: a boundary, not text
                out.append(" ".join(cur))
                cur = []
            heading_next = line.strip() == "NAME"
            continue
        if not line.strip():
            if cur:
                out.append(" ".join(cur))
                cur = []
            continue
        cur.append(line.strip())
        if heading_next and not title:
            title = line.strip()
    if cur:
        out.append(" ".join(cur))
    return title, [p for p in (" ".join(p.split()) for p in out) if p]


def section_paragraphs(sections: Iterable[str]) -> list[str]:
    """The paragraphs of a document's sections (blank-line separated; a heading is a paragraph of its own),
    each one line.

    >>> section_paragraphs(["Tar\\n\\nUse it\\nto pack.\\n\\n  x  ", "Extract"])
    ['Tar', 'Use it to pack.', 'x', 'Extract']
    """
    return [p for s in sections for p in (" ".join(b.split()) for b in _PARAGRAPH_BREAK.split(s)) if p]


def mostly_words(paragraph: str, share: float = 0.5) -> bool:
    words = paragraph.split()
    return bool(words) and sum(bool(_ALPHA.match(w)) for w in words) >= share * len(words)


def sentences(paragraph: str, max_words: int) -> list[str]:
    """A paragraph's sentences, any longer than ``max_words`` cut into pieces of that many words."""
    out: list[str] = []
    for s in _SENTENCE.split(paragraph):
        w = s.split()
        out += [" ".join(w[i:i + max_words]) for i in range(0, len(w), max_words)] if len(w) > max_words else [s]
    return [s for s in out if s.strip()]


def cut_passages(paras: Iterable[str], min_words: int = 100, max_words: int = 200) -> list[str]:
    """Passages of ``min_words``-``max_words`` words cut at paragraph boundaries; a paragraph that does not fit
    is added sentence by sentence. A passage ends at the first paragraph end at or past ``min_words``; the tail
    is kept from 60% of ``min_words``.

    >>> p = ["one two three. " * 10, "four five six. " * 10, "x " * 250]
    >>> [len(s.split()) for s in cut_passages(p, 40, 80)]
    [60, 80, 80, 80]
    """
    out: list[str] = []
    cur: list[str] = []
    w = 0
    keep = int(0.6 * min_words)

    def emit() -> None:
        nonlocal cur, w
        if cur:
            out.append(" ".join(cur))
        cur, w = [], 0

    for para in paras:
        pw = len(para.split())
        units = [para] if w + pw <= max_words else sentences(para, max_words)
        for u in units:
            uw = len(u.split())
            if w + uw > max_words and w >= keep:
                emit()
            cur.append(u)
            w += uw
            if w > max_words:  # a short start followed by a long sentence: cut at max_words
                words = " ".join(cur).split()
                cur, w = [" ".join(words[:max_words])], max_words
                emit()
                rest = words[max_words:]
                cur, w = ([" ".join(rest)], len(rest)) if rest else ([], 0)
        if w >= min_words:
            emit()
    if w >= keep or (cur and not out):
        emit()
    return [p for p in out if p.strip()]


def _document_passages(src: Source, min_words: int, max_words: int, man_width: int) -> tuple[str, list[str], str]:
    """(the title found, the passages, why nothing was read: "" when read) of one source."""
    if src.kind == "man":
        text = render_man(src.path, man_width, justify=False)
        if not text:
            return "", [], "man could not render it"
        title, paras = man_paragraphs(text)
    else:
        try:
            doc = read_document(src)
        except Unreadable as e:
            return "", [], str(e)
        except Exception as e:  # noqa: BLE001 -- a reader's failure on one file skips that file, never the run
            return "", [], f"the reader failed: {type(e).__name__}"
        paras = section_paragraphs(doc.sections)
        title = doc.title or next((p for p in paras if 1 <= len(p.split()) <= 12), "")
    paras = [p for p in paras if mostly_words(p)]
    return title, cut_passages(paras, min_words, max_words), ""


def _title(src: Source, found: str) -> str:
    if src.kind == "man":
        name, _, section = src.label.rpartition(".")
        head = f"{name}({section})" if name else src.label
        summary = found.split(" - ", 1)[1] if " - " in found else found
        return f"{head}: {summary}"[:200] if summary else head
    found = found[:160]
    return f"{src.label}: {found}" if found and found.lower() not in src.label.lower() else src.label


def _norm_key(text: str) -> str:
    return hashlib.sha1(" ".join(text.lower().split()).encode()).hexdigest()


def trim_to_pieces(texts: list[str], tokenizer_path: Path, max_pieces: int) -> list[str]:
    """Each text cut at the last whitespace before its ``max_pieces``-th word piece (unchanged when it fits)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.no_padding()
    tok.no_truncation()
    out = []
    for start in range(0, len(texts), 4096):
        batch = texts[start:start + 4096]
        for text, enc in zip(batch, tok.encode_batch(batch, add_special_tokens=False), strict=True):
            if len(enc.ids) > max_pieces:
                end = enc.offsets[max_pieces][0]
                cut = text.rfind(" ", 0, end + 1)
                text = text[:cut if cut > 0 else end].rstrip()
            out.append(text)
    return out


def default_tokenizer() -> Path:
    from index_builder.models.encoders import bundled_minilm

    return bundled_minilm().tokenizer_path


def build_pool(out: Path, *, man_root: Path | None, doc_root: Path | None, min_words: int = 100,
               max_words: int = 200, max_pieces: int = 224, workers: int = 2, man_width: int = 1000,
               limit_files: int = 0, tokenizer: Path | None = None, progress: bool = True,
               debian_only: bool = True) -> dict[str, Any]:
    """Write ``out/pool.jsonl`` (every real passage, deduplicated, in file order) and its statistics.
    ``debian_only``: only files installed by packages from a Debian archive (when dpkg and apt are here)."""
    t0 = time.perf_counter()
    srcs = (man_pages(man_root) if man_root and Path(man_root).is_dir() and _have_man() else []) + \
        (doc_files(doc_root) if doc_root and Path(doc_root).is_dir() else [])
    excluded: Counter = Counter()
    owned = debian_owned() if debian_only else None
    if owned is not None:
        owner, debian = owned
        kept_srcs = []
        for s in srcs:
            pkg = owner.get(str(s.path)) or owner.get(os.path.realpath(s.path))
            if pkg in debian:
                kept_srcs.append(s)
            else:
                excluded[pkg or "(no package)"] += 1
        srcs = kept_srcs
    if limit_files:
        srcs = srcs[:limit_files]
    tokenizer = tokenizer or default_tokenizer()
    results: list[tuple[str, list[str], str]] = [("", [], "")] * len(srcs)
    with ThreadPoolExecutor(max(1, workers)) as pool:
        futures = {pool.submit(_document_passages, s, min_words, max_words, man_width): i for i, s in enumerate(srcs)}
        for done, (fut, i) in enumerate(futures.items(), 1):
            results[i] = fut.result()
            if progress and done % 1000 == 0:
                print(f"  {done}/{len(srcs)} files, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    files_used: Counter = Counter()
    unread: Counter = Counter()
    for src, (found, passages, why) in zip(srcs, results, strict=True):
        if why:
            unread[why.split(":")[0][:60]] += 1
        if passages:
            files_used[src.source] += 1
        title = _title(src, found)
        rows += [{"title": title, "text": p, "source": src.source, "file": str(src.path)} for p in passages]
    texts = trim_to_pieces([r["text"] for r in rows], tokenizer, max_pieces)
    seen: set[str] = set()
    out.mkdir(parents=True, exist_ok=True)
    kept: Counter = Counter()
    words: list[int] = []
    dropped = {"duplicate": 0, "short": 0}
    tmp = out / (POOL + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r, text in zip(rows, texts, strict=True):
            n = len(text.split())
            if n < int(0.6 * min_words) and len(texts) > 1:
                dropped["short"] += 1
                continue
            key = _norm_key(text)
            if key in seen:
                dropped["duplicate"] += 1
                continue
            seen.add(key)
            kept[r["source"]] += 1
            words.append(n)
            f.write(json.dumps({"_id": f"{r['source']}-{key[:16]}", "title": r["title"], "text": text,
                                "metadata": {"source": r["source"]}}, ensure_ascii=False) + "\n")
    os.replace(tmp, out / POOL)
    digest = hashlib.sha1((out / POOL).read_bytes()).hexdigest()
    w = np.asarray(words or [0])
    stats = {"passages": int(sum(kept.values())), "by_source": dict(sorted(kept.items())),
             "files": {"read": len(srcs), "with_passages": dict(sorted(files_used.items())),
                       "unreadable": dict(unread.most_common(20)),
                       "excluded_not_debian": dict(excluded.most_common(20)),
                       "excluded_total": int(sum(excluded.values()))},
             "dropped": dropped, "words": {"mean": round(float(w.mean()), 1), "median": median(words),
                                           "min": int(w.min()), "max": int(w.max()),
                                           "in_range_share": round(float(((w >= min_words) & (w <= max_words)).mean()),
                                                                   3)},
             "words_total": int(w.sum()), "settings": {"min_words": min_words, "max_words": max_words,
                                                       "max_pieces": max_pieces, "man_width": man_width,
                                                       "man_root": str(man_root), "doc_root": str(doc_root)},
             "packages": _package_versions(), "sha1": digest, "seconds": round(time.perf_counter() - t0, 1)}
    (out / POOL_STATS).write_text(json.dumps(stats, indent=1) + "\n")
    return stats


def debian_owned() -> tuple[dict[str, str], set[str]] | None:
    """(installed file -> package, the packages a Debian archive has), or None where dpkg / apt are missing. A
    package no configured Debian archive has (a third-party .deb or repository, e.g. google-cloud-cli's 16,000
    generated man pages here) is not Debian's."""
    info = Path("/var/lib/dpkg/info")
    if not info.is_dir():
        return None
    owner: dict[str, str] = {}
    for lst in sorted(info.glob("*.list")):
        pkg = lst.name[:-5].split(":")[0]
        for line in lst.read_text(errors="replace").splitlines():
            owner[line] = pkg
    pkgs = sorted(set(owner.values()))
    try:
        r = subprocess.run(["apt-cache", "policy", *pkgs], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    debian: set[str] = set()
    pkg = ""
    for line in r.stdout.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            pkg = line[:-1].split(":")[0]
        elif "debian.org" in line:  # some version of it is in a Debian archive (the installed one may be older)
            debian.add(pkg)
    return owner, debian


def _have_man() -> bool:
    from shutil import which

    return which("man") is not None


def _package_versions() -> dict[str, str]:
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version}\n", "python3-doc", "linux-doc", "perl-doc",
                            "debian-reference-en", "man-db"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)


# ---------------------------------------------------------------------------------------------- corpora of a size


def read_pool(out: Path) -> list[dict[str, Any]]:
    path = Path(out) / POOL
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run 'python -m bench.scale_corpus --out {out}' first")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def permutation(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(n)


def real_passages(out: Path, n: int, seed: int = 0, pool: list[dict[str, Any]] | None = None) -> list[dict]:
    """The first ``n`` real passages of the seeded permutation (what every corpus starts with); fewer when the
    pool is smaller."""
    pool = pool if pool is not None else read_pool(out)
    return [pool[i] for i in permutation(len(pool), seed)[:n]]


class Recombiner:
    """Recombined passages: sentences of the pool drawn at random (seeded per passage: passage j is the same in
    every corpus), up to a length drawn from the real passages' lengths, under a real passage's title."""

    def __init__(self, pool: list[dict[str, Any]], seed: int, tokenizer: Path, max_pieces: int = 224,
                 max_sentence_words: int = 80) -> None:
        self.seed, self.tokenizer, self.max_pieces = seed, tokenizer, max_pieces
        self.sentences: list[str] = []
        for row in pool:
            self.sentences += [s for s in _SENTENCE.split(row["text"]) if 3 <= len(s.split()) <= max_sentence_words]
        if not self.sentences:
            raise ValueError("the pool has no sentences to recombine")
        self.lengths = np.array([len(r["text"].split()) for r in pool])
        self.titles = [r["title"] for r in pool]

    def passage(self, j: int) -> dict[str, Any]:
        rng = np.random.default_rng([self.seed, j])
        target = int(self.lengths[rng.integers(len(self.lengths))])
        parts: list[str] = []
        w = 0
        while w < target:
            s = self.sentences[rng.integers(len(self.sentences))]
            parts.append(s)
            w += len(s.split())
        return {"_id": f"recombined-{self.seed}-{j:07d}", "title": self.titles[rng.integers(len(self.titles))],
                "text": " ".join(parts), "metadata": {"source": "recombined"}}

    def passages(self, start: int, stop: int) -> Iterator[dict[str, Any]]:
        for lo in range(start, stop, 4096):
            batch = [self.passage(j) for j in range(lo, min(stop, lo + 4096))]
            texts = trim_to_pieces([r["text"] for r in batch], self.tokenizer, self.max_pieces)
            for row, text in zip(batch, texts, strict=True):
                yield {**row, "text": text}


def corpus_path(out: Path, size: int) -> Path:
    return Path(out) / f"corpus-{size}.jsonl"


def ensure_corpus(out: Path, size: int, seed: int = 0, *, tokenizer: Path | None = None,
                  max_pieces: int | None = None) -> tuple[Path, dict[str, Any]]:
    """``out/corpus-SIZE.jsonl`` (written unless already there for this seed) and what it holds."""
    path = corpus_path(out, size)
    meta_path = path.with_suffix(".json")
    stats = json.loads((Path(out) / POOL_STATS).read_text())
    if path.is_file() and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("seed") == seed and meta.get("passages") == size and meta.get("pool_sha1") == stats.get("sha1"):
            return path, meta
    pool = read_pool(out)
    max_pieces = max_pieces or stats["settings"]["max_pieces"]
    real = real_passages(out, size, seed, pool)
    by_source: Counter = Counter(r["metadata"]["source"] for r in real)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in real:
            f.write(json.dumps({k: r[k] for k in ("_id", "title", "text", "metadata")}, ensure_ascii=False) + "\n")
        if size > len(real):
            rec = Recombiner(pool, seed, tokenizer or default_tokenizer(), max_pieces)
            for r in rec.passages(0, size - len(real)):
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
            by_source["recombined"] = size - len(real)
    os.replace(tmp, path)
    meta = {"passages": size, "seed": seed, "real": len(real), "recombined": size - len(real),
            "by_source": dict(sorted(by_source.items())), "pool_passages": len(pool), "pool_sha1": stats.get("sha1")}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    return path, meta


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({k: r[k] for k in ("_id", "title", "text", "metadata") if k in r},
                               ensure_ascii=False) + "\n")
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale_corpus", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for pool.jsonl and corpus-N.jsonl (outside the repository)")
    ap.add_argument("--sizes", default="10000,100000,1000000", help="corpora to write (passages)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--man-root", default="/usr/share/man", help="'' to skip man pages")
    ap.add_argument("--doc-root", default="/usr/share/doc", help="'' to skip /usr/share/doc")
    ap.add_argument("--min-words", type=int, default=100)
    ap.add_argument("--max-words", type=int, default=200)
    ap.add_argument("--max-pieces", type=int, default=224, help="word pieces per passage at most (one chunk)")
    ap.add_argument("--workers", type=int, default=2, help="man pages rendered in parallel")
    ap.add_argument("--limit-files", type=int, default=0, help="read only the first N files (tests)")
    ap.add_argument("--any-package", action="store_true",
                    help="keep files of packages not from a Debian archive (and files of no package)")
    ap.add_argument("--rebuild-pool", action="store_true", help="re-read the sources even if pool.jsonl exists")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.rebuild_pool or not (out / POOL).is_file():
        stats = build_pool(out, man_root=Path(args.man_root) if args.man_root else None,
                           doc_root=Path(args.doc_root) if args.doc_root else None, min_words=args.min_words,
                           max_words=args.max_words, max_pieces=args.max_pieces, workers=args.workers,
                           limit_files=args.limit_files, debian_only=not args.any_package)
    else:
        stats = json.loads((out / POOL_STATS).read_text())
    print(f"pool: {stats['passages']} real passages {stats['by_source']} from {stats['files']['read']} files "
          f"(words mean {stats['words']['mean']}, median {stats['words']['median']}, "
          f"{stats['words']['in_range_share']:.0%} within {stats['settings']['min_words']}-"
          f"{stats['settings']['max_words']}; "
          f"dropped {stats['dropped']})")
    for size in ints(args.sizes):
        path, meta = ensure_corpus(out, size, args.seed)
        print(f"{path}: {meta['real']} real + {meta['recombined']} recombined")
    return 0


if __name__ == "__main__":
    sys.exit(main())
