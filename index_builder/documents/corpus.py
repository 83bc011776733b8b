"""Corpus readers: BEIR ``corpus.jsonl(.gz)`` and plain JSONL, validated line by line.

A line is ``{"_id": str, "title": str?, "text": str, "tenant": str?, "metadata": {str: scalar}?}`` (``id`` is
accepted for ``_id``). Errors name the file and the 1-based line; with ``skip_bad=True`` bad lines are counted
and skipped instead.

Lone surrogates (JSON's ``"\\udce9"`` escape, or a Python ``str`` built from undecodable bytes) are not Unicode
characters and cannot be encoded as UTF-8, so SQLite, protobuf and every JSON answer would fail on them later.
What names something (the id, the tenant, metadata keys and values: filters match them exactly) is refused with an
error naming it, since replacing would make two different names equal; what is only read (the title, the text)
has each one replaced with U+FFFD, as a decoder does with a bad byte (a text cut inside a surrogate pair should
not cost its document).
"""

from __future__ import annotations

import gzip
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from index_builder.errors import CorpusError
from index_builder.types import Document

log = logging.getLogger(__name__)

MAX_ID_CHARS = 256
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 1_000
# Tenants and metadata keys are identifiers: ASCII letters, digits and a few separators, so no NUL, control
# character or Unicode look-alike ("tenаnt" with a Cyrillic a) can pass for another name. Values are free text
# without control characters (tab and newline allowed).
_TENANT_RE = re.compile(r"^[A-Za-z0-9_.\-]{0,64}$")
_KEY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,63}$")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def lone_surrogate(s: str) -> int:
    """The position of the first lone surrogate in ``s`` (a character UTF-8 cannot encode), or -1."""
    if s.isascii():
        return -1
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return -1


def without_surrogates(s: str) -> str:
    """``s`` with each lone surrogate replaced by U+FFFD (the same length, so character offsets hold).

    >>> without_surrogates("caf\\udce9 ok")
    'caf\ufffd ok'
    """
    return s if lone_surrogate(s) < 0 else _SURROGATE_RE.sub("\ufffd", s)


def check_encodable(what: str, s: str) -> str:
    """``s`` when UTF-8 can encode it; ValueError naming ``what``, the character and its position otherwise."""
    at = lone_surrogate(s)
    if at >= 0:
        raise ValueError(f"{what} {s!r:.80} holds a lone surrogate (U+{ord(s[at]):04X}) at character {at}: "
                         "not a Unicode character, it cannot be encoded as UTF-8")
    return s


def check_tenant(tenant: str) -> str:
    """A tenant name: up to 64 ASCII letters, digits, '_', '.', '-' ("" = none); ValueError naming it otherwise."""
    if not isinstance(tenant, str) or not _TENANT_RE.match(tenant):
        raise ValueError(f"'tenant' must be up to 64 letters, digits, '_', '.', '-', got {tenant!r:.80}")
    return tenant


def check_metadata_key(key: str) -> str:
    r"""A metadata key: 1-64 ASCII letters, digits, '_', '.', ':', '-', not starting with a separator.

    >>> check_metadata_key("topic")
    'topic'
    >>> check_metadata_key("\x00tenant")
    Traceback (most recent call last):
    ...
    ValueError: metadata key '\x00tenant' must be 1-64 ASCII letters, digits, '_', '.', ':', '-' (not starting with '.', ':', '-')
    """
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError(f"metadata key {key!r:.80} must be 1-{MAX_METADATA_KEY_CHARS} ASCII letters, digits, "
                         "'_', '.', ':', '-' (not starting with '.', ':', '-')")
    return key


def check_metadata_value(key: str, value: str) -> str:
    """A metadata value: at most 1,000 characters, no control characters but tab and newline."""
    if len(value) > MAX_METADATA_VALUE_CHARS:
        raise ValueError(f"metadata {key!r} has a value of {len(value)} characters; at most "
                         f"{MAX_METADATA_VALUE_CHARS} are allowed")
    if _CONTROL_RE.search(value):
        raise ValueError(f"metadata {key!r} has a control character in its value")
    return check_encodable(f"metadata {key!r}: the value", value)


@dataclass
class CorpusReport:
    """What reading a corpus found."""

    path: str
    documents: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)  # the first few skipped lines' messages


