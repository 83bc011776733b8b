"""What every file reader shares: its result (a title and sections), its skip (:class:`Unreadable`), the text
cleaning and the rule that cuts a document into sections at its headings."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_TEXT_CHARS = 1_000_000  # the document store's limit (retrieval.live.store): a file with more text is skipped


class Unreadable(Exception):
    """A file that cannot be read as text; the message is the reason shown on the skip line."""


@dataclass(frozen=True)
class Extracted:
    title: str
    sections: list[str]
    encoding: str = ""


_BLANKS = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # everything but tab and newline (the form feed is ours)


def clean_text(text: str) -> str:
    """Newlines as ``\\n``, control characters as spaces, no trailing blanks, at most one blank line in a row."""
    text = _CONTROL.sub(" ", text.replace("\r\n", "\n").replace("\r", "\n"))
    lines = [ln.rstrip() for ln in text.split("\n")]
    return _BLANKS.sub("\n\n", "\n".join(lines)).strip()


class Sections:
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
        text = clean_text("\n".join(self.body))
        if text:
            self.done.append(f"{self.heading}\n\n{text}" if self.heading else text)
        elif self.heading:
            self.done.append(self.heading)
        self.heading, self.body = "", []

    def result(self, encoding: str = "") -> Extracted:
        self.close()
        return Extracted(self.title, [s for s in self.done if s.strip()], encoding)
