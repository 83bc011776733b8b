"""The document store: SQLite in WAL mode, the source of truth for every write through Upsert / Delete.

Every write gets a sequence number from one counter; a snapshot records the sequence number it covers, so start-up
replays exactly the later writes into the write buffer, and a rebuild reads the documents from here.

Durability: ``PRAGMA synchronous = FULL``. In WAL mode FULL fsyncs the WAL at every commit, so a write is
durable when ``upsert``/``delete`` return (that is when the service acknowledges it): it survives kill -9 *and*
a power cut or kernel crash. ``NORMAL`` would survive kill -9 (the committed WAL frames are in the OS page cache)
but could lose the last commits on power loss; the cost of FULL is one fsync per batch, which is why writes are
accepted in batches.

A batch is all or nothing: every document is validated before the transaction starts, and the transaction
either commits whole or not at all. A document id belongs to one tenant: upserting an id that another tenant's
document holds is refused (PermissionDenied, naming neither that tenant nor anything of its document; the
refusal itself tells the caller the id is taken: ids are one namespace, see docs/security.md).

Reads that callers page through (:meth:`DocumentStore.list_page`, ``get``, ``count``) run on their own read-only
connections, never under the writers' lock: in WAL mode a reader sees the last committed state and neither waits
for the writer nor holds it up. A listing is served by the ``(tenant, id)`` index, so a page costs a page whatever
other tenants hold, and a filtered page examines at most ``SCAN_ROWS`` rows (see :meth:`DocumentStore.list_page`).

Every document is checked by :func:`index_builder.documents.corpus.parse_document` before it is written, so the store holds
valid UTF-8 only; a row that somehow holds invalid UTF-8 (written by another tool) is still read (its bytes
decoded with ``surrogateescape``, its title and text with U+FFFD), never a crash of the read.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from index_builder.documents.corpus import lone_surrogate, parse_document, without_surrogates
from index_builder.types import Document
from retrieval.errors import DeadlineExceeded, InvalidRequest, PermissionDenied

MAX_BATCH = 1000
# Bytes of one write batch (the serialised request): checked at the edge before any work. The gRPC message
# limit (server.max_message_mb, 16 MiB) is the same size, so over gRPC this bound and that one coincide.
MAX_BATCH_BYTES = 16 * 2**20
MAX_TEXT_CHARS = 1_000_000
MAX_TITLE_CHARS = 2_000
MAX_METADATA_KEYS = 64
# Rows a filtered listing page examines at most (in the tenant's id order): a filter that matches nothing then costs
# this many rows a page, not the whole store; the page says where it stopped (``next_after``).
SCAN_ROWS = 5_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    title TEXT NOT NULL,
    text TEXT NOT NULL,
    metadata TEXT NOT NULL,
    seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY,
    op TEXT NOT NULL CHECK (op IN ('upsert', 'delete')),
    id TEXT NOT NULL,
    tenant TEXT NOT NULL
);
-- a tenant's documents in id order: a listing page seeks here instead of walking other tenants' rows (created at
-- open, so stores written before it get it on their next start)
CREATE INDEX IF NOT EXISTS documents_tenant_id ON documents (tenant, id);
"""


@dataclass(frozen=True)
class WriteResult:
    """``seq``: the batch's last sequence number (0 if it changed nothing); ``count``: documents written/deleted."""

    seq: int
    count: int


@dataclass(frozen=True)
class Change:
    """One write after a given sequence number: an upsert (with the document as it is now) or a delete."""

    seq: int
    op: str
    id: str
    tenant: str
    document: Document | None


def validate_document(obj: Document | Mapping[str, Any], position: int) -> Document:
    """A document for the store, or InvalidRequest naming it (by id when it has one, else by position)."""
    raw = ({"_id": obj.id, "title": obj.title, "text": obj.text, "tenant": obj.tenant, "metadata": obj.metadata}
           if isinstance(obj, Document) else obj)
    name = f"document {position}" + (f" ({raw.get('_id', raw.get('id'))!r})" if isinstance(raw, Mapping) else "")
    try:
        doc = parse_document(raw)
    except ValueError as e:
        raise InvalidRequest(f"{name}: {e}") from None
    if len(doc.text) > MAX_TEXT_CHARS:
        raise InvalidRequest(f"{name}: text is {len(doc.text)} characters; at most {MAX_TEXT_CHARS} are allowed")
    if len(doc.title) > MAX_TITLE_CHARS:
        raise InvalidRequest(f"{name}: title is {len(doc.title)} characters; at most {MAX_TITLE_CHARS} are allowed")
    if len(doc.metadata) > MAX_METADATA_KEYS:
        raise InvalidRequest(f"{name}: {len(doc.metadata)} metadata keys; at most {MAX_METADATA_KEYS} are allowed")
    return doc  # tenant, metadata keys and values were checked by parse_document (index_builder.documents.corpus)


