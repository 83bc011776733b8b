"""``hybridrag sync DIR`` and the folder arguments of ``hybridrag build --corpus DIR``: arguments in, lines out.

The flow itself (reading, who owns a document, tenants, batches, retries, the watch) is :mod:`retrieval.folders`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from index_builder.documents.folder import DEFAULT_MAX_FILE_MB, FolderOptions, FolderReport, load_tenant_map
from index_builder.errors import ConfigError, CorpusError


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
                                                 "name); a sync deletes only documents it wrote")
    g.add_argument("--strict", action="store_true", help="fail on the first file that cannot be read")
    g.add_argument("--follow-links-outside", action="store_true",
                   help="read symbolic links whose target is outside the folder (default: skipped with the reason; "
                        "a link such as docs/users.txt -> /etc/passwd would put that file in the index, served to "
                        "every caller the index serves)")


def add_ownership_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("who owns what (sync, build --store)")
    g.add_argument("--state-dir", help="where each source's secret and folder are kept (default: "
                                       "$XDG_STATE_HOME/hybridrag/sync or ~/.local/state/hybridrag/sync)")
    g.add_argument("--adopt", action="store_true", help="take over this source's documents at this folder's ids "
                   "(state lost or on another machine, or written before marks existed); deletes none")
    g.add_argument("--id-prefix", default="", help="prepended to every id (two folders holding the same paths)")


def folder_options(args: argparse.Namespace) -> FolderOptions:
    try:
        return FolderOptions(include=tuple(args.include), exclude=tuple(args.exclude), tenant=args.tenant,
                             tenant_from_folder=args.tenant_from_folder,
                             tenant_map=load_tenant_map(args.tenant_map) if args.tenant_map else (),
                             max_file_mb=args.max_file_mb, source=args.source, strict=args.strict,
                             follow_links_outside=args.follow_links_outside)
    except ValueError as e:
        raise CorpusError(str(e), path=str(args.tenant_map or "")) from None


def sync_options(args: argparse.Namespace) -> Any:
    from retrieval.folders import SyncOptions

    state = args.state_dir or Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local/state") / "hybridrag/sync"
    return SyncOptions(Path(state), folder_options(args), id_prefix=args.id_prefix, adopt=args.adopt)


def say(line: str) -> None:
    print(f"hybridrag: {line}", file=sys.stderr, flush=True)


def print_skipped(report: FolderReport, limit: int = 50) -> None:
    for s in report.skipped[:limit]:
        print(s.line(), file=sys.stderr)
    if len(report.skipped) > limit:
        print(f"... and {len(report.skipped) - limit} more skipped", file=sys.stderr)


def api_key(args: argparse.Namespace) -> str:
    """From ``--api-key-file``, else ``--api-key`` (with a warning), else ``$HYBRIDRAG_API_KEY``."""
    if args.api_key_file:
        try:
            key = Path(args.api_key_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read the API key file {args.api_key_file}: {e}") from None
        if not key:
            raise ConfigError(f"the API key file {args.api_key_file} is empty")
        return key
    if args.api_key:
        say("warning: --api-key is visible to every user of this machine (ps, /proc) for as long as this runs; "
            "use HYBRIDRAG_API_KEY or --api-key-file")
    return args.api_key or os.environ.get("HYBRIDRAG_API_KEY", "")


def cmd_sync(args: argparse.Namespace) -> int:
    from retrieval.folders import FolderSync, ServerTarget, sync_retrying, watch

    if args.watch < 0 or args.retry_for < 0:
        raise ConfigError("--watch and --retry-for take a number of seconds >= 0")
    target = ServerTarget.connect(args.server, api_key(args), args.tls_ca or "", say=say,
                                  key_hint="set HYBRIDRAG_API_KEY or give --api-key-file")

    def show(result: Any) -> None:
        print_skipped(result.report)
        print(f"{args.folder}: {result.summary()} ({result.seconds:.1f} s)", flush=True)

    try:
        sync = FolderSync(args.folder, target, sync_options(args), say)
        if not args.watch:
            show(sync_retrying(sync, args.retry_for, say))
            return 0
        stop = threading.Event()  # SIGINT / SIGTERM end the watch between rounds (a write in flight finishes first)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        watch(sync, args.watch, stop, lambda r: show(r) if r.changed() else None, say)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        target.close()


def add_sync_parser(sub: Any, add_common) -> None:
    p = sub.add_parser("sync", help="bring a running server (serve --store) in step with a folder of files: upserts "
                                    "new and changed files, deletes removed ones it wrote (gRPC)")
    p.add_argument("folder")
    p.add_argument("--server", default="127.0.0.1:50051", help="the gRPC address of 'hybridrag serve --store'")
    p.add_argument("--api-key-file", metavar="FILE", help="read the API key from FILE (default: $HYBRIDRAG_API_KEY)")
    p.add_argument("--api-key", default="", help="the API key itself: visible in ps, prefer the two above")
    p.add_argument("--tls-ca", help="PEM file to trust for a TLS server")
    p.add_argument("--watch", type=float, default=0.0, metavar="SECONDS",
                   help="keep polling the folder every SECONDS and sync what changed; outlives server restarts "
                        "(Ctrl-C or SIGTERM stops it after the round in flight)")
    p.add_argument("--retry-for", type=float, default=60.0, metavar="SECONDS",
                   help="without --watch: how long to retry a server that does not answer")
    add_folder_args(p)
    add_ownership_args(p)
    add_common(p)
    p.set_defaults(func=cmd_sync)


def build_folder(args: argparse.Namespace) -> Any:
    """``build --corpus DIR``'s documents (:class:`retrieval.folders.FolderBuild`)."""
    from retrieval.folders import folder_build

    return folder_build(args.corpus, sync_options(args), Path(args.out), args.store, on_read=print_skipped, say=say)
