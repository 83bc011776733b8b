"""File readers: the text of a markdown, reStructuredText, HTML, plain-text or PDF file, as a title and sections.

A reader returns :class:`Extracted`: the title (the first heading; "" when the file has none, and the folder reader
falls back to the file name) and the sections in order, each starting with its heading line. The folder reader
joins the sections with a form feed (``SECTION_BREAK``), and the chunker never lets a chunk straddle one.

Every reader runs in time linear in its input, because a folder holds files nobody checked (a line of 50,000 ``[``
took 17 s with the former regex rules, and a 1 MB line hours):
- markdown: markdown-it-py (CommonMark, the reference algorithm with its delimiter and bracket bounds), its token
  stream walked once;
- reStructuredText: line rules; every pattern is anchored at a line's start, and inline markup is removed by
  single passes that never rescan from each position;
- HTML: lxml (libxml2's HTML parser: HTML5 tokenization, linear time, nesting capped at 256). selectolax was
  measured too and refused: its HTML5 tree builder scans the stack of open elements on every tag, 188 s for 1 MB
  of nested ``<div>``; the standard library's ``html.parser`` rescans unclosed ``<!--`` / ``<a`` (1 s for 50 KB);
- PDF: pypdf (pure Python, no system libraries, reports encryption; its decompression and page-tree limits are
  caught as skips), text counted page by page against the document limit.
What bounds the rest (a 64 MiB file read in linear time can still be slow) is the folder reader's per-file time and
memory budget (:mod:`index_builder.documents.reader_pool`). Encodings: UTF-8 (with or without BOM) and UTF-16/32 with a BOM
are decoded directly; anything else is detected by ``charset-normalizer`` and refused, with the file named, when it
cannot be recognised.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SECTION_BREAK = "\f"  # between two sections of a document read from a file (pdftotext's page break)
READER_VERSION = "2"  # part of every file's content hash: a reader change re-reads every file (2: markdown-it-py, lxml)
MAX_TEXT_CHARS = 1_000_000  # the document store's limit (retrieval.live.store): a file with more text is skipped


class Unreadable(Exception):
    """A file that cannot be read as text; the message is the reason shown on the skip line."""


@dataclass(frozen=True)
class Extracted:
    title: str
    sections: list[str]
    encoding: str = ""


# ---------------------------------------------------------------------- bytes -> str

_BOMS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"),
         (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def decode(data: bytes) -> tuple[str, str]:
    r"""The text of a file's bytes and the encoding used; :class:`Unreadable` for binary or unrecognised bytes.

    >>> decode("naïve".encode("utf-8"))
    ('naïve', 'utf-8')
    >>> decode("\ufeffhello".encode("utf-16"))[0]
    'hello'
    >>> decode(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    Traceback (most recent call last):
    ...
    index_builder.documents.readers.Unreadable: binary content (NUL bytes): not a text file
    """
    for bom, enc in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(enc).lstrip("\ufeff"), enc.replace("-sig", "")
            except UnicodeDecodeError as e:
                raise Unreadable(f"starts with a {enc} byte-order mark but is not valid {enc} ({e.reason} at byte "
                                 f"{e.start})") from None
    if b"\x00" in data[:8192]:
        raise Unreadable("binary content (NUL bytes): not a text file")
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    try:
        from charset_normalizer import from_bytes
    except ImportError:  # pragma: no cover - a declared dependency
        raise Unreadable("not UTF-8, and charset-normalizer is not installed to detect its encoding") from None
    matches = list(from_bytes(data[:1 << 20]))
    if not matches:
        raise Unreadable("not UTF-8 and no text encoding recognised")
    best = matches[0]
    # A short Western text fits several code pages equally well (cp1250 and cp1252 differ in a few letters);
    # among the least chaotic readings, Windows-1252 (a superset of Latin-1) is by far the likeliest.
    for m in matches:
        if m.chaos <= best.chaos and "cp1252" in (m.could_be_from_charset or [m.encoding]):
            best = m
            best_encoding = "cp1252"
            break
    else:
        best_encoding = best.encoding
    try:
        return data.decode(best_encoding), best_encoding
    except (UnicodeDecodeError, LookupError):
        raise Unreadable(f"not UTF-8; looks like {best.encoding} but does not decode as it") from None


# ---------------------------------------------------------------------- shared helpers

_BLANKS = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # everything but tab and newline (the form feed is ours)


def _clean(text: str) -> str:
    text = _CONTROL.sub(" ", text.replace("\r\n", "\n").replace("\r", "\n"))
    lines = [ln.rstrip() for ln in text.split("\n")]
    return _BLANKS.sub("\n\n", "\n".join(lines)).strip()


class _Sections:
    """Collects (heading, body lines) pairs; a heading with no body joins the next section as its context."""

    def __init__(self) -> None:
        self.title = ""
        self.done: list[str] = []
        self.heading = ""
        self.body: list[str] = []

    def start(self, heading: str, *, top: bool = True) -> None:
        heading = " ".join(heading.split())
        if not heading:
            return
        if top and not self.title:
            self.title = heading
        if self.body and any(ln.strip() for ln in self.body):
            self.close()
            self.heading = heading
        else:  # nothing under the previous heading: keep it as the new section's context
            self.heading = f"{self.heading}\n{heading}" if self.heading else heading
            self.body = []

    def add(self, line: str) -> None:
        self.body.append(line)

    def close(self) -> None:
        text = _clean("\n".join(self.body))
        if text:
            self.done.append(f"{self.heading}\n\n{text}" if self.heading else text)
        elif self.heading:
            self.done.append(self.heading)
        self.heading, self.body = "", []

    def result(self, encoding: str = "") -> Extracted:
        self.close()
        return Extracted(self.title, [s for s in self.done if s.strip()], encoding)


# ---------------------------------------------------------------------- markdown

_MD_PARSER = None


def _markdown_parser():
    """CommonMark with GFM tables and strikethrough (markdown-it-py: linear time, nesting capped at 20 levels)."""
    global _MD_PARSER
    if _MD_PARSER is None:
        from markdown_it import MarkdownIt

        _MD_PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    return _MD_PARSER


def _md_inline(children) -> str:
    """An inline token's text: links and emphasis reduced to their text, images to their alt text, tags dropped."""
    out: list[str] = []
    for t in children or ():
        if t.type in ("text", "code_inline"):
            out.append(t.content)
        elif t.type in ("softbreak", "hardbreak"):
            out.append("\n")
        elif t.type == "image":
            out.append(_md_inline(t.children))
    return "".join(out)


def _front_matter(lines: list[str]) -> tuple[str, int]:
    """YAML front matter's title (``title: ...``) and the index of the first line after it."""
    if not lines or lines[0].strip() != "---":
        return "", 0
    for j in range(1, min(len(lines), 200)):
        if lines[j].strip() in ("---", "..."):
            title = ""
            for ln in lines[1:j]:
                key, sep, value = ln.partition(":")
                if sep and key == "title":
                    value = value.strip()
                    value = value[1:] if value[:1] in ("'", '"') else value
                    value = value[:-1] if value[-1:] in ("'", '"') else value
                    title = value.strip() or title
            return title, j + 1
    return "", 0


def read_markdown(text: str) -> Extracted:
    """Sections at ATX (``# H``) and setext headings; code blocks kept verbatim; links and emphasis reduced to text;
    HTML blocks reduced to their visible text. Parsed by markdown-it-py (CommonMark), whose token stream is walked
    once: no rule rescans a line.

    >>> r = read_markdown("---\\ntitle: Tar notes\\n---\\n# Tar\\nIntro.\\n\\n## Extract\\nUse **-C** [dir](x).\\n")
    >>> r.title, r.sections
    ('Tar notes', ['Tar\\n\\nIntro.', 'Extract\\n\\nUse -C dir.'])
    """
    lines = text.replace("\r\n", "\n").split("\n")
    s = _Sections()
    s.title, first = _front_matter(lines)
    body = "\n".join(lines[first:]) if first else "\n".join(lines)
    heading = False
    lists = 0
    prefix = ""  # a list item's marker, put before its first line
    row: list[str] | None = None
    for tok in _markdown_parser().parse(body):
        kind = tok.type
        if kind == "heading_open":
            heading = True
        elif kind == "heading_close":
            heading = False
        elif kind == "inline":
            content = _md_inline(tok.children)
            if heading:
                s.start(content, top=True)
            elif row is not None:
                row.append(" ".join(content.split()))
            else:
                for k, line in enumerate(content.split("\n")):
                    s.add(prefix + line if k == 0 else line)
                prefix = ""
        elif kind in ("fence", "code_block"):
            for line in tok.content.rstrip("\n").split("\n"):
                s.add(line)
            s.add("")
        elif kind == "html_block":
            for line in _html_fragment_text(tok.content).split("\n"):
                s.add(line)
            s.add("")
        elif kind in ("bullet_list_open", "ordered_list_open"):
            lists += 1
        elif kind in ("bullet_list_close", "ordered_list_close"):
            lists -= 1
            if not lists:
                s.add("")
        elif kind == "list_item_open":
            prefix = "  " * (lists - 1) + (tok.info + tok.markup if tok.info else tok.markup) + " "
        elif kind == "paragraph_close" and not tok.hidden:
            s.add("")
        elif kind == "tr_open":
            row = []
        elif kind == "tr_close" and row is not None:
            s.add(" | ".join(row))
            row = None
        elif kind == "table_close":
            s.add("")
    return s.result()


# ---------------------------------------------------------------------- reStructuredText

_RST_ADORN = re.compile(r"^([=\-`:'\"~^_*+#<>.])\1{2,}\s*$")  # anchored, one run: linear
_RST_LABEL = re.compile(r"^\.\.\s+(_[^:]*:|\|[^|]+\|)")  # anchored, each part stops at one character: linear
_RST_DIRECTIVE = re.compile(r"^\.\.\s+([\w:-]+)::\s*(.*)$")  # anchored: the name backtracks over itself once
_RST_DELIMS = ("``", "**", "*", "`")


def _role_char(c: str) -> bool:
    return c.isalnum() or c in "_:+.-"


def _rst_roles(line: str) -> str:
    """``:role:`text``` -> ``text``, in one pass (the old ``:[A-Za-z][\\w:+.-]*:`([^`]*)``` regex, leftmost
    match first, rescanned the role characters from every colon)."""
    out: list[str] = []
    done = 0
    k = line.find(":`")
    while k >= 0:
        r = k  # the run of role characters ending at k (the role's closing colon)
        while r > done and _role_char(line[r - 1]):
            r -= 1
        start = next((j for j in range(r, k) if line[j] == ":" and j + 1 < k and line[j + 1].isascii()
                      and line[j + 1].isalpha()), -1)
        if start >= 0:
            close = line.find("`", k + 2)
            if close < 0:
                break  # no closing backtick: no later role can close either
            out.append(line[done:start])
            out.append(line[k + 2:close])
            done = close + 1
            k = line.find(":`", done)
        else:
            k = line.find(":`", k + 1)
    out.append(line[done:])
    return "".join(out)


def _rst_links(line: str) -> str:
    """```text <url>`_`` (or ``__``) -> ``text``, in one pass: the next ``>`` is found once for all openers."""
    out: list[str] = []
    done = 0
    gt = -1
    b = line.find("`")
    while b >= 0:
        p = b + 1
        while p < len(line) and line[p] not in "`<":
            p += 1
        if p < len(line) and line[p] == "<" and p > b + 1:
            if gt < p:
                gt = line.find(">", p)
                if gt < 0:
                    break
            if line.startswith("`_", gt + 1):
                label = line[b + 1:p].rstrip() or line[b + 1]
                out.append(line[done:b])
                out.append(label)
                done = gt + 3 + (line[gt + 3:gt + 4] == "_")
                b = line.find("`", done)
                continue
        b = line.find("`", b + 1)
    out.append(line[done:])
    return "".join(out)


def _rst_emphasis(line: str) -> str:
    """````x````, ``**x**``, ``*x*``, ```x``` -> ``x``: each delimiter pairs with the next one that follows a
    non-space, as the old ``(``|\\*\\*|\\*|`)(?=\\S)(.+?)(?<=\\S)\\1_{0,2}`` regex did, but the next closer of each
    delimiter is looked up once (search positions only move forward), so the pass is linear."""
    cache: dict[str, tuple[int, int]] = {}  # delimiter -> (from, the first closer at or after it; -1: none)

    def closer(d: str, start: int) -> int:
        if d in cache:
            since, found = cache[d]
            if start >= since and (found < 0 or found >= start):
                return found
        j = line.find(d, start)
        while j >= 0 and line[j - 1].isspace():
            j = line.find(d, j + 1)
        cache[d] = (start, j)
        return j

    out: list[str] = []
    i = 0
    n = len(line)
    while i < n:
        c = line[i]
        if c in "*`":
            for d in _RST_DELIMS:
                if line.startswith(d, i) and i + len(d) < n and not line[i + len(d)].isspace():
                    j = closer(d, i + len(d) + 1)
                    if j >= 0:
                        out.append(line[i + len(d):j])
                        i = j + len(d)
                        for _ in range(2):
                            if i < n and line[i] == "_":
                                i += 1
                        break
            else:
                out.append(c)
                i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _rst_inline(line: str) -> str:
    """A line's text without roles, hyperlink targets and inline markup.

    >>> _rst_inline("Use :func:`tar.open`, `the docs <https://x>`_ and **bold** or ``code``_.")
    'Use tar.open, the docs and bold or code.'
    """
    return _rst_emphasis(_rst_links(_rst_roles(line)))


def read_rst(text: str) -> Extracted:
    """Sections at titles underlined (and optionally overlined) by a punctuation run; comments and labels dropped.

    >>> r = read_rst("=====\\nGuide\\n=====\\n\\n.. _x:\\n\\nUsage\\n-----\\nRun ``tool -v``.\\n")
    >>> r.title, r.sections
    ('Guide', ['Guide\\nUsage\\n\\nRun tool -v.'])
    """
    lines = text.replace("\r\n", "\n").split("\n")
    s = _Sections()
    i = 0
    in_comment = False
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if in_comment:  # an indented comment body
            if line.strip() and not line[:1].isspace():
                in_comment = False
            else:
                i += 1
                continue
        if _RST_ADORN.match(line) and nxt.strip() and i + 2 < len(lines) and _RST_ADORN.match(lines[i + 2]):
            s.start(_rst_inline(nxt.strip()))  # overlined title
            i += 3
            continue
        if line.strip() and not line[:1].isspace() and _RST_ADORN.match(nxt) and len(nxt.strip()) >= len(line.strip()):
            s.start(_rst_inline(line.strip()))
            i += 2
            continue
        if line.startswith(".."):
            if m := _RST_DIRECTIVE.match(line):
                if m.group(2):
                    s.add(_rst_inline(m.group(2)))
            elif _RST_LABEL.match(line) or line.strip() == ".." or not _RST_DIRECTIVE.match(line):
                in_comment = not _RST_LABEL.match(line)
            i += 1
            continue
        s.add(_rst_inline(line))
        i += 1
    return s.result()


# ---------------------------------------------------------------------- HTML

_SKIP_TAGS = {"script", "style", "noscript", "template", "svg", "head", "iframe", "object", "nav"}
_BLOCK_TAGS = {"p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "pre", "table", "tr", "blockquote", "section",
               "article", "header", "footer", "nav", "aside", "main", "hr", "form", "figure", "figcaption", "td", "th"}
_HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}