def resolve_corpus_path(path: str | Path) -> Path:
    """A corpus file, or a BEIR dataset folder holding ``corpus.jsonl`` or ``corpus.jsonl.gz``."""
    p = Path(path)
    if p.is_dir():
        for name in ("corpus.jsonl", "corpus.jsonl.gz"):
            if (p / name).is_file():
                return p / name
        raise CorpusError("folder has no corpus.jsonl or corpus.jsonl.gz", path=str(p))
    if not p.is_file():
        raise CorpusError("no such corpus file", path=str(p))
    return p


def _open_text(p: Path) -> IO[str]:
    if p.suffix == ".gz":
        return gzip.open(p, "rt", encoding="utf-8")
    return open(p, encoding="utf-8")


def metadata_value(key: str, value: Any) -> str:
    """Metadata values are stored as strings; numbers and booleans are converted, anything else is refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise ValueError(f"metadata value for key {key!r} must be a string, number or boolean, got {type(value).__name__}")


def parse_document(obj: Any) -> Document:
    """Validate one decoded JSON object and turn it into a :class:`Document` (raises ValueError saying what is wrong)."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    doc_id = obj.get("_id", obj.get("id"))
    if doc_id is None:
        raise ValueError("missing '_id'")
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    if not isinstance(doc_id, str) or not doc_id.strip():
        raise ValueError(f"'_id' must be a non-empty string, got {doc_id!r}")
    if len(doc_id) > MAX_ID_CHARS:
        raise ValueError(f"'_id' is {len(doc_id)} characters; at most {MAX_ID_CHARS} are allowed")
    check_encodable("'_id'", doc_id)
    title = obj.get("title") or ""
    text = obj.get("text")
    if not isinstance(title, str):
        raise ValueError(f"document {doc_id!r}: 'title' must be a string")
    if not isinstance(text, str):
        raise ValueError(f"document {doc_id!r}: 'text' must be a string, got {type(text).__name__}")
    if not text.strip():
        raise ValueError(f"document {doc_id!r}: 'text' is empty")
    tenant = obj.get("tenant") or ""
    raw_meta = obj.get("metadata") or {}
    if not isinstance(raw_meta, dict):
        raise ValueError(f"document {doc_id!r}: 'metadata' must be an object")
    try:
        check_tenant(tenant)
        metadata = {check_metadata_key(str(k)): check_metadata_value(str(k), metadata_value(str(k), v))
                    for k, v in raw_meta.items()}
    except ValueError as e:
        raise ValueError(f"document {doc_id!r}: {e}") from None
    return Document(id=doc_id, text=without_surrogates(text), title=without_surrogates(title), tenant=tenant,
                    metadata=metadata)


def iter_corpus(path: str | Path, *, skip_bad: bool = False, report: CorpusReport | None = None) -> Iterator[Document]:
    """Yield documents in file order; duplicate ids, malformed JSON and empty text raise :class:`CorpusError`."""
    p = resolve_corpus_path(path)
    report = report if report is not None else CorpusReport(path=str(p))
    seen: set[str] = set()
    with _open_text(p) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"malformed JSON ({e.msg} at column {e.colno})") from None
                doc = parse_document(obj)
                if doc.id in seen:
                    raise ValueError(f"duplicate document id {doc.id!r}")
            except ValueError as e:
                if not skip_bad:
                    raise CorpusError(str(e), path=str(p), line=lineno) from None
                report.skipped += 1
                if len(report.errors) < 10:
                    report.errors.append(f"{p}:{lineno}: {e}")
                continue
            seen.add(doc.id)
            report.documents += 1
            yield doc


def read_corpus(path: str | Path, *, skip_bad: bool = False) -> tuple[list[Document], CorpusReport]:
    """Read a whole corpus; returns the documents and a report of skipped lines."""
    report = CorpusReport(path=str(resolve_corpus_path(path)))
    docs = list(iter_corpus(path, skip_bad=skip_bad, report=report))
    if report.skipped:
        log.warning("skipped %d bad line(s) in %s; first: %s", report.skipped, report.path, report.errors[0])
    if not docs:
        raise CorpusError("corpus has no valid documents", path=report.path)
    return docs, report
