"""File readers: the text of a markdown, reStructuredText, HTML, plain-text or PDF file, as a title and sections.

A reader returns :class:`Extracted`: the title (the first heading; "" when the file has none, and the folder reader
falls back to the file name) and the sections in order, each starting with its heading line. The folder reader
joins the sections with a form feed (``SECTION_BREAK``), and the chunker never lets a chunk straddle one.

Choices (why no heavier library): markdown, reStructuredText and HTML are read with line rules and the standard
library's ``html.parser``: the service needs their text and their section structure, not a rendering, and these
readers cost no dependency and never execute anything. PDF is read with ``pypdf``: pure Python, no system
libraries, maintained, and it reports encryption explicitly (a password-protected file is refused by name).
Encodings: UTF-8 (with or without BOM) and UTF-16/32 with a BOM are decoded directly; anything else is detected by
``charset-normalizer`` and refused, with the file named, when it cannot be recognised.
"""

from __future__ import annotations

import html
import html.parser
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SECTION_BREAK = "\f"  # between two sections of a document read from a file (pdftotext's page break)
READER_VERSION = "1"  # part of every file's content hash: a reader change re-reads every file


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
    index_builder.readers.Unreadable: binary content (NUL bytes): not a text file
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

_ATX = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_MD_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_MD_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_MD_REF_LINK = re.compile(r"\[([^\]]+)\]\[[^\]]*\]")
_MD_LINK_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s+\S+")
_MD_EMPHASIS = re.compile(r"(\*\*|__|`+)(?=\S)(.+?)(?<=\S)\1")
_TAG = re.compile(r"</?[A-Za-z][^>\n]*>|<!--.*?-->", re.S)


def _md_inline(line: str) -> str:
    line = _MD_IMAGE.sub(r"\1", line)
    line = _MD_LINK.sub(r"\1", line)
    line = _MD_REF_LINK.sub(r"\1", line)
    line = _MD_EMPHASIS.sub(r"\2", line)
    return html.unescape(_TAG.sub("", line))


def read_markdown(text: str) -> Extracted:
    """Sections at ATX (``# H``) and setext headings; code blocks kept verbatim; links and emphasis reduced to text.

    >>> r = read_markdown("---\\ntitle: Tar notes\\n---\\n# Tar\\nIntro.\\n\\n## Extract\\nUse **-C** [dir](x).\\n")
    >>> r.title, r.sections
    ('Tar notes', ['Tar\\n\\nIntro.', 'Extract\\n\\nUse -C dir.'])
    """
    lines = text.replace("\r\n", "\n").split("\n")
    s = _Sections()
    i = 0
    if lines and lines[0].strip() == "---":  # YAML front matter: its title, if any, names the document
        for j in range(1, min(len(lines), 200)):
            if lines[j].strip() in ("---", "..."):
                for ln in lines[1:j]:
                    m = re.match(r"^title:\s*['\"]?(.*?)['\"]?\s*$", ln)
                    if m and m.group(1):
                        s.title = m.group(1)
                i = j + 1
                break
    fence = ""
    while i < len(lines):
        line = lines[i]
        if fence:
            if line.strip().startswith(fence):
                fence = ""
            else:
                s.add(line)
            i += 1
            continue
        if m := _FENCE.match(line):
            fence = m.group(1)[:3]
            i += 1
            continue
        if m := _ATX.match(line):
            s.start(_md_inline(m.group(2)), top=True)
        elif (i + 1 < len(lines) and line.strip() and _SETEXT.match(lines[i + 1])
              and (i == 0 or not lines[i - 1].strip()) and not re.match(r"^\s*([-*+]|\d+[.)])\s", line)):
            s.start(_md_inline(line.strip()), top=True)
            i += 1
        elif not _MD_LINK_DEF.match(line) and not _TAG.fullmatch(line.strip() or "x"):
            s.add(_md_inline(line))
        i += 1
    return s.result()


# ---------------------------------------------------------------------- reStructuredText

_RST_ADORN = re.compile(r"^([=\-`:'\"~^_*+#<>.])\1{2,}\s*$")
_RST_ROLE = re.compile(r":[A-Za-z][\w:+.-]*:`([^`]*)`")
_RST_LINK = re.compile(r"`([^`<]+?)\s*<[^>]*>`__?")
_RST_INLINE = re.compile(r"(``|\*\*|\*|`)(?=\S)(.+?)(?<=\S)\1_{0,2}")
_RST_LABEL = re.compile(r"^\.\.\s+(_[^:]*:|\|[^|]+\|)")
_RST_DIRECTIVE = re.compile(r"^\.\.\s+([\w:-]+)::\s*(.*)$")