def _html_tree(text: str):
    """The document's tree by libxml2's HTML parser (lxml): HTML5 tokenization in linear time, nesting capped at
    256 levels (deeper content is dropped, not parsed), no network, no entity expansion from a DTD."""
    from lxml import etree

    parser = etree.HTMLParser(encoding="utf-8", no_network=True, remove_blank_text=False)
    return etree.fromstring(text.encode("utf-8", "replace"), parser)


class _HTMLText:
    """Visible text in blocks, sections at headings, from one walk of the tree's start and end events."""

    def __init__(self) -> None:
        self.sections = _Sections()
        self.heading: list[str] | None = None
        self.line: list[str] = []
        self.pre = 0

    def flush(self) -> None:
        text = "".join(self.line)
        if self.pre:
            for ln in text.split("\n"):
                self.sections.add(ln)
        else:
            self.sections.add(" ".join(text.split()))
            self.sections.add("")
        self.line = []

    def data(self, data: str | None) -> None:
        if data:
            (self.heading if self.heading is not None else self.line).append(data)

    def walk(self, root) -> None:
        from lxml import etree

        events = etree.iterwalk(root, events=("start", "end", "comment", "pi"))
        for event, el in events:
            tag = el.tag if isinstance(el.tag, str) else ""
            if event == "start":
                if tag in _SKIP_TAGS:
                    events.skip_subtree()
                    continue
                if tag in _HEADINGS:
                    self.flush()
                    self.heading = []
                elif tag in _BLOCK_TAGS:
                    self.flush()
                    if tag == "pre":
                        self.pre += 1
                self.data(el.text)
                continue
            if event == "end" and tag not in _SKIP_TAGS:
                if tag in _HEADINGS and self.heading is not None:
                    self.sections.start("".join(self.heading), top=tag in ("h1", "h2") or not self.sections.title)
                    self.heading = None
                elif tag in _BLOCK_TAGS:
                    self.flush()
                    if tag == "pre":
                        self.pre = max(0, self.pre - 1)
            self.data(el.tail)  # a comment's, an element's: the text after it
        self.flush()


