"""File readers: the text of a markdown, reStructuredText, HTML, plain-text or PDF file, as a title and sections.

This module picks the reader by a file's suffix (or conventional name) and decodes its bytes; each format family has
its own module (:mod:`~index_builder.documents.markdown_reader`, :mod:`~index_builder.documents.rst_reader`,
:mod:`~index_builder.documents.html_reader`, :mod:`~index_builder.documents.pdf_reader`; plain text here) over the
shared words in :mod:`~index_builder.documents.sections` and :mod:`~index_builder.documents.decoding`. The names
callers use (the readers, :class:`Extracted`, :class:`Unreadable`, :func:`decode`, the limits) are importable from
here.

A reader returns :class:`Extracted`: the title (the first heading; "" when the file has none, and the folder reader
falls back to the file name) and the sections in order, each starting with its heading line. The folder reader
joins the sections with a form feed (``SECTION_BREAK``), and the chunker never lets a chunk straddle one.

Every reader runs in time linear in its input, because a folder holds files nobody checked (a line of 50,000 ``[``
took 17 s with the former regex rules, and a 1 MB line hours): markdown by markdown-it-py's token stream walked
once; reStructuredText by anchored line rules and single-pass inline markup; HTML by lxml (libxml2); PDF by pypdf,
its text counted page by page against the document limit. What bounds the rest (a 64 MiB file read in linear time
can still be slow) is the folder reader's per-file time and memory budget
(:mod:`index_builder.documents.reader_pool`). Encodings: UTF-8 (with or without BOM) and UTF-16/32 with a BOM are
decoded directly; anything else is detected by ``charset-normalizer`` and refused, with the file named, when it
cannot be recognised.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from index_builder.documents.decoding import decode
from index_builder.documents.html_reader import read_html
from index_builder.documents.markdown_reader import read_markdown
from index_builder.documents.pdf_reader import read_pdf
from index_builder.documents.rst_reader import read_rst
from index_builder.documents.sections import MAX_TEXT_CHARS, Extracted, Unreadable, clean_text

__all__ = ["MAX_TEXT_CHARS", "PDF_SUFFIXES", "READER_VERSION", "SECTION_BREAK", "SUPPORTED", "TEXT_NAMES",
           "TEXT_READERS", "Extracted", "Unreadable", "decode", "has_reader", "read_file", "read_html",
           "read_markdown", "read_pdf", "read_rst", "read_text"]

SECTION_BREAK = "\f"  # between two sections of a document read from a file (pdftotext's page break)
READER_VERSION = "2"  # part of every file's content hash: a reader change re-reads every file (2: markdown-it-py, lxml)


def read_text(text: str) -> Extracted:
    """Plain text: one section; paragraphs (blank lines) are kept for the chunker. The title is the file name's."""
    cleaned = clean_text(text)
    return Extracted("", [cleaned] if cleaned else [])


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
