"""A folder of real files as documents: the readers, the metadata, the skip reasons, and section-respecting chunks.

The folder is made by the test from the sample corpus's real passages: markdown with headings, reStructuredText,
HTML, Latin-1 text, a README without suffix, a real PDF written by fpdf2, and the bad files a real folder holds
(a corrupt PDF, a password-protected PDF, binary, empty, a 1 GiB sparse file, a symbolic link loop, a broken link).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from index_builder.documents.chunking import Chunker
from index_builder.documents.folder import FolderOptions, FolderReport, iter_folder, plan_sync, walk
from index_builder.documents.readers import SECTION_BREAK, Unreadable, decode, read_file
from index_builder.errors import CorpusError
from index_builder.models.encoders import bundled_minilm
from index_builder.settings import ChunkConfig
from tests.helpers import SAMPLE


def sample_passages() -> dict[str, dict]:
    rows = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    return {r["_id"]: r for r in rows}


def write_pdf(path: Path, title: str, pages: list[str], password: str = "") -> None:
    fpdf = pytest.importorskip("fpdf")
    pdf = fpdf.FPDF()
    pdf.set_title(title)
    pdf.set_font("helvetica", size=11)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 6, text.encode("latin-1", "replace").decode("latin-1"))
    pdf.output(str(path))
    if password:
        import pypdf

        reader = pypdf.PdfReader(str(path))
        writer = pypdf.PdfWriter(clone_from=reader)
        writer.encrypt(user_password=password, owner_password=password, algorithm="RC4-128")
        with open(path, "wb") as f:
            writer.write(f)


def make_folder(root: Path) -> dict[str, dict]:
    p = sample_passages()
    a, b, c, d = p["astro-001"], p["astro-002"], p["astro-003"], p["astro-004"]
    (root / "guides" / "space").mkdir(parents=True)
    (root / "notes").mkdir()
    (root / "guides" / "space" / "stars.md").write_text(
        f"---\ntitle: Space notes\n---\n# Space\n\n## {a['title']}\n\n{a['text']}\n\n## {b['title']}\n\n"
        f"See [the storm](https://example.org/storm) and **this**:\n\n{b['text']}\n\n```\n# not a heading\n```\n",
        encoding="utf-8")
    (root / "guides" / "lensing.rst").write_text(
        f"{'=' * len(c['title'])}\n{c['title']}\n{'=' * len(c['title'])}\n\n.. _label:\n\n.. a comment\n   more of it\n\n"
        f"Overview\n--------\n\n{c['text']}\n", encoding="utf-8")
    (root / "guides" / "page.html").write_text(
        f"<html><head><title>{d['title']}</title><style>p {{color: red}}</style><script>var x = 1;</script></head>"
        f"<body><nav>Home</nav><h1>{d['title']}</h1><p>{d['text']}</p><h2>Footnote</h2><p>Tom &amp; Jerry.</p></body>"
        "</html>", encoding="utf-8")
    (root / "notes" / "latin1.txt").write_bytes(
        "Café au lait: the naïve coöperation of Zoë's façade. ".encode("latin-1") * 8)
    (root / "notes" / "README").write_text("Notes folder.\n\nIt holds notes.\n", encoding="utf-8")
    write_pdf(root / "guides" / "report.pdf", "Astronomy report", [a["text"], b["text"]])
    write_pdf(root / "notes" / "secret.pdf", "Secret", [c["text"]], password="hunter2")
    (root / "notes" / "broken.pdf").write_bytes((root / "guides" / "report.pdf").read_bytes()[:400])
    (root / "notes" / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4)
    (root / "notes" / "empty.md").write_bytes(b"")
    with open(root / "notes" / "huge.txt", "wb") as f:  # a 1 GiB file, sparse: it costs no disk
        f.truncate(2**30)
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (root / ".hidden.md").write_text("# hidden\n\nnot read", encoding="utf-8")
    os.symlink("..", root / "notes" / "up")
    os.symlink("missing.md", root / "notes" / "dangling.md")
    return p


@pytest.fixture()
def folder(tmp_path) -> tuple[Path, dict[str, dict]]:
    root = tmp_path / "docs"
    root.mkdir()
    return root, make_folder(root)


def test_a_folder_of_real_files_becomes_documents_and_each_bad_file_is_skipped_with_its_reason(folder):
    root, p = folder
    report = FolderReport(root=str(root))
    docs = {d.id: d for d in iter_folder(root, FolderOptions(), report)}
    assert sorted(docs) == ["guides/lensing.rst", "guides/page.html", "guides/report.pdf", "guides/space/stars.md",
                            "notes/README", "notes/latin1.txt"]
    reasons = {s.path: s.reason for s in report.skipped}
    assert reasons["notes/secret.pdf"] == "password-protected PDF"
    assert reasons["notes/broken.pdf"].startswith("corrupt PDF")
    assert reasons["notes/image.txt"].startswith("binary content")
    assert reasons["notes/empty.md"] == "empty file"
    assert "1,024 MiB is over the 64 MiB limit" in reasons["notes/huge.txt"]
    assert reasons["notes/up"].startswith("symbolic link loop")
    assert reasons["notes/dangling.md"] == "broken symbolic link"
    assert len(report.skipped) == 7 and report.other_types == {".png": 1}

    md = docs["guides/space/stars.md"]
    assert md.title == "Space notes"  # front matter's title over the first heading
    sections = md.text.split(SECTION_BREAK)
    assert sections[0].startswith(f"Space\n{p['astro-001']['title']}\n\n{p['astro-001']['text'][:40]}")
    assert sections[1].startswith(p["astro-002"]["title"]) and "See the storm and this:" in sections[1]
    assert "# not a heading" in sections[1] and "https://" not in md.text
    assert md.metadata["path"] == "guides/space/stars.md" and md.metadata["ext"] == "md"
    assert md.metadata["collection"] == "guides" and md.metadata["source"] == "docs"
    assert md.metadata["modified"].endswith("Z") and len(md.metadata["content_hash"]) == 32
    rst = docs["guides/lensing.rst"]
    assert rst.title == p["astro-003"]["title"] and "comment" not in rst.text and "label" not in rst.text
    assert p["astro-003"]["text"] in rst.text.replace("\n", " ")
    html = docs["guides/page.html"]
    assert html.title == p["astro-004"]["title"] and "var x" not in html.text and "color" not in html.text
    assert html.text.split(SECTION_BREAK)[1] == "Footnote\n\nTom & Jerry."
    pdf = docs["guides/report.pdf"]
    assert pdf.title == "Astronomy report" and len(pdf.text.split(SECTION_BREAK)) == 2  # a section a page
    assert "light travels in a vacuum" in " ".join(pdf.text.split())
    latin = docs["notes/latin1.txt"]
    assert "naïve coöperation" in latin.text and latin.metadata["encoding"] != "utf-8"
    assert latin.title == "latin1" and latin.metadata["collection"] == "notes"
    assert docs["notes/README"].title == "README"


def test_include_exclude_tenants_and_strict(folder, tmp_path):
    root, _ = folder
    only = [d.id for d in iter_folder(root, FolderOptions(include=("*.md", "*.rst"), exclude=("space/",)))]
    assert only == ["guides/lensing.rst", "guides/space/stars.md"]  # 'space/' matches only at the top
    only = [d.id for d in iter_folder(root, FolderOptions(include=("guides/*",), exclude=("guides/space/*",)))]
    assert only == ["guides/lensing.rst", "guides/page.html", "guides/report.pdf"]
    by_folder = {d.id: d.tenant for d in iter_folder(root, FolderOptions(tenant_from_folder=True, tenant="misc"))}
    assert by_folder["guides/page.html"] == "guides" and by_folder["notes/README"] == "notes"
    mapped = {d.id: d.tenant for d in iter_folder(root, FolderOptions(tenant="all", tenant_map=(("*.pdf", "pdfs"),)))}
    assert mapped["guides/report.pdf"] == "pdfs" and mapped["guides/page.html"] == "all"
    with pytest.raises(CorpusError, match="notes/broken.pdf.*corrupt PDF.*--strict"):
        list(iter_folder(root, FolderOptions(strict=True)))
    with pytest.raises(ValueError, match="tenant"):
        FolderOptions(tenant_map=(("*.md", "bad tenant"),))


def test_a_re_run_plans_added_updated_deleted_and_unchanged(folder):
    root, p = folder
    cache: dict = {}
    first = list(iter_folder(root, FolderOptions(), cache=cache))
    existing = {d.id: (d.metadata["content_hash"], d.tenant) for d in first}
    (root / "guides" / "page.html").write_text("<h1>Changed</h1><p>New text of the page.</p>", encoding="utf-8")
    (root / "notes" / "latin1.txt").unlink()
    (root / "notes" / "new.md").write_text("# New\n\n" + p["astro-005"]["text"], encoding="utf-8")
    os.utime(root / "guides" / "lensing.rst", (1, 1))  # touched, content the same
    again = list(iter_folder(root, FolderOptions(), cache=cache))
    plan = plan_sync(again, existing)
    assert [d.id for d in plan.added] == ["notes/new.md"]
    assert [d.id for d in plan.updated] == ["guides/page.html"]
    assert plan.deleted == ["notes/latin1.txt"] and plan.unchanged == 4


def test_decode_refuses_what_is_not_text():
    assert decode("ü".encode("utf-16"))[0] == "ü"
    with pytest.raises(Unreadable, match="byte-order mark"):
        decode(b"\xff\xfe\x00\xd8")  # a UTF-16 BOM, then a lone surrogate
    with pytest.raises(Unreadable, match="no reader"):
        read_file(Path("x.docx"), b"PK")


def test_chunks_never_straddle_two_sections_and_keep_whole_paragraphs(folder):
    root, p = folder
    chunker = Chunker(bundled_minilm().tokenizer_path, ChunkConfig(max_tokens=64, overlap=16))
    long_a = "\n\n".join(p[k]["text"] for k in ("astro-001", "astro-002", "astro-003"))
    text = SECTION_BREAK.join([f"First\n\n{long_a}", "Second\n\n" + p["astro-004"]["text"], "Third\n\nshort."])
    spans = chunker.spans(text)
    breaks = [i for i, ch in enumerate(text) if ch == SECTION_BREAK]
    for s, e in spans:
        assert not any(s <= b < e for b in breaks), (s, e)
        assert text[s:e] == text[s:e].strip()
    starts = {text[s:e].split("\n")[0] for s, e in spans}
    assert {"Third"} <= starts and text[spans[-1][0]:spans[-1][1]] == "Third\n\nshort."
    paragraphs = [p[k]["text"] for k in ("astro-001", "astro-002", "astro-003")]
    for para in paragraphs:  # a paragraph that fits a window is never cut
        pieces = len(chunker.tokenizer.encode(para, add_special_tokens=False).ids)
        if pieces <= 64:
            assert any(para in text[s:e] for s, e in spans), para[:40]
    plain = p["astro-001"]["text"] + "\n\n" + p["astro-002"]["text"]  # no section break: the windows as before
    assert chunker.spans(plain) == chunker.window_spans(plain)


# ---------------------------------------------------------------------- links, names, budgets (issue 51)

def test_links_out_of_the_folder_are_skipped_and_counted_and_links_inside_still_work(tmp_path):
    root, outside = tmp_path / "docs", tmp_path / "docs2"  # docs2 shares the prefix "docs": still outside
    (root / "guides").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.md").write_text("# Secret\n\nthe payroll of everyone", encoding="utf-8")
    (root / "guides" / "a.md").write_text("# A\n\nInside the folder.", encoding="utf-8")
    os.symlink("/etc/passwd", root / "passwd.txt")
    os.symlink("/etc", root / "etc")
    os.symlink(outside / "secret.md", root / "secret.md")
    os.symlink("../../docs2", root / "guides" / "up")  # relative, leaving through ..
    os.symlink("guides/a.md", root / "alias.md")  # inside: read under its own name
    os.symlink("guides", root / "mirror")  # inside: a folder already read
    os.mkfifo(root / "pipe.md")  # opening it would block a reader that did not check
    report = FolderReport(root=str(root))
    docs = {d.id: d for d in iter_folder(root, FolderOptions(), report)}
    assert sorted(docs) == ["alias.md", "guides/a.md"]
    assert docs["alias.md"].text == docs["guides/a.md"].text
    reasons = {s.path: s.reason for s in report.skipped}
    assert reasons["passwd.txt"] == "a symbolic link to /etc/passwd, outside the folder (--follow-links-outside reads it)"
    assert reasons["etc"].startswith("a symbolic link to /etc, outside the folder")
    assert reasons["secret.md"].startswith(f"a symbolic link to {outside / 'secret.md'}, outside")
    assert reasons["guides/up"].startswith(f"a symbolic link to {outside}, outside")
    assert reasons["mirror"] == "links to a folder already read (guides)"
    assert reasons["pipe.md"] == "not a regular file or folder (a FIFO, socket or device)"
    assert report.links_outside == 4 and "4 links out of the folder not followed" in report.summary()
    assert not any("root:" in d.text or "payroll" in d.text for d in docs.values())
    with pytest.raises(CorpusError, match=r"docs/etc: a symbolic link to /etc, outside.*--strict"):
        list(iter_folder(root, FolderOptions(strict=True)))

    report = FolderReport(root=str(root))  # the operator's opt-in (no /etc here: it would read all of it)
    os.unlink(root / "etc")
    docs = {d.id: d for d in iter_folder(root, FolderOptions(follow_links_outside=True), report)}
    assert {"secret.md", "guides/up/secret.md"} <= set(docs) and "payroll" in docs["secret.md"].text
    assert report.links_outside == 0


def test_a_file_that_leaves_the_folder_after_the_walk_is_not_read(tmp_path):
    """The walk checked docs/sub/notes.md; then sub is swapped for a link to another folder (or notes.md for a
    link): the reader process opens what the walk checked, or refuses."""
    from index_builder.documents.reader_pool import ReaderPool, read_checked, read_request

    root, elsewhere = tmp_path / "docs", tmp_path / "elsewhere"
    (root / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    (root / "sub" / "notes.md").write_text("# Notes\n\nfine", encoding="utf-8")
    (root / "other.md").write_text("# Other\n\nfine", encoding="utf-8")
    (elsewhere / "notes.md").write_text("# Stolen\n\nthe payroll", encoding="utf-8")
    walked = dict(walk(root))
    assert read_checked(str(walked["sub/notes.md"]), "notes.md", root=str(root), max_bytes=2**20)["text"].endswith("fine")
    os.rename(root / "sub", tmp_path / "sub-moved")
    os.symlink(elsewhere, root / "sub")
    with pytest.raises(Unreadable, match="changed into a path outside the folder"):
        read_checked(str(walked["sub/notes.md"]), "notes.md", root=str(root), max_bytes=2**20)
    os.unlink(root / "other.md")
    os.symlink(elsewhere / "notes.md", root / "other.md")
    with pytest.raises(Unreadable, match="became a symbolic link"):
        read_checked(str(walked["other.md"]), "other.md", root=str(root), max_bytes=2**20)
    from index_builder.documents.reader_pool import Job

    with ReaderPool(workers=1) as pool:  # the same through a reader process
        jobs = [Job(rel, request=read_request(path, rel, root=str(root), max_bytes=2**20)) for rel, path in walked.items()]
        answers = {j.key: j.result for j in pool.run(jobs)}
    assert answers == {"other.md": {"skip": "became a symbolic link after the folder was listed"},
                       "sub/notes.md": {"skip": "changed into a path outside the folder after the folder was listed"}}


def test_names_become_valid_utf8_ids_and_control_or_bidi_names_are_skipped_and_printed_escaped(tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    raw = os.fsencode(root)
    body = b"# Cafe\n\nA note about coffee and milk."
    with open(raw + b"/caf\xe9.md", "wb") as f:  # a Latin-1 name: not UTF-8
        f.write(body)
    with open(raw + b"/men\xfc.md", "wb") as f:
        f.write(body)
    (root / "men%FC.md").write_text("# Menu\n\nthe real one", encoding="utf-8")  # what men\xfc.md would escape to
    bad = ["new\nline.md", "tab\tname.md", "evil\u202etxt.md", "esc\x1b[2J.md", "bell\x07.md", "c1\x85.md",
           "mark\u200f.md", "iso\u2066late.md", "arabic\u061c.md"]
    for name in bad:
        (root / name).write_bytes(body)
    (root / "dir\u202e").mkdir()
    (root / "dir\u202e" / "inner.md").write_bytes(body)
    report = FolderReport(root=str(root))
    docs = {d.id: d for d in iter_folder(root, FolderOptions(), report)}
    assert sorted(docs) == ["caf%E9.md", "men%FC.md"]
    assert docs["men%FC.md"].text.endswith("the real one")
    cafe = docs["caf%E9.md"]
    assert cafe.metadata["path"] == "caf%E9.md" and cafe.title == "Cafe"
    for d in docs.values():
        d.id.encode("utf-8")  # no lone surrogate: encodable as every store, snapshot and door needs
        json.dumps(d.metadata, ensure_ascii=False).encode("utf-8")
    reasons = {s.path: s.reason for s in report.skipped}
    assert reasons["men\udcfc.md"] == "its name is not UTF-8, and its escaped form 'men%FC.md' is another file's name"
    for name in bad + ["dir\u202e"]:
        assert reasons[name].startswith("its name holds a control or bidirectional-override character (U+"), name
    lines = "\n".join(s.line() for s in report.skipped)
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]",
                         lines)
    assert lines.count("\n") == len(report.skipped) - 1  # a newline in a name does not start a line
    assert "skipped evil\\u202etxt.md: " in lines and "skipped esc\\x1b[2J.md: " in lines
    assert "skipped new\\nline.md: " in lines and "skipped men\\udcfc.md: " in lines


def test_a_file_over_the_time_or_memory_budget_is_skipped_and_the_run_goes_on(tmp_path):
    """A real reader on real files, with budgets small enough to reach: 2 MB of '[' takes markdown-it-py about
    15 s here (linear, but slow), over a 1 s budget; 200 MB of text needs more than 256 MiB to decode and clean."""
    root = tmp_path / "docs"
    root.mkdir()
    (root / "a.md").write_text("# A\n\nfirst", encoding="utf-8")
    (root / "b-slow.md").write_text("[" * 2_000_000, encoding="utf-8")
    (root / "c.md").write_text("# C\n\nafter the slow one", encoding="utf-8")
    with open(root / "d-big.txt", "wb") as f:
        for _ in range(200):
            f.write(b"word " * 200_000 + b"\n")
    (root / "e.md").write_text("# E\n\nafter the big one", encoding="utf-8")
    report = FolderReport(root=str(root))
    t = time.monotonic()
    options = FolderOptions(read_timeout_s=1.0, read_memory_mb=256, max_file_mb=256, read_workers=1)
    docs = [d.id for d in iter_folder(root, options, report)]
    assert docs == ["a.md", "c.md", "e.md"]
    reasons = {s.path: s.reason for s in report.skipped}
    assert reasons["b-slow.md"] == "reading it took over 1 s (the per-file budget); the reader was stopped"
    assert reasons["d-big.txt"] == "reading it needs more than the reader's 256 MiB of memory"
    assert time.monotonic() - t < 30