def _rst_inline(line: str) -> str:
    line = _RST_ROLE.sub(r"\1", line)
    line = _RST_LINK.sub(r"\1", line)
    return _RST_INLINE.sub(r"\2", line)


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


class _HTMLText(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections = _Sections()
        self.doc_title = ""
        self.skip = 0
        self.in_title = False
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

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag == "title":
            self.in_title = True
        if tag in _SKIP_TAGS:
            self.skip += 1
        elif tag in _HEADINGS:
            self.flush()
            self.heading = []
        elif tag in _BLOCK_TAGS:
            self.flush()
            if tag == "pre":
                self.pre += 1

    def handle_startendtag(self, tag: str, attrs) -> None:
        if tag in _BLOCK_TAGS:
            self.flush()

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False
        if tag in _SKIP_TAGS:
            self.skip = max(0, self.skip - 1)
        elif tag in _HEADINGS and self.heading is not None:
            self.sections.start("".join(self.heading), top=tag in ("h1", "h2") or not self.sections.title)
            self.heading = None
        elif tag in _BLOCK_TAGS:
            self.flush()
            if tag == "pre":
                self.pre = max(0, self.pre - 1)

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.doc_title += data
        if self.skip:
            return
        if self.heading is not None:
            self.heading.append(data)
        else:
            self.line.append(data)


def read_html(text: str) -> Extracted:
    """Visible text in blocks, sections at ``<h1>``-``<h6>``; the title is ``<title>``, else the first heading.

    >>> r = read_html("<html><head><title>Tar</title><style>p{}</style></head><body><h1>Tar</h1><p>Archives"
    ...               "&amp; more.</p><script>x()</script><h2>Extract</h2><p>Use <b>-C</b>.</p></body></html>")
    >>> r.title, r.sections
    ('Tar', ['Tar\\n\\nArchives& more.', 'Extract\\n\\nUse -C.'])
    """
    p = _HTMLText()
    try:
        p.feed(text)
        p.close()
    except AssertionError as e:  # html.parser's own malformed-markup asserts
        raise Unreadable(f"malformed HTML: {e}") from None
    p.flush()
    out = p.sections.result()
    title = " ".join(p.doc_title.split())
    return Extracted(title or out.title, out.sections)


# ---------------------------------------------------------------------- plain text and PDF

def read_text(text: str) -> Extracted:
    """Plain text: one section; paragraphs (blank lines) are kept for the chunker. The title is the file name's."""
    cleaned = _clean(text)
    return Extracted("", [cleaned] if cleaned else [])


def read_pdf(path: Path) -> Extracted:
    """A PDF's text layer, a section per page; encrypted (password) and corrupt files are :class:`Unreadable`."""
    try:
        import pypdf
        from pypdf.errors import PdfReadError
    except ImportError:  # pragma: no cover - a declared dependency
        raise Unreadable("reading PDF needs pypdf (pip install pypdf)") from None
    import logging

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings about odd-but-readable files are noise here
    try:
        reader = pypdf.PdfReader(str(path), strict=False)
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")
            except Exception as e:  # noqa: BLE001 - pypdf raises several types for ciphers it cannot do
                raise Unreadable(f"encrypted PDF that could not be opened ({e})") from None
            if not opened:
                raise Unreadable("password-protected PDF")
        pages = [_clean(page.extract_text() or "") for page in reader.pages]
        meta = reader.metadata
        title = str(meta.title).strip() if meta is not None and meta.title else ""
    except Unreadable:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError, OSError) as e:
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


def has_reader(path: Path) -> bool:
    """Whether a reader handles this file (by its suffix, or its conventional name).

    >>> has_reader(Path("a/Guide.MD")), has_reader(Path("README")), has_reader(Path("logo.png"))
    (True, True, False)
    """
    suffix = path.suffix.lower()
    return suffix in SUPPORTED or (not suffix and path.name.upper() in TEXT_NAMES)


def read_file(path: Path, data: bytes | None = None) -> Extracted:
    """The text of one file by its suffix; :class:`Unreadable` (the reason) when it cannot be had."""
    suffix = path.suffix.lower()
    if suffix in PDF_SUFFIXES:
        if data is not None and not data.lstrip()[:5].startswith(b"%PDF"):
            raise Unreadable("corrupt PDF: no %PDF header")
        return read_pdf(path)
    reader = TEXT_READERS.get(suffix) or (read_text if has_reader(path) else None)
    if reader is None:
        raise Unreadable(f"no reader for {suffix or 'files without a suffix'!r}")
    if data is None:
        data = path.read_bytes()
    text, encoding = decode(data)
    out = reader(text)
    return Extracted(out.title, out.sections, encoding)