def _doc_bytes(d: Document) -> int:
    def n(s: str) -> int:
        return len(s.encode("utf-8", "surrogatepass"))
    return n(d.title) + n(d.text) + sum(n(k) + n(v) for k, v in d.metadata.items())


def check_deadline(deadline: float | None, when: str) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise DeadlineExceeded(f"the write's deadline passed {when}; nothing was written")


def validate_batch(documents: Sequence[Document | Mapping[str, Any]], deadline: float | None) -> list[Document]:
    """An upsert batch checked before any work, in this order: not empty, at most ``MAX_BATCH`` documents, the
    deadline, each document, the batch's bytes, no id twice. Every writer (the live index, the engine's) calls it:
    the encoders' work grows with the text, and 1,000 documents of up to 1M characters each would be gigabytes of
    model input."""
    n = len(documents)
    if not n:
        raise InvalidRequest("an upsert needs at least one document")
    if n > MAX_BATCH:
        raise InvalidRequest(f"{n} documents in one upsert; at most {MAX_BATCH} are allowed")
    check_deadline(deadline, "before it started")
    docs: list[Document] = []
    total = 0
    seen: set[str] = set()
    for i, d in enumerate(documents):
        doc = validate_document(d, i)
        total += _doc_bytes(doc)
        if total > MAX_BATCH_BYTES:
            raise InvalidRequest(f"the batch's documents hold more than {MAX_BATCH_BYTES} bytes of title, text "
                                 f"and metadata (at document {i}); split it into smaller batches")
        if doc.id in seen:  # the store refuses it too, but only after the encoding
            raise InvalidRequest(f"document {i} ({doc.id!r}): the id appears twice in this batch")
        seen.add(doc.id)
        docs.append(doc)
    return docs


