"""A folder of files kept in step with an index: ``hybridrag build --corpus DIR`` and ``hybridrag sync DIR``.

Both read the folder with :mod:`index_builder.folder` and compare each file's ``content_hash`` with what the index
already holds from the same ``source`` (the folder's name, or ``--source``):
- ``build --corpus DIR --out IDX``: against the previous generation of IDX; the build re-embeds only the chunks it
  has not seen (chunk keys), so an unchanged file costs no model time;
- ``build --corpus DIR --store S``: the store is brought in step first (upserts of new and changed files, deletes
  of removed ones), then the snapshot is built from the store, for ``serve --store S``;
- ``sync DIR --server HOST:PORT``: the same writes sent to a running server over gRPC (Upsert / Delete, the files
  it holds listed with ListDocuments): searchable as soon as each batch is acknowledged. ``--watch SECONDS`` polls.

Each run prints one summary line (added, updated, deleted, unchanged, skipped) and one line per skipped file.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from index_builder.errors import CorpusError
from index_builder.folder import (
    DEFAULT_MAX_FILE_MB,
    FolderOptions,
    FolderReport,
    SyncPlan,
    candidates,
    iter_folder,
    load_tenant_map,
    plan_sync,
    source_name,
)
from index_builder.types import Document

BATCH_DOCS = 32  # documents per write: each is chunked and embedded by the server before it answers
BATCH_BYTES = 8 * 2**20  # under the server's 16 MiB request limit


def add_folder_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("a folder of files (--corpus DIR without corpus.jsonl)")
    g.add_argument("--include", action="append", default=[], metavar="GLOB",
                   help="read only files matching (relative path, or file name for a pattern without '/'); repeatable")
    g.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="skip files matching; repeatable")
    g.add_argument("--tenant", default="", help="every document's tenant")
    g.add_argument("--tenant-from-folder", action="store_true", help="the first folder of a file's path is its tenant")
    g.add_argument("--tenant-map", metavar="FILE", help="JSON or TOML: {glob: tenant}, the first match wins")
    g.add_argument("--max-file-mb", type=float, default=DEFAULT_MAX_FILE_MB, help="skip larger files")
    g.add_argument("--source", default="", help="the name recorded on every document (default: the folder's "
                                                 "name); a re-run deletes only documents of the same source")
    g.add_argument("--strict", action="store_true", help="fail on the first file that cannot be read")
    g.add_argument("--follow-links-outside", action="store_true",
                   help="read symbolic links whose target is outside the folder (default: skipped with the reason; "
                        "a link such as docs/users.txt -> /etc/passwd would put that file in the index, served to "
                        "every caller the index serves)")


def folder_options(args: argparse.Namespace) -> FolderOptions:
    try:
        return FolderOptions(include=tuple(args.include), exclude=tuple(args.exclude), tenant=args.tenant,
                             tenant_from_folder=args.tenant_from_folder,
                             tenant_map=load_tenant_map(args.tenant_map) if args.tenant_map else (),
                             max_file_mb=args.max_file_mb, source=args.source, strict=args.strict,
                             follow_links_outside=args.follow_links_outside)
    except ValueError as e:
        raise CorpusError(str(e), path=str(args.tenant_map or "")) from None


def print_skipped(report: FolderReport, limit: int = 50) -> None:
    for s in report.skipped[:limit]:
        print(s.line(), file=sys.stderr)
    if len(report.skipped) > limit:
        print(f"... and {len(report.skipped) - limit} more skipped", file=sys.stderr)


def batches(docs: Iterable[Document]) -> Iterator[list[Document]]:
    """Writes of at most ``BATCH_DOCS`` documents and ``BATCH_BYTES`` of text."""
    batch: list[Document] = []
    size = 0
    for d in docs:
        n = len(d.text.encode("utf-8", "surrogatepass")) + len(d.title) + 512
        if batch and (len(batch) >= BATCH_DOCS or size + n > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(d)
        size += n
    if batch:
        yield batch


def _existing(rows: Iterable[tuple[str, str, dict[str, str]]], source: str) -> dict[str, tuple[str, str]]:
    return {i: (m.get("content_hash", ""), t) for i, t, m in rows if m.get("source") == source}


# ---------------------------------------------------------------------- the document store (build --store)

def store_existing(store: Any, source: str) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    after = ""
    while True:
        rows = store.list_documents(filters={"source": source}, after=after)
        out.update(_existing(((i, t, m) for i, t, _, m, _ in rows), source))
        if not rows:
            return out
        after = rows[-1][0]


def apply_to_store(store: Any, plan: SyncPlan) -> None:
    if plan.moved:
        store.delete(plan.moved)
    for batch in batches(plan.upserts()):
        store.upsert(batch)
    for start in range(0, len(plan.deleted), 1000):
        store.delete(plan.deleted[start:start + 1000])


def snapshot_existing(index_root: Path, source: str) -> dict[str, tuple[str, str]]:
    """What the current generation of ``index_root`` holds from ``source`` ({} when there is none)."""
    from index_builder.snapshot import current_snapshot_dir, read_documents

    try:
        docs = read_documents(current_snapshot_dir(index_root) / "documents.jsonl")
    except Exception:  # noqa: BLE001 - no previous generation (or an unreadable one): everything is new
        return {}
    try:
        return _existing(((d.id, d.tenant, d.metadata) for d in docs), source)
    finally:
        docs.close()


# ---------------------------------------------------------------------- a running server (sync)

def server_existing(client: Any, source: str, tenant: str = "") -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    after = ""
    while True:
        page = client.list_documents(tenant=tenant, filters={"source": source}, after=after, timeout=60.0)
        out.update(_existing(((d.id, d.tenant, dict(d.metadata)) for d in page.documents), source))
        if not page.next_after:
            return out
        after = page.next_after


def _with_retries(call, what: str, attempts: int = 6):
    import grpc

    for attempt in range(attempts):
        try:
            return call()
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            if code not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE) or attempt == attempts - 1:
                raise
            wait = min(30.0, 2.0 ** attempt)
            print(f"{what}: {code.name.lower()} ({e.details()}); retrying in {wait:.0f} s", file=sys.stderr)
            time.sleep(wait)


def apply_to_server(client: Any, plan: SyncPlan, tenants: dict[str, str]) -> None:
    """``tenants``: id -> tenant of the documents the server holds (deletes name the tenant)."""
    from retrieval.api import retriever_pb2 as pb

    def delete(ids: list[str]) -> None:
        by_tenant: dict[str, list[str]] = {}
        for i in ids:
            by_tenant.setdefault(tenants.get(i, ""), []).append(i)
        for tenant, group in by_tenant.items():
            for start in range(0, len(group), 1000):
                part = group[start:start + 1000]
                _with_retries(lambda part=part, tenant=tenant: client.delete(part, tenant=tenant, timeout=120.0),
                              "delete")

    delete(plan.moved)
    for batch in batches(plan.upserts()):
        docs = [pb.Document(id=d.id, title=d.title, text=d.text, tenant=d.tenant, metadata=d.metadata) for d in batch]
        _with_retries(lambda docs=docs: client.upsert(docs, timeout=600.0), "upsert")
    delete(plan.deleted)


def sync_once(client: Any, root: Path, options: FolderOptions, cache: dict) -> tuple[SyncPlan, FolderReport]:
    report = FolderReport(root=str(root))
    docs = list(iter_folder(root, options, report, cache=cache))
    source = source_name(root, options)
    single = options.tenant if not (options.tenant_from_folder or options.tenant_map) else ""
    existing = server_existing(client, source, single)
    plan = plan_sync(docs, existing)
    apply_to_server(client, plan, {i: t for i, (_, t) in existing.items()})
    return plan, report


def cmd_sync(args: argparse.Namespace) -> int:
    from retrieval.serving.client import ClientOptions, RetrieverClient

    root = Path(args.folder)
    if not root.is_dir():
        raise CorpusError("not a folder", path=str(root))
    options = folder_options(args)
    cache: dict = {}
    stop = threading.Event()
    if args.watch:  # SIGINT / SIGTERM end the watch between rounds (a write in flight finishes first)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    client = RetrieverClient(args.server, ClientOptions(api_key=args.api_key or os.environ.get("HYBRIDRAG_API_KEY", ""),
                                                         tls_ca=args.tls_ca or ""))
    try:
        while True:
            t = time.perf_counter()
            plan, report = sync_once(client, root, options, cache)
            changed = plan.upserts() or plan.deleted
            if changed or not args.watch:
                print_skipped(report)
                print(f"{root}: {plan.summary(len(report.skipped))} ({time.perf_counter() - t:.1f} s)", flush=True)
            if not args.watch or stop.wait(args.watch):
                return 0
    except KeyboardInterrupt:
        return 0
    finally:
        client.close()


def add_sync_parser(sub: Any, add_common) -> None:
    p = sub.add_parser("sync", help="bring a running server (serve --store) in step with a folder of files: upserts "
                                    "new and changed files, deletes removed ones (gRPC)")
    p.add_argument("folder")
    p.add_argument("--server", default="127.0.0.1:50051", help="the gRPC address of 'hybridrag serve --store'")
    p.add_argument("--api-key", default="", help="API key (default: $HYBRIDRAG_API_KEY)")
    p.add_argument("--tls-ca", help="PEM file to trust for a TLS server")
    p.add_argument("--watch", type=float, default=0.0, metavar="SECONDS",
                   help="keep polling the folder every SECONDS and sync what changed (Ctrl-C or SIGTERM stops it "
                        "after the round in flight)")
    add_folder_args(p)
    add_common(p)
    p.set_defaults(func=cmd_sync)


# ---------------------------------------------------------------------- build --corpus DIR

def build_folder(args: argparse.Namespace, config: Any) -> tuple[Any, int, str, int]:
    """The documents of a folder for ``hybridrag build``: returns (stream or list, covered seq, summary line,
    count)."""
    root = Path(args.corpus)
    options = folder_options(args)
    source = source_name(root, options)
    report = FolderReport(root=str(root))
    if args.store:
        from retrieval.live.store import DocumentStore

        docs = list(iter_folder(root, options, report))
        store = DocumentStore(args.store)
        try:
            plan = plan_sync(docs, store_existing(store, source))
            apply_to_store(store, plan)
            seq, all_docs = store.snapshot()
        finally:
            store.close()
        print_skipped(report)
        if not all_docs:
            raise CorpusError(f"no readable files ({report.summary()})", path=str(root))
        return all_docs, seq, f"{root}: {plan.summary(len(report.skipped))}; {report.summary()}", len(all_docs)
    existing = snapshot_existing(Path(args.out), source)
    total = sum(1 for _ in candidates(root, options))  # for the progress bar's ETA (skips end it early)
    seen: list[Document] = []

    def stream() -> Iterator[Document]:
        for d in iter_folder(root, options, report):
            seen.append(Document(id=d.id, text="", tenant=d.tenant, metadata={"content_hash": d.metadata["content_hash"]}))
            yield d
        print_skipped(report)
        if not seen:
            raise CorpusError(f"no readable files ({report.summary()})", path=str(root))

    class Summary:
        def __str__(self) -> str:
            plan = plan_sync(seen, existing)
            return f"{root}: {plan.summary(len(report.skipped))}; {report.summary()}"

    return stream(), 0, Summary(), total  # type: ignore[return-value]

