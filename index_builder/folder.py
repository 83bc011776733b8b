"""A folder of files as documents: walk, filter, read, and describe each file; plan what a re-run changes.

Each readable file (:mod:`index_builder.readers`) becomes one :class:`Document`:
- ``id``: its path relative to the folder, with ``/`` separators (``guide/install.md``);
- ``title``: its first heading (a PDF's own title), else the file name without suffix;
- ``text``: its sections joined by ``SECTION_BREAK``, so no chunk straddles two sections;
- ``metadata``: ``path`` (the id), ``ext``, ``collection`` (the first folder, "" at the top), ``modified`` (UTC, ISO
  8601), ``bytes``, ``content_hash`` (SHA-256 of the bytes and the reader version: what a re-run compares) and
  ``source`` (the folder's name, or ``--source``: what a re-run may delete from);
- ``tenant``: one for all, the first folder, or the first matching pattern of a mapping.

Files that cannot be read are skipped with a reason each (:class:`Skipped`) and counted, never aborting a run
unless ``strict``. Hidden files and folders (a leading ``.``) are not read; symbolic links are followed, each folder
once, so a link loop ends. Files of types no reader handles are counted, not listed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import stat
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from index_builder.corpus import MAX_ID_CHARS, check_metadata_value, check_tenant
from index_builder.errors import CorpusError
from index_builder.readers import READER_VERSION, SECTION_BREAK, Unreadable, has_reader, read_file
from index_builder.types import Document

MAX_TEXT_CHARS = 1_000_000  # the document store's limit (retrieval.live.store): a file over it is skipped
DEFAULT_MAX_FILE_MB = 64.0


@dataclass(frozen=True)
class FolderOptions:
    """How a folder becomes documents. ``include`` / ``exclude``: glob patterns over the path relative to the folder
    (``*.md``, ``drafts/*``; a pattern without ``/`` also matches the file name alone); ``tenant``: every
    document's; ``tenant_from_folder``: the first folder names the tenant; ``tenant_map``: pattern -> tenant, the
    first match wins (files matching none get ``tenant``)."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    tenant: str = ""
    tenant_from_folder: bool = False
    tenant_map: tuple[tuple[str, str], ...] = ()
    max_file_mb: float = DEFAULT_MAX_FILE_MB
    source: str = ""  # "" = the folder's own name
    strict: bool = False

    def __post_init__(self) -> None:
        if self.max_file_mb <= 0:
            raise ValueError(f"max_file_mb must be > 0, got {self.max_file_mb}")
        check_tenant(self.tenant)
        for pattern, tenant in self.tenant_map:
            try:
                check_tenant(tenant)
            except ValueError as e:
                raise ValueError(f"tenant map entry {pattern!r}: {e}") from None


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str

    def line(self) -> str:
        return f"skipped {self.path}: {self.reason}"


@dataclass
class FolderReport:
    """What reading a folder found: documents, skipped files (each with its reason), other types counted."""

    root: str
    documents: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    other_types: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        other = sum(self.other_types.values())
        kinds = ", ".join(f"{k} {v}" for k, v in self.other_types.most_common(5))
        return (f"{self.documents} files read, {len(self.skipped)} skipped"
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


def walk(root: Path, report: FolderReport | None = None) -> Iterator[tuple[str, Path]]:
    """(relative posix path, path) of every non-hidden file under ``root``, sorted, symbolic links followed once."""
    seen: dict[tuple[int, int], str] = {}
    ancestors: list[tuple[int, int]] = []

    def visit(folder: Path, rel: str) -> Iterator[tuple[str, Path]]:
        try:
            st = folder.stat()
        except OSError as e:
            if report is not None:
                report.skipped.append(Skipped(rel or ".", f"folder cannot be read: {e.strerror}"))
            return
        key = (st.st_dev, st.st_ino)
        if key in seen:
            if report is not None:
                reason = ("symbolic link loop (it links to a folder above it)" if key in ancestors else
                          f"links to a folder already read ({seen[key] or '.'})")
                report.skipped.append(Skipped(rel, reason))
            return
        seen[key] = rel
        ancestors.append(key)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            if report is not None:
                report.skipped.append(Skipped(rel or ".", f"folder cannot be listed: {e.strerror}"))
            ancestors.pop()
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            child = f"{rel}/{entry.name}" if rel else entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
                is_file = entry.is_file(follow_symlinks=True)
            except OSError:
                is_dir = is_file = False
            if is_dir:
                yield from visit(Path(entry.path), child)
            elif is_file:
                yield child, Path(entry.path)
            elif entry.is_symlink() and report is not None:
                report.skipped.append(Skipped(child, "broken symbolic link"))
        ancestors.pop()

    yield from visit(root, "")


def content_hash(data: bytes) -> str:
    return hashlib.sha256(READER_VERSION.encode() + b"\0" + data).hexdigest()[:32]


def _tenant(rel: str, collection: str, options: FolderOptions) -> str:
    for pattern, tenant in options.tenant_map:
        if _matches(rel, pattern):
            return tenant
    if options.tenant_from_folder and collection:
        return collection
    return options.tenant


def read_one(root: Path, rel: str, path: Path, options: FolderOptions, source: str) -> Document:
    """One file as a document, or :class:`Unreadable` with the reason."""
    if len(rel) > MAX_ID_CHARS:
        raise Unreadable(f"its path is {len(rel)} characters; ids are at most {MAX_ID_CHARS}")
    try:
        check_metadata_value("path", rel)
    except ValueError:
        raise Unreadable("its path holds a control character") from None
    try:
        st = path.stat()
    except OSError as e:
        raise Unreadable(f"cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise Unreadable("not a regular file")
    limit = int(options.max_file_mb * 2**20)
    if st.st_size > limit:
        raise Unreadable(f"{st.st_size / 2**20:,.0f} MiB is over the {options.max_file_mb:g} MiB limit "
                         "(--max-file-mb)")
    if st.st_size == 0:
        raise Unreadable("empty file")
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise Unreadable(f"cannot be read: {e.strerror}") from None
    extracted = read_file(path, data)
    sections = [s for s in extracted.sections if s.strip()]
    text = SECTION_BREAK.join(sections)
    if not text.strip():
        raise Unreadable("no text in it")
    if len(text) > MAX_TEXT_CHARS:
        raise Unreadable(f"{len(text):,} characters of text; a document holds at most {MAX_TEXT_CHARS:,}")
    parts = rel.split("/")
    collection = parts[0] if len(parts) > 1 else ""
    tenant = _tenant(rel, collection, options)
    try:
        check_tenant(tenant)
    except ValueError:
        raise Unreadable(f"its tenant {tenant!r} (from the folder name) is not a valid tenant name") from None
    title = extracted.title or PurePosixPath(rel).stem.replace("_", " ").replace("-", " ")
    metadata = {"path": rel, "ext": path.suffix.lower().lstrip("."), "collection": collection,
                "modified": datetime.fromtimestamp(int(st.st_mtime), UTC).isoformat().replace("+00:00", "Z"),
                "bytes": str(st.st_size), "content_hash": content_hash(data), "source": source}
    if extracted.encoding and extracted.encoding != "utf-8":
        metadata["encoding"] = extracted.encoding
    return Document(id=rel, text=text, title=title[:2000], tenant=tenant, metadata=metadata)


def is_folder_corpus(path: str | Path) -> bool:
    """A folder of files (not a BEIR dataset folder, which holds ``corpus.jsonl``)."""
    p = Path(path)
    return p.is_dir() and not any((p / n).is_file() for n in ("corpus.jsonl", "corpus.jsonl.gz"))


def source_name(root: Path, options: FolderOptions) -> str:
    name = options.source or root.resolve().name or "files"
    check_metadata_value("source", name)
    return name


def candidates(root: Path, options: FolderOptions, report: FolderReport | None = None) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of the files the folder reader tries: walked, included, not excluded, of a type a
    reader takes (the others counted in ``report``)."""
    for rel, path in walk(root, report):
        if options.include and not any(_matches(rel, p) for p in options.include):
            continue
        if any(_matches(rel, p) for p in options.exclude):
            continue
        if not has_reader(path):
            if report is not None:
                report.other_types[path.suffix.lower() or "(none)"] += 1
            continue
        yield rel, path


def iter_folder(root: str | Path, options: FolderOptions | None = None, report: FolderReport | None = None,
                cache: dict[str, tuple[int, int, Document]] | None = None) -> Iterator[Document]:
    """The folder's documents in path order; skipped files are added to ``report`` (CorpusError when strict).

    ``cache``: rel path -> (mtime ns, size, document) from a previous pass (``--watch``): a file whose modified
    time and size are unchanged is not read again; the pass refreshes the cache."""
    options = options if options is not None else FolderOptions()
    root = Path(root)
    if not root.is_dir():
        raise CorpusError("not a folder", path=str(root))
    report = report if report is not None else FolderReport(root=str(root))
    source = source_name(root, options)
    before = len(report.skipped)

    def strict_check() -> None:  # a skip the walk recorded (a link loop, an unreadable folder) fails a strict run
        if options.strict and len(report.skipped) > before:
            s = report.skipped[-1]
            raise CorpusError(f"{s.reason} (--strict)", path=str(root / s.path))

    for rel, path in candidates(root, options, report):
        strict_check()
        try:
            st = path.stat()
            hit = cache.get(rel) if cache is not None else None
            if hit is not None and hit[:2] == (st.st_mtime_ns, st.st_size):
                doc = hit[2]
            else:
                doc = read_one(root, rel, path, options, source)
                if cache is not None:
                    cache[rel] = (st.st_mtime_ns, st.st_size, doc)
        except (OSError, Unreadable) as e:
            reason = f"cannot be read: {e.strerror}" if isinstance(e, OSError) else str(e)
            if options.strict:
                raise CorpusError(f"{reason} (--strict)", path=str(path)) from None
            report.skipped.append(Skipped(rel, reason))
            continue
        report.documents += 1
        yield doc
    strict_check()


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
    wrote before, and nothing else: whatever is in it may be deleted): new ids are added, another hash or tenant is updated, an id no longer in the folder
    is deleted.

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
