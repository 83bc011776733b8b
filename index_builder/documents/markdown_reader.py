"""Markdown files: markdown-it-py (CommonMark, the reference algorithm with its delimiter and bracket bounds), its
token stream walked once, so the reader runs in time linear in its input."""

from __future__ import annotations

from index_builder.documents.html_reader import html_fragment_text
from index_builder.documents.sections import Extracted, Sections

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
    s = Sections()
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
            for line in html_fragment_text(tok.content).split("\n"):
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
