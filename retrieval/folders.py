"""A folder of files kept in step with an index, as a library call: the flow behind ``hybridrag build --corpus DIR``
and ``hybridrag sync`` (the command line only parses and prints).

- :func:`read_folder`: options in, documents and a report out (:mod:`index_builder.documents.folder` reads each file);
- :class:`FolderSync`: one round against a target, a document store (:class:`StoreTarget`) or a running server
  (:class:`ServerTarget`, gRPC): list what the target holds from this source, upsert new and changed files in
  batches, delete what this sync wrote whose file is gone; :func:`sync_retrying` and :func:`watch` repeat it
  through outages; :func:`folder_build` gives ``build`` its documents (against the previous snapshot, or through
  a store).

Who owns a document (:mod:`retrieval.folder_state`): each folder that syncs a source has a secret on the machine
that syncs it, and every document it writes carries a mark made with it; a listed document is the sync's only when
its mark verifies. The deletion pass deletes only those; the other documents of the same source name (an API
writer's, another folder's, another machine's) are *left alone* and counted, and a file whose id the target already
holds from another writer is skipped with its reason, never written over (``id_prefix`` keeps two folders' ids
apart). Two folders of one name get two secrets; a folder that moved on its machine keeps its own. On a new machine
(or with the state lost) ``adopt`` takes over this source's documents at this folder's ids (rewritten with new
marks, so embedded again) and deletes none it did not write; documents written before marks existed are adopted
the same way.

Tenants. A sync lists, tenant by tenant, every tenant it may touch: those the tenant map names, those of the files
read, and those it wrote to before (from the state), so a key bound to tenants can sync its own, a file a map
moves to another tenant is deleted there and written here (both ways), and a key that lacks one of them is refused
with that tenant named, before anything is written.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from index_builder.documents.corpus import MAX_ID_CHARS
from index_builder.documents.folder import (
    FolderOptions,
    FolderReport,
    Skipped,
    SyncPlan,
    candidates,
    iter_folder,
    plan_sync,
    source_name,
)
from index_builder.types import Document
from retrieval.folder_state import SourceState
from retrieval.folder_targets import (
    MAX_BACKOFF_S,
    PAGE,
    Listed,
    Refused,
    Say,
    ServerTarget,
    StoreTarget,
    SyncError,
    SyncUnavailable,
    Target,
    TargetRefused,
)

if TYPE_CHECKING:
    from retrieval.live.store import DocumentStore

__all__ = ["FolderBuild", "FolderSync", "Refused", "ServerTarget", "SourceState", "StoreTarget", "SyncError",
           "SyncOptions", "SyncResult", "SyncUnavailable", "Target", "documents", "folder_build", "read_folder",
           "sync_retrying", "watch"]

BATCH_DOCS = 32  # documents per write: each is chunked and embedded by the server before it answers
BATCH_BYTES = 8 * 2**20  # under the server's 16 MiB request limit


# ---------------------------------------------------------------------- reading

def documents(root: str | Path, options: FolderOptions | None = None, report: FolderReport | None = None, *,
              id_prefix: str = "", cache: dict | None = None) -> Iterator[Document]:
    """The folder's documents in path order, ids prefixed with ``id_prefix`` (skipped files go to ``report``);
    ``cache`` as for :func:`index_builder.documents.folder.iter_folder` (a watch passes the same one every round)."""
    report = report if report is not None else FolderReport(root=str(root))
    for d in iter_folder(root, options, report, cache=cache):
        if id_prefix:
            if len(id_prefix) + len(d.id) > MAX_ID_CHARS:
                report.skipped.append(Skipped(d.id, f"with the id prefix its id is over {MAX_ID_CHARS} characters"))
                report.documents -= 1
                continue
            d = replace(d, id=id_prefix + d.id)
        yield d


def read_folder(root: str | Path, options: FolderOptions | None = None, *, id_prefix: str = "",
                cache: dict | None = None) -> tuple[list[Document], FolderReport]:
    """Options in, documents and a report out."""
    report = FolderReport(root=str(root))
    return list(documents(root, options, report, id_prefix=id_prefix, cache=cache)), report


def batches(docs: Iterable[Document], max_docs: int = BATCH_DOCS, max_bytes: int = BATCH_BYTES
            ) -> Iterator[list[Document]]:
    """Writes of at most ``max_docs`` documents and ``max_bytes`` of text."""
    batch: list[Document] = []
    size = 0
    for d in docs:
        n = len(d.text.encode("utf-8", "surrogatepass")) + len(d.title) + 512
        if batch and (len(batch) >= max_docs or size + n > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(d)
        size += n
    if batch:
        yield batch


# ---------------------------------------------------------------------- one round

@dataclass(frozen=True)
class SyncOptions:
    """How a folder is synced: which files (``folder``), where the state lives, ids prefixed with ``id_prefix``,
    ``adopt`` (take over this source's documents at this folder's ids), write batch sizes."""

    state_dir: Path
    folder: FolderOptions = field(default_factory=FolderOptions)
    id_prefix: str = ""
    adopt: bool = False
    batch_docs: int = BATCH_DOCS
    batch_bytes: int = BATCH_BYTES

    def __post_init__(self) -> None:
        if len(self.id_prefix) > 256 or not self.id_prefix.isprintable():
            raise SyncError(f"the id prefix must be at most 256 printable characters, got {self.id_prefix!r:.80}")


@dataclass
class SyncResult:
    source: str
    plan: SyncPlan
    report: FolderReport
    left_alone: int = 0  # documents of this source's name that this sync did not write (and so leaves)
    seconds: float = 0.0

    def changed(self) -> bool:
        return bool(self.plan.upserts() or self.plan.deleted)

    def summary(self) -> str:
        alone = (f"; {self.left_alone} documents of source {self.source!r} that this sync did not write left alone"
                 if self.left_alone else "")
        return self.plan.summary(len(self.report.skipped)) + alone


class FolderSync:
    """A folder kept in step with a target, one :meth:`run` at a time (a watch keeps the object: files whose
    modified time and size did not change are not read again)."""

    def __init__(self, root: str | Path, target: Target, options: SyncOptions, say: Say | None = None) -> None:
        self.root, self.target, self.options = Path(root), target, options
        self.say = say or (lambda _: None)
        if not self.root.is_dir():
            from index_builder.errors import CorpusError

            raise CorpusError("not a folder", path=str(self.root))
        self.source = source_name(self.root, options.folder)
        self.state = SourceState.open(options.state_dir, self.source, self.root, say=self.say)
        self.cache: dict = {}
        self.conflicts: dict[str, tuple[str, str]] = {}  # id -> (content hash, reason): re-checked when it changes

    def tenants(self, docs: list[Document]) -> dict[str, str]:
        """Every tenant this round may touch -> why (for the error naming one a key lacks)."""
        fo = self.options.folder
        out: dict[str, str] = {t: "the tenant map names it" for _, t in fo.tenant_map}
        if not fo.tenant_map and not fo.tenant_from_folder:
            out.setdefault(fo.tenant, "the folder's tenant")
        for d in docs:
            out.setdefault(d.tenant, f"{d.metadata.get('path', d.id)} maps to it")
        for t in sorted(self.state.tenants):
            out.setdefault(t, "an earlier sync of this source wrote to it")
        return out

    def listing(self, tenants: Mapping[str, str]) -> tuple[dict[str, Listed], dict[str, Listed]]:
        """(this sync's documents, other writers' documents of the same source name), tenant by tenant ("" once
        covers them all)."""
        mine: dict[str, Listed] = {}
        others: dict[str, Listed] = {}
        for tenant, why in ([("", tenants[""])] if "" in tenants else tenants.items()):
            after = ""
            while True:
                try:
                    page, after = self.target.list_page(tenant, {"source": self.source}, after)
                except TargetRefused as e:
                    what = (f"tenant {tenant!r}" if tenant else
                            "every tenant, which documents without a tenant need (give --tenant)")
                    raise SyncError(f"{self.target.name} refused to list {what} ({why}): {e.details}") from None
                for d in page:
                    (mine if self.state.owns(d) else others)[d.id] = d
                if not after:
                    break
        return mine, others

    def run(self) -> SyncResult:
        t0 = time.perf_counter()
        docs, report = read_folder(self.root, self.options.folder, id_prefix=self.options.id_prefix, cache=self.cache)
        tenants = self.tenants(docs)
        mine, others = self.listing(tenants)
        self.state.remember(self.state.tenants | set(tenants))  # before any write: a later round lists them all
        existing = {i: (d.metadata.get("content_hash", ""), d.tenant) for i, d in mine.items()}
        ids = {d.id for d in docs}
        if self.options.adopt:  # rewritten with this sync's marks (hash "" makes each an update)
            existing |= {i: ("", d.tenant) for i, d in others.items() if i in ids}
        plan = plan_sync(docs, existing)
        plan.added = self._without_conflicts(plan.added, others, report)
        self._apply(plan, mine | others, report)
        self.state.remember({d.tenant for d in docs})
        left = sum(1 for i in others if i not in existing)
        return SyncResult(self.source, plan, report, left, time.perf_counter() - t0)

    def _without_conflicts(self, added: list[Document], others: Mapping[str, Listed], report: FolderReport
                           ) -> list[Document]:
        """New files whose id the target holds from another writer are skipped with their reason, not written over.
        A conflict is remembered with the file's hash: asked again only when the file changes (a watch does not
        scan the tenant every round)."""
        def digest(d: Document) -> str:
            return d.metadata.get("content_hash", "")

        to_check: dict[str, list[str]] = {}
        for d in added:
            if d.id in others:
                self.conflicts[d.id] = (digest(d), f"source {self.source!r} of another folder, machine or writer: "
                                        "--adopt takes it over if it is this folder's")
            elif self.conflicts.get(d.id, ("",))[0] != digest(d):
                self.conflicts.pop(d.id, None)
                to_check.setdefault(d.tenant, []).append(d.id)
        for tenant, group in to_check.items():
            for i in self.target.held(tenant, sorted(group)):
                self.conflicts[i] = ("", "another writer")
        kept = []
        for d in added:
            if d.id not in self.conflicts:
                kept.append(d)
                continue
            who = self.conflicts[d.id][1]
            self.conflicts[d.id] = (digest(d), who)
            report.skipped.append(Skipped(d.metadata.get("path", d.id), f"its id is held by a document this sync did "
                                          f"not write ({who}); --id-prefix keeps this folder's ids apart"))
        return kept

    def _apply(self, plan: SyncPlan, held: Mapping[str, Listed], report: FolderReport) -> None:
        """Moved ids deleted from their old tenant, upserts in batches (a refused batch retried file by file, the
        refused files skipped), then the deletions, each in its tenant."""
        self._delete(plan.moved, held)
        refused: set[str] = set()
        for batch in batches([self.state.marked(d) for d in plan.upserts()], self.options.batch_docs,
                             self.options.batch_bytes):
            try:
                self.target.upsert(batch)
            except Refused:
                for d in batch:
                    try:
                        self.target.upsert([d])
                    except Refused as e:
                        refused.add(d.id)
                        report.skipped.append(Skipped(d.metadata.get("path", d.id), e.reason))
        if refused:
            plan.added = [d for d in plan.added if d.id not in refused]
            plan.updated = [d for d in plan.updated if d.id not in refused]
        self._delete(plan.deleted, held)

    def _delete(self, ids: list[str], held: Mapping[str, Listed]) -> None:
        by_tenant: dict[str, list[str]] = {}
        for i in ids:
            by_tenant.setdefault(held[i].tenant, []).append(i)
        for tenant, group in by_tenant.items():
            for start in range(0, len(group), PAGE):
                self.target.delete(group[start:start + PAGE], tenant)


# ---------------------------------------------------------------------- repeated rounds

def sync_retrying(sync: FolderSync, retry_for_s: float, say: Say) -> SyncResult:
    """One round, repeated with backoff while the target is unavailable, for up to ``retry_for_s`` seconds."""
    start, delay, said = time.monotonic(), 1.0, False
    while True:
        try:
            return sync.run()
        except SyncUnavailable as e:
            if time.monotonic() - start + delay > retry_for_s:
                raise
            if not said:
                say(f"{e}; retrying for up to {retry_for_s:.0f} s")
                said = True
            time.sleep(delay)
            delay = min(MAX_BACKOFF_S, delay * 2)


def watch(sync: FolderSync, every_s: float, stop: threading.Event, on_round: Callable[[SyncResult], None],
          say: Say, max_backoff_s: float = MAX_BACKOFF_S) -> None:
    """Rounds every ``every_s`` seconds until ``stop`` is set. An unavailable target or a round that fails (a
    reader that raises) does not end it: it is said once per outage, retried with backoff up to ``max_backoff_s``,
    and said once when rounds succeed again. A refusal (:class:`SyncError`: a key, a tenant) ends it."""
    failing: str | None = None
    since = delay = 0.0
    while not stop.is_set():
        try:
            result = sync.run()
        except SyncUnavailable as e:
            kind, message = "outage", f"{e}; retrying with backoff (up to {max_backoff_s:.0f} s) until it is back"
        except SyncError:
            raise
        except Exception as e:  # noqa: BLE001 - a watch outlives a bad round; the next one may succeed
            kind, message = "failure", (f"a round failed ({type(e).__name__}: {' '.join(str(e).split())[:300]}); "
                                        f"retrying with backoff (up to {max_backoff_s:.0f} s)")
        else:
            if failing is not None:
                back = f"{sync.target.name} is back" if failing == "outage" else "rounds succeed again"
                say(f"{back} after {time.monotonic() - since:.0f} s")
            failing, delay = None, every_s
            on_round(result)
            stop.wait(every_s)
            continue
        if failing != kind:
            say(message)
            failing, since, delay = kind, time.monotonic(), max(every_s, 1.0)
        else:
            delay = min(max_backoff_s, delay * 2)
        stop.wait(delay)


# ---------------------------------------------------------------------- build --corpus DIR

@dataclass
class FolderBuild:
    """What ``build`` needs from a folder: the documents (a list, or a stream read as the build goes), the store
    sequence they cover, how many candidate files there are (for the progress bar), and the summary line (whole
    once the documents are read)."""

    documents: Iterable[Document]
    covered_seq: int
    total: int
    summary: Callable[[], str]


def folder_build(root: str | Path, options: SyncOptions, index_root: Path, store: DocumentStore | str | Path | None = None,
                 *, on_read: Callable[[FolderReport], None] = lambda _: None, say: Say | None = None) -> FolderBuild:
    """The documents of a build from a folder; ``on_read`` gets the reading report once every file is read. With
    ``store`` (a store, or the path of one to open): the store is synced first (as ``sync`` does) and the build
    reads the whole store; without: the folder is streamed, and compared with the previous generation of
    ``index_root`` only for the summary (a snapshot built from a folder holds exactly that folder, so no ownership
    is at stake)."""
    from index_builder.errors import CorpusError

    root = Path(root)
    if isinstance(store, (str, Path)):
        from retrieval.live.store import DocumentStore

        opened = DocumentStore(store)
        try:
            return folder_build(root, options, index_root, opened, on_read=on_read, say=say)
        finally:
            opened.close()
    if store is not None:
        result = FolderSync(root, StoreTarget(store), options, say).run()
        on_read(result.report)
        seq, all_docs = store.snapshot()
        if not all_docs:
            raise CorpusError(f"no readable files ({result.report.summary()})", path=str(root))
        line = f"{root}: {result.summary()}; {result.report.summary()}"
        return FolderBuild(all_docs, seq, len(all_docs), lambda: line)
    report = FolderReport(root=str(root))
    existing = snapshot_holdings(index_root, source_name(root, options.folder))
    total = sum(1 for _ in candidates(root, options.folder))  # for the progress bar's ETA (skips end it early)
    seen: list[Document] = []

    def stream() -> Iterator[Document]:
        for d in documents(root, options.folder, report, id_prefix=options.id_prefix):
            seen.append(Document(id=d.id, text="", tenant=d.tenant,
                                 metadata={"content_hash": d.metadata["content_hash"]}))
            yield d
        on_read(report)
        if not seen:
            raise CorpusError(f"no readable files ({report.summary()})", path=str(root))

    def summary() -> str:
        return f"{root}: {plan_sync(seen, existing).summary(len(report.skipped))}; {report.summary()}"

    return FolderBuild(stream(), 0, total, summary)


def snapshot_holdings(index_root: Path, source: str) -> dict[str, tuple[str, str]]:
    """id -> (content hash, tenant) of what the current generation of ``index_root`` holds from ``source``."""
    from index_builder.snapshot.format import current_snapshot_dir, read_documents

    try:
        docs = read_documents(current_snapshot_dir(index_root) / "documents.jsonl")
    except Exception:  # noqa: BLE001 - no previous generation (or an unreadable one): everything is new
        return {}
    try:
        return {d.id: (d.metadata.get("content_hash", ""), d.tenant) for d in docs
                if d.metadata.get("source") == source}
    finally:
        docs.close()