def _html_fragment_text(fragment: str) -> str:
    """The visible text of a piece of HTML (a markdown file's HTML block), one block a line."""
    root = _html_tree(fragment)
    if root is None:
        return ""
    p = _HTMLText()
    p.walk(root)
    return "\n\n".join(p.sections.result().sections)


def read_html(text: str) -> Extracted:
    """Visible text in blocks, sections at ``<h1>``-``<h6>``; the title is ``<title>``, else the first heading.

    >>> r = read_html("<html><head><title>Tar</title><style>p{}</style></head><body><h1>Tar</h1><p>Archives"
    ...               "&amp; more.</p><script>x()</script><h2>Extract</h2><p>Use <b>-C</b>.</p></body></html>")
    >>> r.title, r.sections
    ('Tar', ['Tar\\n\\nArchives& more.', 'Extract\\n\\nUse -C.'])
    """
    root = _html_tree(text)
    if root is None:
        return Extracted("", [])
    p = _HTMLText()
    p.walk(root)
    out = p.sections.result()
    title = " ".join((root.findtext(".//title") or "").split())
    return Extracted(title or out.title, out.sections)


# ---------------------------------------------------------------------- plain text and PDF

def read_text(text: str) -> Extracted:
    """Plain text: one section; paragraphs (blank lines) are kept for the chunker. The title is the file name's."""
    cleaned = _clean(text)
    return Extracted("", [cleaned] if cleaned else [])


