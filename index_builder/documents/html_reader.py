"""HTML files by lxml (libxml2's HTML parser: HTML5 tokenization, linear time, nesting capped at 256).

selectolax was measured too and refused: its HTML5 tree builder scans the stack of open elements on every tag, 188 s
for 1 MB of nested ``<div>``; the standard library's ``html.parser`` rescans unclosed ``<!--`` / ``<a`` (1 s for
50 KB).
"""

from __future__ import annotations

from index_builder.documents.sections import Extracted, Sections

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
        self.sections = Sections()
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


def html_fragment_text(fragment: str) -> str:
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
