"""A folder of files as documents: walk, filter, read, and describe each file; plan what a re-run changes.

Each readable file (:mod:`index_builder.documents.readers`) becomes one :class:`Document`:
- ``id``: its path relative to the folder, with ``/`` separators (``guide/install.md``);
- ``title``: its first heading (a PDF's own title), else the file name without suffix;
- ``text``: its sections joined by ``SECTION_BREAK``, so no chunk straddles two sections;
- ``metadata``: ``path`` (the id), ``ext``, ``collection`` (the first folder, "" at the top), ``modified`` (UTC, ISO
  8601), ``bytes``, ``content_hash`` (SHA-256 of the bytes and the reader version: what a re-run compares) and
  ``source`` (the folder's name, or ``--source``: what a re-run may delete from);
- ``tenant``: one for all, the first folder, or the first matching pattern of a mapping.

Files that cannot be read are skipped with a reason each (:class:`Skipped`) and counted, never aborting a run
unless ``strict``. Hidden files and folders (a leading ``.``) are not read; files of types no reader handles are
counted, not listed.

A folder's files are the files under it. A symbolic link (to a file or a folder) whose target resolves outside the
folder is skipped with its reason and counted in the summary (``links out``): a ``git clone`` can carry
``docs/users.txt -> /etc/passwd``, and what is indexed is served to every caller the index serves.
``follow_links_outside`` (``--follow-links-outside``) reads such targets for an operator who wants it. Links inside
the folder are followed, each folder once, so a link loop ends. The check is made again when the file is opened
(:func:`index_builder.documents.reader_pool.read_checked`), so a folder swapped for a link after the walk is not read either.
A hard link is the file itself and is read (a hard link cannot cross file systems, and Linux's
``protected_hardlinks`` refuses one to a file its creator does not own).

Names: an id is valid UTF-8 by construction.
- A name that is not UTF-8 (a Latin-1 ``caf\\xe9.md``) keeps its undecodable bytes as ``%XX`` (``caf%E9.md``):
  reversible (each ``%XX`` of a byte 80-FF stands for that byte; a UTF-8 name is never changed), and a name
  whose escaped form is another file's name in the same folder is skipped with the reason.
- A name holding a control character (C0, DEL, C1: newline and tab included) or a bidirectional override, isolate
  or mark (U+202A-202E, U+2066-2069, U+200E, U+200F, U+061C; and U+2028/2029, line breaks) is skipped with the
  reason: such a name displays as another one. Skip lines and errors print names with these characters escaped
  (:func:`printable`), so nothing in a name reaches a terminal raw.

Every file is read in a reader process with a time and memory budget (:mod:`index_builder.documents.reader_pool`): one
pathological file is skipped with its reason and never stalls or ends the run.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from index_builder.documents.corpus import MAX_ID_CHARS, check_metadata_value, check_tenant
from index_builder.documents.reader_pool import (
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WORKERS,
    Job,
    ReaderPool,
    inside,
    read_request,
)
from index_builder.documents.reader_pool import content_hash as content_hash  # re-exported: the hash a re-run compares
from index_builder.documents.readers import MAX_TEXT_CHARS as MAX_TEXT_CHARS  # re-exported: the document store's limit
from index_builder.documents.readers import has_reader
from index_builder.errors import CorpusError
from index_builder.types import Document

DEFAULT_MAX_FILE_MB = 64.0


@dataclass(frozen=True)
class FolderOptions:
    """How a folder becomes documents. ``include`` / ``exclude``: glob patterns over the path relative to the folder
    (``*.md``, ``drafts/*``; a pattern without ``/`` also matches the file name alone); ``tenant``: every
    document's; ``tenant_from_folder``: the first folder names the tenant; ``tenant_map``: pattern -> tenant, the
    first match wins (files matching none get ``tenant``). ``follow_links_outside``: read links whose target is
    outside the folder (off: they are skipped). ``read_timeout_s`` / ``read_memory_mb``: each file's budget in its
    reader process (``read_memory_mb`` 0: no memory limit); ``read_workers``: reader processes in parallel."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    tenant: str = ""
    tenant_from_folder: bool = False
    tenant_map: tuple[tuple[str, str], ...] = ()
    max_file_mb: float = DEFAULT_MAX_FILE_MB
    source: str = ""  # "" = the folder's own name
    strict: bool = False
    follow_links_outside: bool = False
    read_timeout_s: float = DEFAULT_TIMEOUT_S
    read_memory_mb: int = DEFAULT_MEMORY_MB
    read_workers: int = DEFAULT_WORKERS

    def __post_init__(self) -> None:
        if self.max_file_mb <= 0:
            raise ValueError(f"max_file_mb must be > 0, got {self.max_file_mb}")
        if self.read_timeout_s <= 0:
            raise ValueError(f"read_timeout_s must be > 0, got {self.read_timeout_s}")
        if self.read_memory_mb and self.read_memory_mb < 256:
            raise ValueError(f"read_memory_mb must be >= 256 (0 = no limit), got {self.read_memory_mb}")
        if not 1 <= self.read_workers <= 64:
            raise ValueError(f"read_workers must be in [1, 64], got {self.read_workers}")
        check_tenant(self.tenant)
        for pattern, tenant in self.tenant_map:
            try:
                check_tenant(tenant)
            except ValueError as e:
                raise ValueError(f"tenant map entry {pattern!r}: {e}") from None


# C0, DEL, C1, the bidirectional marks, embeddings, overrides and isolates, and the Unicode line separators
_UNSAFE = "\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE_NAME = re.compile(f"[{_UNSAFE}]")
_UNPRINTABLE = re.compile(f"[{_UNSAFE}\ud800-\udfff]")
_UNDECODABLE = re.compile("[\udc80-\udcff]")  # os.fsdecode's stand-ins for the bytes of a name that is not UTF-8
_SURROGATE = re.compile("[\ud800-\udfff]")


def printable(text: str) -> str:
    r"""``text`` with control, bidirectional and surrogate characters escaped as ``repr`` would (``\x1b``,
    ``\u202e``): what a skip line or an error prints of a name.

    >>> printable("evil\u202etxt.md\n\x1b[2J") == r"evil\u202etxt.md\n\x1b[2J"
    True
    """
    def esc(m: re.Match) -> str:
        c = m.group()
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100
                                                                  else f"\\u{ord(c):04x}")

    return _UNPRINTABLE.sub(esc, text)


def id_name(name: str) -> str:
    r"""The id part of a file or folder name: undecodable bytes as ``%XX``; ValueError (the reason) for a name that
    must not become an id.

    >>> id_name("caf\udce9.md"), id_name("café.md")
    ('caf%E9.md', 'café.md')
    >>> id_name("notes\u202etxt.md")
    Traceback (most recent call last):
    ...
    ValueError: its name holds a control or bidirectional-override character (U+202E)
    """
    if m := _UNSAFE_NAME.search(name):
        raise ValueError(f"its name holds a control or bidirectional-override character (U+{ord(m.group()):04X})")
    escaped = _UNDECODABLE.sub(lambda m: f"%{ord(m.group()) - 0xDC00:02X}", name)
    if _SURROGATE.search(escaped):  # not from os.fsdecode (a Windows name with a lone UTF-16 half)
        raise ValueError("its name is not valid Unicode")
    return escaped


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str

    def line(self) -> str:
        return f"skipped {printable(self.path)}: {printable(self.reason)}"


@dataclass
class FolderReport:
    """What reading a folder found: documents, skipped files (each with its reason), other types counted, links
    out of the folder not followed (also among the skipped)."""

    root: str
    documents: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    other_types: Counter = field(default_factory=Counter)
    links_outside: int = 0

    def summary(self) -> str:
        other = sum(self.other_types.values())
        kinds = ", ".join(f"{k} {v}" for k, v in self.other_types.most_common(5))
        return (f"{self.documents} files read, {len(self.skipped)} skipped"
                + (f" ({self.links_outside} links out of the folder not followed: --follow-links-outside)"
                   if self.links_outside else "")
                + (f", {other} of other types not read ({kinds})" if other else ""))


def load_tenant_map(path: str | Path) -> tuple[tuple[str, str], ...]:
    """A mapping file: JSON or TOML, ``{"pattern": "tenant", ...}`` in order (a TOML file may nest it under
    ``[tenants]``)."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
        if p.suffix.lower() == ".toml":
            import tomllib

            obj = tomllib.loads(raw)
            obj = obj.get("tenants", obj)
        else:
            obj = json.loads(raw)
    except (OSError, ValueError) as e:
        raise CorpusError(f"cannot read the tenant map: {e}", path=str(p)) from None
    if not isinstance(obj, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items()):
        raise CorpusError("the tenant map must be an object of pattern -> tenant strings", path=str(p))
    return tuple(obj.items())


def _matches(rel: str, pattern: str) -> bool:
    """``pattern`` matches the relative path, or (without a ``/``) the file name; ``dir/`` matches everything under.

    >>> _matches("guide/install.md", "*.md"), _matches("guide/install.md", "guide/"), _matches("a/b.md", "b/*")
    (True, True, False)
    """
    if pattern.endswith("/"):
        return rel.startswith(pattern) or fnmatch.fnmatchcase(rel, pattern + "*")
    if "/" not in pattern:
        return fnmatch.fnmatchcase(PurePosixPath(rel).name, pattern) or fnmatch.fnmatchcase(rel, pattern)
    return fnmatch.fnmatchcase(rel, pattern)


def _ids(entries: list[os.DirEntry], rel: str, skip) -> list[tuple[os.DirEntry, str]]:
    """(entry, id name) of a folder's non-hidden entries; a name that cannot be an id is skipped with its reason,
    as is an escaped name equal to another entry's (two files never share an id)."""
    named: list[tuple[os.DirEntry, str]] = []
    taken = {e.name for e in entries if not _UNDECODABLE.search(e.name)}
    escaped: set[str] = set()
    for entry in entries:
        if entry.name.startswith("."):
            continue
        raw = f"{rel}/{entry.name}" if rel else entry.name
        try:
            name = id_name(entry.name)
        except ValueError as e:
            skip(raw, str(e))
            continue
        if name != entry.name:
            if name in taken or name in escaped:
                skip(raw, f"its name is not UTF-8, and its escaped form {name!r} is another file's name")
                continue
            escaped.add(name)
        named.append((entry, name))
    return named


def walk(root: Path, report: FolderReport | None = None,
         follow_links_outside: bool = False) -> Iterator[tuple[str, Path]]:
    """(id, resolved path) of every non-hidden file under ``root``, sorted; links inside the folder followed, each
    folder once; a link out of the folder skipped (unless ``follow_links_outside``)."""
    root_real = os.path.realpath(root)
    seen: dict[tuple[int, int], str] = {}
    ancestors: list[tuple[int, int]] = []

    def skip(rel: str, reason: str) -> None:
        if report is not None:
            report.skipped.append(Skipped(rel, reason))

    def visit(folder: str, rel: str) -> Iterator[tuple[str, Path]]:
        try:
            st = os.stat(folder)
        except OSError as e:
            skip(rel or ".", f"folder cannot be read: {e.strerror}")
            return
        key = (st.st_dev, st.st_ino)
        if key in seen:
            skip(rel, "symbolic link loop (it links to a folder above it)" if key in ancestors else
                 f"links to a folder already read ({seen[key] or '.'})")
            return
        seen[key] = rel
        ancestors.append(key)
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            skip(rel or ".", f"folder cannot be listed: {e.strerror}")
            ancestors.pop()
            return
        for entry, name in _ids(entries, rel, skip):
            child = f"{rel}/{name}" if rel else name
            real = os.path.join(folder, entry.name)
            try:
                link = entry.is_symlink()
                if link:
                    real = os.path.realpath(entry.path)
                    if not follow_links_outside and not inside(real, root_real):
                        skip(child, f"a symbolic link to {real}, outside the folder (--follow-links-outside "
                                    "reads it)")
                        if report is not None:
                            report.links_outside += 1
                        continue
                is_dir = entry.is_dir(follow_symlinks=True)
                is_file = not is_dir and entry.is_file(follow_symlinks=True)
            except OSError:
                is_dir = is_file = False
            if is_dir:
                yield from visit(real, child)
            elif is_file:
                yield child, Path(real)
            elif link and not os.path.lexists(real):
                skip(child, "broken symbolic link")
            elif os.path.lexists(real):
                skip(child, "not a regular file or folder (a FIFO, socket or device)")
        ancestors.pop()

    yield from visit(root_real, "")


def _tenant(rel: str, collection: str, options: FolderOptions) -> str:
    for pattern, tenant in options.tenant_map:
        if _matches(rel, pattern):
            return tenant
    if options.tenant_from_folder and collection:
        return collection
    return options.tenant


class _Unreadable(Exception):
    """A file skipped before it is read (its id, its tenant): the message is the reason."""


def _check(rel: str, options: FolderOptions) -> str:
    """The file's tenant, or :class:`_Unreadable` when its id or tenant cannot be used."""
    if len(rel) > MAX_ID_CHARS:
        raise _Unreadable(f"its path is {len(rel)} characters; ids are at most {MAX_ID_CHARS}")
    try:
        check_metadata_value("path", rel)
    except ValueError:
        raise _Unreadable("its path holds a control character") from None
    parts = rel.split("/")
    tenant = _tenant(rel, parts[0] if len(parts) > 1 else "", options)
    try:
        check_tenant(tenant)
    except ValueError:
        raise _Unreadable(f"its tenant {tenant!r} (from the folder name) is not a valid tenant name") from None
    return tenant


def _document(rel: str, read: dict[str, Any], tenant: str, source: str) -> Document:
    """A document from what the reader process answered."""
    parts = rel.split("/")
    stem, ext = os.path.splitext(parts[-1])
    title = read["title"] or stem.replace("_", " ").replace("-", " ")
    metadata = {"path": rel, "ext": ext.lower().lstrip("."),
                "collection": parts[0] if len(parts) > 1 else "",
                "modified": datetime.fromtimestamp(int(read["mtime"]), UTC).isoformat().replace("+00:00", "Z"),
                "bytes": str(read["size"]), "content_hash": read["hash"], "source": source}
    if read["encoding"] and read["encoding"] != "utf-8":
        metadata["encoding"] = read["encoding"]
    return Document(id=rel, text=read["text"], title=title[:2000], tenant=tenant, metadata=metadata)


def is_folder_corpus(path: str | Path) -> bool:
    """A folder of files (not a BEIR dataset folder, which holds ``corpus.jsonl``)."""
    p = Path(path)
    return p.is_dir() and not any((p / n).is_file() for n in ("corpus.jsonl", "corpus.jsonl.gz"))


def source_name(root: Path, options: FolderOptions) -> str:
    name = options.source or root.resolve().name or "files"
    check_metadata_value("source", name)
    return name


def candidates(root: Path, options: FolderOptions, report: FolderReport | None = None) -> Iterator[tuple[str, Path]]:
    """(id, resolved path) of the files the folder reader tries: walked, included, not excluded, of a type a reader
    takes by its name in the folder (the others counted in ``report``)."""
    for rel, path in walk(root, report, options.follow_links_outside):
        if options.include and not any(_matches(rel, p) for p in options.include):
            continue
        if any(_matches(rel, p) for p in options.exclude):
            continue
        name = rel.rpartition("/")[2]
        if not has_reader(name):
            if report is not None:
                report.other_types[os.path.splitext(name)[1].lower() or "(none)"] += 1
            continue
        yield rel, path


def iter_folder(root: str | Path, options: FolderOptions | None = None, report: FolderReport | None = None,
                cache: dict[str, tuple[int, int, Document]] | None = None) -> Iterator[Document]:
    """The folder's documents in path order; skipped files are added to ``report`` (CorpusError when strict).

    Files are read by reader processes (:class:`~index_builder.documents.reader_pool.ReaderPool`, started at the first file
    that needs reading, ended with the pass), each within ``options.read_timeout_s`` and ``read_memory_mb``.
    ``cache``: rel path -> (mtime ns, size, document) from a previous pass (``--watch``): a file whose modified
    time and size are unchanged is not read again; the pass refreshes the cache."""
    options = options if options is not None else FolderOptions()
    root = Path(root)
    if not root.is_dir():
        raise CorpusError("not a folder", path=printable(str(root)))
    report = report if report is not None else FolderReport(root=str(root))
    source = source_name(root, options)
    root_real = None if options.follow_links_outside else os.path.realpath(root)
    max_bytes = int(options.max_file_mb * 2**20)
    walked = FolderReport(root=str(root))  # the walk's skips, put in path order among the files' own

    def jobs() -> Iterator[Job]:
        done = 0
        for rel, path in candidates(root, options, walked):
            for s in walked.skipped[done:]:
                yield Job((s.path, root / s.path, ""), result={"skip": s.reason})
            done = len(walked.skipped)
            try:
                tenant = _check(rel, options)
                st = os.stat(path)
            except (OSError, _Unreadable) as e:
                reason = f"cannot be read: {e.strerror}" if isinstance(e, OSError) else str(e)
                yield Job((rel, path, ""), result={"skip": reason})
                continue
            if st.st_size > max_bytes:  # refused here too: no process round trip for a file known too big
                yield Job((rel, path, tenant), result={"skip": f"{st.st_size / 2**20:,.0f} MiB is over the "
                                                               f"{options.max_file_mb:g} MiB limit (--max-file-mb)"})
                continue
            hit = cache.get(rel) if cache is not None else None
            if hit is not None and hit[:2] == (st.st_mtime_ns, st.st_size):
                yield Job((rel, path, tenant), result={"cached": True})
                continue
            yield Job((rel, path, tenant), request=read_request(path, rel, root=root_real, max_bytes=max_bytes))
        for s in walked.skipped[done:]:
            yield Job((s.path, root / s.path, ""), result={"skip": s.reason})
        report.other_types.update(walked.other_types)
        report.links_outside += walked.links_outside

    pool = ReaderPool(options.read_workers, options.read_timeout_s, options.read_memory_mb)
    try:
        for job in pool.run(jobs()):
            rel, path, tenant = job.key
            result = job.result or {}
            if "skip" in result:
                if options.strict:
                    raise CorpusError(f"{printable(result['skip'])} (--strict)", path=printable(str(root / rel)))
                report.skipped.append(Skipped(rel, result["skip"]))
                continue
            if "cached" in result and cache is not None:
                doc = cache[rel][2]
            else:
                read = result["ok"]
                doc = _document(rel, read, tenant, source)
                if cache is not None:
                    cache[rel] = (read["mtime_ns"], read["size"], doc)
            report.documents += 1
            yield doc
    finally:
        pool.close()


# ---------------------------------------------------------------------- a re-run: what changes

@dataclass
class SyncPlan:
    """What bringing an index in step with a folder does: documents to upsert (new and changed), ids to delete
    (documents this folder's sync wrote whose file is gone: :mod:`retrieval.folders` decides which those are), and
    how many are unchanged. ``moved``: updated ids whose
    tenant changed (an id belongs to one tenant, so these are deleted before they are written again)."""

    added: list[Document] = field(default_factory=list)
    updated: list[Document] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: int = 0
    moved: list[str] = field(default_factory=list)

    def upserts(self) -> list[Document]:
        return self.added + self.updated

    def summary(self, skipped: int = 0) -> str:
        return (f"added {len(self.added)}, updated {len(self.updated)}, deleted {len(self.deleted)}, "
                f"unchanged {self.unchanged}, skipped {skipped}")


def plan_sync(docs: list[Document], existing: Mapping[str, tuple[str, str]]) -> SyncPlan:
    """Compare the folder's documents with ``existing`` (id -> (content hash, tenant) of the documents this folder
    wrote before, and nothing else: whatever is in it may be deleted): new ids are added, another hash or tenant is
    updated, an id no longer in the folder is deleted.

    >>> d = lambda i, h, t="": Document(id=i, text="t", tenant=t, metadata={"content_hash": h})
    >>> p = plan_sync([d("a", "1"), d("b", "2"), d("c", "3"), d("m", "4", "x")],
    ...               {"a": ("1", ""), "b": ("0", ""), "m": ("4", ""), "z": ("9", "")})
    >>> [x.id for x in p.added], [x.id for x in p.updated], p.deleted, p.unchanged, p.moved
    (['c'], ['b', 'm'], ['z'], 1, ['m'])
    """
    plan = SyncPlan()
    seen: set[str] = set()
    for d in docs:
        seen.add(d.id)
        old = existing.get(d.id)
        if old is None:
            plan.added.append(d)
        elif old != (d.metadata.get("content_hash"), d.tenant):
            plan.updated.append(d)
            if old[1] != d.tenant:
                plan.moved.append(d.id)
        else:
            plan.unchanged += 1
    plan.deleted = sorted(i for i in existing if i not in seen)
    return plan