def read_pdf(data: bytes | Path, max_chars: int = MAX_TEXT_CHARS) -> Extracted:
    """A PDF's text layer, a section per page; encrypted (password), corrupt and bomb files are :class:`Unreadable`.

    The text is counted while pages are extracted: past ``max_chars`` the file is refused at once, before the rest
    is read. Every error pypdf raises (its resource limits, ``LimitReachedError``, included) is a reason, never a
    traceback."""
    try:
        import pypdf
    except ImportError:  # pragma: no cover - a declared dependency
        raise Unreadable("reading PDF needs pypdf (pip install pypdf)") from None
    import io
    import logging

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings about odd-but-readable files are noise here
    source = io.BytesIO(data) if isinstance(data, bytes) else str(data)
    pages: list[str] = []
    total = 0
    try:
        reader = pypdf.PdfReader(source, strict=False)
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")
            except Exception as e:  # noqa: BLE001 - pypdf raises several types for ciphers it cannot do
                raise Unreadable(f"encrypted PDF that could not be opened ({str(e)[:160]})") from None
            if not opened:
                raise Unreadable("password-protected PDF")
        for page in reader.pages:
            text = _clean(page.extract_text() or "")
            total += len(text)
            if total > max_chars:
                raise Unreadable(f"over {max_chars:,} characters of text by page {len(pages) + 1}; a document "
                                 f"holds at most {max_chars:,}")
            pages.append(text)
        meta = reader.metadata
        title = str(meta.title).strip() if meta is not None and meta.title else ""
    except (Unreadable, MemoryError):
        raise
    except pypdf.errors.LimitReachedError as e:
        raise Unreadable(f"PDF over a safety limit: {str(e)[:160]}") from None
    except Exception as e:  # noqa: BLE001 - any failure inside pypdf on a hostile file is a skip, never a crash
        raise Unreadable(f"corrupt PDF: {type(e).__name__}: {str(e)[:160]}") from None
    pages = [p for p in pages if p]
    if not pages:
        raise Unreadable("PDF has no text layer (a scan? no OCR is done)")
    return Extracted(" ".join(title.split())[:300], pages)