@dataclass(frozen=True)
class DocumentPage:
    """A page of a listing: ``rows`` (id, tenant, title, metadata, seq) and ``next_after``, the id to pass as
    ``after`` for the next page ("" when nothing follows). A filtered page may hold fewer rows than asked for, even
    none, while ``next_after`` is set: its scan stopped there."""

    rows: list[tuple[str, str, str, dict[str, str], int]]
    next_after: str


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _fetch(db: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    """``db.execute(sql, params).fetchall()``; a row holding invalid UTF-8 (not written by this module, which
    validates everything) is read again with its bytes kept as surrogate escapes, where sqlite3 would raise."""
    try:
        return db.execute(sql, params).fetchall()
    except sqlite3.OperationalError as e:
        if "decode" not in str(e):
            raise
    db.text_factory = _lenient_text
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.text_factory = str


def _document(doc_id: str, tenant: str, title: str, text: str, metadata: str) -> Document:
    """A stored row as a Document; the title and text are what the encoders read, so a surrogate there (a row
    that somehow holds invalid UTF-8) becomes U+FFFD."""
    return Document(id=doc_id, text=without_surrogates(text), title=without_surrogates(title), tenant=tenant,
                    metadata=json.loads(metadata))


def _row_to_document(row: sqlite3.Row | tuple) -> Document:
    doc_id, tenant, title, text, metadata = row[:5]
    return _document(doc_id, tenant, title, text, metadata)


def _cursor(after: str) -> bytes:
    """An ``after`` id as the bytes SQLite compares: an id this store read with surrogate escapes (a row holding
    invalid UTF-8) is its own bytes again, so a caller paging past such a row moves on."""
    try:
        return after.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return after.encode("utf-8", "surrogatepass")


def page_queries(tenant: str | None, filters: Mapping[str, str], after: str, limit: int, scan: int,
                 end: str | None = None) -> tuple[tuple[str, list[Any]] | None, tuple[str, list[Any]]]:
    """The SQL of one listing page with its parameters, in id order after ``after`` (``tenant``'s through the
    ``(tenant, id)`` index when given): with ``filters``, the id where a scan of ``scan`` rows ends (none when
    fewer remain), and up to ``limit`` + 1 rows up to ``end`` (that id; None: no bound) whose metadata holds every
    pair, evaluated in SQLite; without filters, the rows alone. Both walk an index range and read only the rows
    they return."""
    where: list[str] = ["id > CAST(? AS TEXT)"]
    params: list[Any] = [_cursor(after)]
    if tenant is not None:
        where.insert(0, "tenant = ?")
        params.insert(0, tenant)
    rows_sql = "SELECT id, tenant, title, metadata, seq FROM documents WHERE {} ORDER BY id LIMIT ?"
    if not filters:
        return None, (rows_sql.format(" AND ".join(where)), [*params, limit + 1])
    boundary = (f"SELECT id FROM documents WHERE {' AND '.join(where)} ORDER BY id LIMIT 1 OFFSET ?",
                [*params, scan - 1])
    match, match_params = list(where), list(params)
    if end is not None:
        match.append("id <= CAST(? AS TEXT)")
        match_params.append(_cursor(end))
    for key, value in filters.items():
        match.append("json_extract(metadata, ?) = ?")
        match_params.extend([f'$."{key}"', value])
    return boundary, (rows_sql.format(" AND ".join(match)), [*match_params, limit + 1])


class DocumentStore:
    """Thread-safe: writes on one connection behind a lock (SQLite serialises writers anyway); listing reads on
    read-only connections of their own, one per concurrent reader (kept for reuse)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = FULL")
        self._db.executescript(_SCHEMA)
        self._readers_lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._readers: list[sqlite3.Connection] = []

    def close(self) -> None:
        with self._lock:
            self._db.close()
        with self._readers_lock:
            for db in self._readers:
                db.close()
            self._readers.clear()
            self._idle.clear()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """A read-only connection for one read (WAL: it sees the last commit and never blocks the writer)."""
        with self._readers_lock:
            db = self._idle.pop() if self._idle else None
        if db is None:
            db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA query_only = ON")
            with self._readers_lock:
                self._readers.append(db)
        try:
            yield db
        finally:
            with self._readers_lock:
                if db in self._readers:
                    self._idle.append(db)

    def pragma(self, name: str) -> Any:
        with self._lock:
            return self._db.execute(f"PRAGMA {name}").fetchone()[0]

    def last_seq(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0])

    def count(self) -> int:
        with self._reading() as db:
            return int(db.execute("SELECT COUNT(*) FROM documents").fetchone()[0])

    def get(self, doc_id: str) -> Document | None:
        if lone_surrogate(doc_id) >= 0:
            return None  # not a storable id
        with self._reading() as db:
            rows = _fetch(db, "SELECT id, tenant, title, text, metadata FROM documents WHERE id = ?", (doc_id,))
        return _row_to_document(rows[0]) if rows else None

    def upsert(self, documents: Sequence[Document | Mapping[str, Any]], *, tenant: str | None = None) -> WriteResult:
        """Validate the whole batch, then write it in one transaction; returns when it is durable.

        ``tenant``: when given (the caller's tenant), every document must belong to it.
        """
        if not documents:
            raise InvalidRequest("an upsert needs at least one document")
        if len(documents) > MAX_BATCH:
            raise InvalidRequest(f"{len(documents)} documents in one upsert; at most {MAX_BATCH} are allowed")
        docs = [validate_document(d, i) for i, d in enumerate(documents)]
        seen: set[str] = set()
        for i, d in enumerate(docs):
            if d.id in seen:
                raise InvalidRequest(f"document {i} ({d.id!r}): the id appears twice in this batch")
            seen.add(d.id)
            if tenant is not None and d.tenant != tenant:
                raise InvalidRequest(f"document {i} ({d.id!r}): tenant {d.tenant!r} is not the caller's tenant {tenant!r}")
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                owners = dict(db.execute(
                    f"SELECT id, tenant FROM documents WHERE id IN ({','.join('?' * len(docs))})",
                    [d.id for d in docs]).fetchall())
                for i, d in enumerate(docs):
                    if d.id in owners and owners[d.id] != d.tenant:
                        # Says no more than "not yours": which tenant holds it is that tenant's business.
                        raise PermissionDenied(f"document {i} ({d.id!r}): this id cannot be written under tenant "
                                               f"{d.tenant!r}")
                seq = int(db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0])
                for d in docs:
                    seq += 1
                    db.execute("INSERT INTO changes (seq, op, id, tenant) VALUES (?, 'upsert', ?, ?)", (seq, d.id, d.tenant))
                    db.execute("INSERT OR REPLACE INTO documents (id, tenant, title, text, metadata, seq) "
                               "VALUES (?, ?, ?, ?, ?, ?)",
                               (d.id, d.tenant, d.title, d.text, json.dumps(d.metadata, sort_keys=True), seq))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return WriteResult(seq, len(docs))

    def delete(self, ids: Sequence[str], *, tenant: str | None = None) -> WriteResult:
        """Delete the ids that exist (and, with ``tenant``, belong to it); unknown ids are no-ops."""
        if not ids:
            raise InvalidRequest("a delete needs at least one id")
        if len(ids) > MAX_BATCH:
            raise InvalidRequest(f"{len(ids)} ids in one delete; at most {MAX_BATCH} are allowed")
        for i, doc_id in enumerate(ids):
            if not isinstance(doc_id, str) or not doc_id.strip():
                raise InvalidRequest(f"id {i} must be a non-empty string, got {doc_id!r}")
            if (at := lone_surrogate(doc_id)) >= 0:
                raise InvalidRequest(f"id {i} ({doc_id!r:.80}) holds a lone surrogate at character {at}: not an id "
                                     "this store can hold")
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                seq = int(db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0])
                last, count = 0, 0
                for doc_id in dict.fromkeys(ids):
                    found = _fetch(db, "SELECT tenant FROM documents WHERE id = ?", (doc_id,))
                    row = found[0] if found else None
                    if row is None or (tenant is not None and row[0] != tenant):
                        continue  # absent, or another tenant's: nothing of the caller's to delete
                    seq += 1
                    db.execute("INSERT INTO changes (seq, op, id, tenant) VALUES (?, 'delete', ?, ?)", (seq, doc_id, row[0]))
                    db.execute("DELETE FROM documents WHERE id = ?", (doc_id,))
                    last, count = seq, count + 1
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return WriteResult(last, count)

    def list_page(self, *, tenant: str | None = None, filters: Mapping[str, str] | None = None, after: str = "",
                  limit: int = MAX_BATCH, scan: int = SCAN_ROWS) -> DocumentPage:
        """Up to ``limit`` documents after id ``after``, in id order (no text is read): only ``tenant``'s when given
        (sought through the ``(tenant, id)`` index, so other tenants' rows are never read, counted or timed), only
        those whose metadata holds every ``filters`` pair. A filtered page examines at most ``max(scan, limit)``
        rows and stops there (see :class:`DocumentPage`). On a read connection: writers do not wait for it."""
        filters = dict(filters or {})
        scan = max(int(scan), limit)
        boundary, rows_q = page_queries(tenant, filters, after, limit, scan)
        end: str | None = None  # where a filtered page's scan stops (None: fewer than ``scan`` rows remain)
        with self._reading() as db:
            db.execute("BEGIN")  # one read snapshot for both statements
            try:
                if boundary is not None:
                    found = _fetch(db, *boundary)
                    end = found[0][0] if found else None
                    _, rows_q = page_queries(tenant, filters, after, limit, scan, end)
                rows = _fetch(db, *rows_q)
            finally:
                db.execute("COMMIT")
        out = [(i, t, title, json.loads(meta), int(seq)) for i, t, title, meta, seq in rows[:limit]]
        if len(rows) > limit:  # more matches follow the full page
            return DocumentPage(out, out[-1][0])
        return DocumentPage(out, end or "")  # the scan stopped at ``end``: go on from there; else nothing follows

    def list_documents(self, *, tenant: str | None = None, filters: Mapping[str, str] | None = None, after: str = "",
                       limit: int = MAX_BATCH) -> list[tuple[str, str, str, dict[str, str], int]]:
        """(id, tenant, title, metadata, seq) of up to ``limit`` documents after id ``after`` (:meth:`list_page`'s
        pages joined until ``limit`` rows or the end): fewer than ``limit`` only at the end. For callers in this
        process (a folder build); the service pages with :meth:`list_page`."""
        out: list[tuple[str, str, str, dict[str, str], int]] = []
        while True:
            page = self.list_page(tenant=tenant, filters=filters, after=after, limit=limit - len(out))
            out.extend(page.rows)
            if len(out) >= limit or not page.next_after:
                return out
            after = page.next_after

    def changes_since(self, seq: int) -> list[Change]:
        """Writes after ``seq`` in order; an upsert carries the document only if it is still the current version."""
        with self._lock:
            rows = _fetch(self._db,
                          "SELECT c.seq, c.op, c.id, c.tenant, d.tenant, d.title, d.text, d.metadata FROM changes c "
                          "LEFT JOIN documents d ON d.id = c.id AND d.seq = c.seq WHERE c.seq > ? ORDER BY c.seq", (seq,))
        out = []
        for s, op, doc_id, tenant, d_tenant, title, text, metadata in rows:
            doc = _document(doc_id, d_tenant, title, text, metadata) if text is not None else None
            out.append(Change(int(s), op, doc_id, tenant, doc))
        return out

    def snapshot(self) -> tuple[int, list[Document]]:
        """Every live document (by id) and the sequence number they reflect, read consistently: what a rebuild
        indexes and records as its covered sequence number."""
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            try:
                seq = int(db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0])
                rows = _fetch(db, "SELECT id, tenant, title, text, metadata FROM documents ORDER BY id")
            finally:
                db.execute("COMMIT")
        return seq, [_row_to_document(r) for r in rows]
