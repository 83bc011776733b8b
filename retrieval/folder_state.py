"""Who owns a document a folder sync wrote (:mod:`retrieval.folders`): each folder's secret, kept on the machine that
syncs it, and the marks made with it.

``source`` metadata names a folder, but metadata is anyone's to write, so it proves nothing. Each folder that syncs
a source gets a secret, kept in the *state* (``STATE_DIR/<source>-<hash>.json``, mode 0600: per folder path, its
secret, the tenants written to, when it was last used). Every document the sync writes carries ``source_id`` (a
public name of the secret) and ``source_mark``, an HMAC of (source, id, tenant, content hash) under it. A listed
document is the folder's only when its mark verifies: a copy of its metadata on another id, tenant or content does
not, and no one without the secret can make one that does.

Two folders of one name on one machine get two secrets, so each leaves the other's documents alone. A folder whose
path is new while a folder of that source that was synced here no longer exists is taken to have *moved*: it
inherits that secret (the most recently used one when several are gone), so nothing is written again.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from index_builder.types import Document
from retrieval.folder_targets import Listed, Say, SyncError


@dataclass
class SourceState:
    """One folder's state for one source: its secret and the tenants it wrote to (``path``: the state file)."""

    path: Path
    name: str
    folder: str
    secret: bytes
    tenants: set[str] = field(default_factory=set)

    @classmethod
    def open(cls, state_dir: Path, name: str, folder: Path, say: Say | None = None) -> SourceState:
        """The state of ``folder`` for source ``name``: its own, a moved folder's, or a new one."""
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        path = Path(state_dir) / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name)[:40]}-{digest}.json"
        here = str(folder.resolve())
        with _locked(path):
            entries = _read(path)
            gone = sorted((p for p in entries if p != here and not Path(p).is_dir()),
                          key=lambda p: entries[p].get("used", 0))
            if here in entries:
                entry = entries[here]
            elif gone:
                entry = entries.pop(gone[-1])
                if say is not None:
                    say(f"the folder of source {name!r} moved from {gone[-1]} to {here}")
            else:
                entry = {"secret": secrets.token_hex(32)}
                if entries and say is not None:
                    say(f"another folder of source {name!r} is synced from this machine ({sorted(entries)[0]}): "
                        "this one gets its own source id (--source NAME tells them apart by name too)")
            try:
                state = cls(path, name, here, bytes.fromhex(entry["secret"]), set(entry.get("tenants", ())))
            except (KeyError, TypeError, ValueError) as e:
                raise SyncError(f"the sync state {path} is damaged ({e!r}): move it away to start afresh") from None
            entries[here] = state._entry()
            _write(path, name, entries)
        return state

    def _entry(self) -> dict[str, Any]:
        return {"secret": self.secret.hex(), "tenants": sorted(self.tenants), "used": time.time()}

    def remember(self, tenants: Iterable[str]) -> None:
        """Record the tenants this folder may hold documents in (a later round lists them all)."""
        tenants = set(tenants)
        if tenants != self.tenants:
            self.tenants = tenants
            with _locked(self.path):
                entries = _read(self.path)
                entries[self.folder] = self._entry()
                _write(self.path, self.name, entries)

    @property
    def source_id(self) -> str:
        return hashlib.sha256(b"source-id\0" + self.secret).hexdigest()[:16]

    def mark(self, doc_id: str, tenant: str, content_hash: str) -> str:
        message = "\0".join((self.name, doc_id, tenant, content_hash)).encode("utf-8", "surrogatepass")
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest()[:32]

    def owns(self, d: Listed) -> bool:
        m = d.metadata
        return (m.get("source") == self.name and m.get("source_id") == self.source_id
                and hmac.compare_digest(m.get("source_mark", ""), self.mark(d.id, d.tenant, m.get("content_hash", ""))))

    def marked(self, d: Document) -> Document:
        mark = self.mark(d.id, d.tenant, d.metadata.get("content_hash", ""))
        return replace(d, metadata={**d.metadata, "source_id": self.source_id, "source_mark": mark})


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on the state file's lock (two syncs of one source name on one machine)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise SyncError(f"cannot use the sync state folder {path.parent}: {e.strerror or e}") from None
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(path: Path) -> dict[str, dict[str, Any]]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        folders = raw["folders"]
        if not isinstance(folders, dict) or not all(isinstance(v, dict) for v in folders.values()):
            raise ValueError("'folders' must map each folder to its entry")
        return folders
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SyncError(f"cannot read the sync state {path}: {e}") from None


def _write(path: Path, name: str, entries: dict[str, dict[str, Any]]) -> None:
    """Atomically, readable by its owner only (it holds the secrets)."""
    tmp = path.with_suffix(".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"source": name, "folders": entries}, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        raise SyncError(f"cannot write the sync state {path}: {e.strerror or e}") from None
