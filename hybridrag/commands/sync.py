"""``hybridrag sync DIR`` and ``hybridrag build --corpus DIR``'s folder: parsed arguments in, lines out (the flags are
declared in :mod:`hybridrag.cli`). The flow itself (reading, who owns a document, tenants, batches, retries, the
watch) is :mod:`retrieval.folders`."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from index_builder.documents.folder import FolderOptions, FolderReport, load_tenant_map
from index_builder.errors import ConfigError, CorpusError


def sync_options(args: argparse.Namespace) -> Any:
    from retrieval.folders import SyncOptions

    try:
        folder = FolderOptions(include=tuple(args.include), exclude=tuple(args.exclude), tenant=args.tenant,
                               tenant_from_folder=args.tenant_from_folder,
                               tenant_map=load_tenant_map(args.tenant_map) if args.tenant_map else (),
                               max_file_mb=args.max_file_mb, source=args.source, strict=args.strict,
                               follow_links_outside=args.follow_links_outside)
    except ValueError as e:
        raise CorpusError(str(e), path=str(args.tenant_map or "")) from None
    state = args.state_dir or Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local/state") / "hybridrag/sync"
    return SyncOptions(Path(state), folder, id_prefix=args.id_prefix, adopt=args.adopt)


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


def build_folder(args: argparse.Namespace) -> Any:
    """``build --corpus DIR``'s documents (:class:`retrieval.folders.FolderBuild`)."""
    from retrieval.folders import folder_build

    return folder_build(args.corpus, sync_options(args), Path(args.out), args.store, on_read=print_skipped, say=say)