TEXT_READERS: dict[str, Callable[[str], Extracted]] = {
    ".md": read_markdown, ".markdown": read_markdown, ".mdx": read_markdown,
    ".rst": read_rst, ".rest": read_rst,
    ".html": read_html, ".htm": read_html, ".xhtml": read_html,
    ".txt": read_text, ".text": read_text,
}
PDF_SUFFIXES = (".pdf",)
SUPPORTED = tuple(TEXT_READERS) + PDF_SUFFIXES
# plain-text files conventionally without a suffix (a project's README, NEWS, ...): read as text
TEXT_NAMES = frozenset({"README", "NEWS", "CHANGES", "CHANGELOG", "HISTORY", "AUTHORS", "INSTALL", "TODO", "FAQ",
                        "CONTRIBUTING", "USAGE", "NOTES", "THANKS", "BUGS"})


def has_reader(path: Path | str) -> bool:
    """Whether a reader handles this file (by its suffix, or its conventional name); a ``str`` is a file name.

    >>> has_reader(Path("a/Guide.MD")), has_reader(Path("README")), has_reader("logo.png")
    (True, True, False)
    """
    name = path if isinstance(path, str) else path.name
    suffix = os.path.splitext(name)[1].lower()
    return suffix in SUPPORTED or (not suffix and name.upper() in TEXT_NAMES)


def read_file(path: Path, data: bytes | None = None) -> Extracted:
    """The text of one file by its suffix; :class:`Unreadable` (the reason) when it cannot be had."""
    suffix = path.suffix.lower()
    if suffix in PDF_SUFFIXES:
        if data is None:
            data = path.read_bytes()
        if not data.lstrip()[:5].startswith(b"%PDF"):
            raise Unreadable("corrupt PDF: no %PDF header")
        return read_pdf(data)
    reader = TEXT_READERS.get(suffix) or (read_text if has_reader(path) else None)
    if reader is None:
        raise Unreadable(f"no reader for {suffix or 'files without a suffix'!r}")
    if data is None:
        data = path.read_bytes()
    text, encoding = decode(data)
    out = reader(text)
    return Extracted(out.title, out.sections, encoding)
