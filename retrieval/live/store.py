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
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from index_builder.corpus import parse_document
from index_builder.types import Document
from retrieval.errors import DeadlineExceeded, InvalidRequest, PermissionDenied

MAX_BATCH = 1000
# Bytes of one write batch (the serialised request): checked at the edge before any work. The gRPC message
# limit (server.max_message_mb, 16 MiB) is the same size, so over gRPC this bound and that one coincide.
MAX_BATCH_BYTES = 16 * 2**20
MAX_TEXT_CHARS = 1_000_000
MAX_TITLE_CHARS = 2_000
MAX_METADATA_KEYS = 64

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
    return doc  # tenant, metadata keys and values were checked by parse_document (index_builder.corpus)


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


def _row_to_document(row: sqlite3.Row | tuple) -> Document:
    doc_id, tenant, title, text, metadata = row[:5]
    return Document(id=doc_id, text=text, title=title, tenant=tenant, metadata=json.loads(metadata))


class DocumentStore:
    """Thread-safe (one connection behind a lock: SQLite serialises writers anyway)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def pragma(self, name: str) -> Any:
        with self._lock:
            return self._db.execute(f"PRAGMA {name}").fetchone()[0]

    def last_seq(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0])

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM documents").fetchone()[0])

    def get(self, doc_id: str) -> Document | None:
        with self._lock:
            row = self._db.execute("SELECT id, tenant, title, text, metadata FROM documents WHERE id = ?",
                                   (doc_id,)).fetchone()
        return None if row is None else _row_to_document(row)

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
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                seq = int(db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0])
                last, count = 0, 0
                for doc_id in dict.fromkeys(ids):
                    row = db.execute("SELECT tenant FROM documents WHERE id = ?", (doc_id,)).fetchone()
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

    def list_documents(self, *, tenant: str | None = None, filters: Mapping[str, str] | None = None, after: str = "",
             limit: int = MAX_BATCH) -> list[tuple[str, str, str, dict[str, str], int]]:
        """(id, tenant, title, metadata, seq) of up to ``limit`` documents after id ``after``, in id order; only
        ``tenant``'s when given, only those whose metadata holds every ``filters`` pair. No text is read."""
        where, params = ["id > ?"], [after]
        if tenant is not None:
            where.append("tenant = ?")
            params.append(tenant)
        for key, value in (filters or {}).items():
            where.append("json_extract(metadata, ?) = ?")
            params.extend([f'$."{key}"', value])
        with self._lock:
            rows = self._db.execute(
                f"SELECT id, tenant, title, metadata, seq FROM documents WHERE {' AND '.join(where)} "
                "ORDER BY id LIMIT ?", (*params, int(limit))).fetchall()
        return [(i, t, title, json.loads(m), int(q)) for i, t, title, m, q in rows]

    def changes_since(self, seq: int) -> list[Change]:
        """Writes after ``seq`` in order; an upsert carries the document only if it is still the current version."""
        with self._lock:
            rows = self._db.execute(
                "SELECT c.seq, c.op, c.id, c.tenant, d.tenant, d.title, d.text, d.metadata FROM changes c "
                "LEFT JOIN documents d ON d.id = c.id AND d.seq = c.seq WHERE c.seq > ? ORDER BY c.seq", (seq,)).fetchall()
        out = []
        for s, op, doc_id, tenant, d_tenant, title, text, metadata in rows:
            doc = (Document(id=doc_id, text=text, title=title, tenant=d_tenant, metadata=json.loads(metadata))
                   if text is not None else None)
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
                rows = db.execute("SELECT id, tenant, title, text, metadata FROM documents ORDER BY id").fetchall()
            finally:
                db.execute("COMMIT")
        return seq, [_row_to_document(r) for r in rows]
