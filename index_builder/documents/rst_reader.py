"""reStructuredText files by line rules: every pattern is anchored at a line's start, and inline markup is removed
by single passes that never rescan from each position (linear time in the input)."""

from __future__ import annotations

import re

from index_builder.documents.sections import Extracted, Sections

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
    s = Sections()
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
