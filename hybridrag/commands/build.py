"""``build``, ``index tokens``, ``index rebuild`` and ``migrate``: snapshots written, rewritten and copied into an
engine."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from hybridrag.commands.common import config_from, thread_overrides


def cmd_build(args: argparse.Namespace) -> int:
    from hybridrag.commands.sync import build_folder
    from index_builder.build.builder import build_snapshot
    from index_builder.documents.corpus import CorpusReport, iter_corpus, read_corpus, resolve_corpus_path
    from index_builder.documents.folder import is_folder_corpus
    from index_builder.errors import CorpusError

    config = config_from(args, thread_overrides(args))
    t = time.perf_counter()
    seq = 0
    folder_summary: Any = None
    stream: Any  # a folder's documents, the store's list, or a corpus stream
    if is_folder_corpus(args.corpus):  # a folder of files: readers, and a summary of what changed since last time
        folder = build_folder(args)
        stream, seq, folder_summary, counted = folder.documents, folder.covered_seq, folder.summary, folder.total
        report = CorpusReport(path=str(args.corpus))
        print(f"reading the folder {args.corpus} ({counted} candidate files)", file=sys.stderr)
    elif args.store:  # the store becomes the source of truth; the snapshot records the sequence number it covers
        from retrieval.live.store import MAX_BATCH, DocumentStore

        docs, report = read_corpus(args.corpus, skip_bad=args.skip_bad)
        store = DocumentStore(args.store)
        for start in range(0, len(docs), MAX_BATCH):
            store.upsert(docs[start:start + MAX_BATCH])
        seq, docs = store.snapshot()
        store.close()
        stream = docs
    else:  # a stream: read as the build goes (a first pass counts the documents, for the progress bar's ETA)
        report = CorpusReport(path=str(resolve_corpus_path(args.corpus)))
        counted = sum(1 for _ in iter_corpus(args.corpus, skip_bad=args.skip_bad, report=report))
        if not counted:
            raise CorpusError("corpus has no valid documents", path=report.path)
        report = CorpusReport(path=report.path)
        stream = iter_corpus(args.corpus, skip_bad=args.skip_bad, report=report)
    if folder_summary is None:
        print(f"reading {report.path}" + (f": {len(stream)} documents" if args.store else f" ({counted} documents)"),
              file=sys.stderr)
    summary = build_snapshot(stream, Path(args.out), config.build_config(), progress=not args.quiet,
                             covered_seq=seq, total=len(stream) if isinstance(stream, list) else counted,
                             cluster=getattr(args, "ray", None))
    if folder_summary is not None:
        print(folder_summary())
    if report.skipped:
        print(f"skipped {report.skipped} bad line(s); first: {report.errors[0]}", file=sys.stderr)
    print(f"built in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    print(summary.line() + "; stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in summary.timings.items()))
    if config.backend.kind != "local":  # the snapshot is the build's product; the engine gets a copy of it
        return migrate(Path(args.out), config, replace=True, ray=getattr(args, "ray", None))
    return 0


def cmd_index_tokens(args: argparse.Namespace) -> int:
    from index_builder.build.builder import rebuild_token_vectors
    from index_builder.models.encoders import Embedder
    from index_builder.models.token_encoders import make_token_encoder

    config = config_from(args, thread_overrides(args))
    tc = config.late_interaction
    encoder = None if args.convert_only else make_token_encoder(tc, Embedder(config.embedder))
    summary = rebuild_token_vectors(Path(args.index), encoder, tc.storage, out=Path(args.out) if args.out else None,
                                    keep_snapshots=config.build.keep_snapshots, progress=not args.quiet)
    print(summary.line() + "; stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in summary.timings.items()))
    return 0


def cmd_index_rebuild(args: argparse.Namespace) -> int:
    from index_builder.build.builder import build_snapshot
    from retrieval.live.store import DocumentStore

    config = config_from(args, thread_overrides(args))
    store = DocumentStore(args.store)
    seq, docs = store.snapshot()
    store.close()
    if not docs:
        print(f"hybridrag index rebuild: the store {args.store} holds no documents", file=sys.stderr)
        return 2
    summary = build_snapshot(docs, Path(args.index), config.build_config(), progress=not args.quiet, covered_seq=seq)
    print(summary.line() + f"; covers sequence {seq}")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    config = config_from(args)
    if config.backend.kind == "local":
        print("hybridrag migrate: the configuration's [backend] kind is 'local'; set kind = \"qdrant\" and its "
              "location", file=sys.stderr)
        return 2
    return migrate(Path(args.index), config, replace=args.replace)


def migrate(index_dir: Path, config, *, replace: bool, ray: str | None = None) -> int:
    from index_builder.models.encoders import Embedder
    from index_builder.snapshot.format import load_snapshot
    from index_builder.snapshot.manifest import expected_settings
    from retrieval.engines.qdrant.engine import QdrantEngine

    if config.backend.location == ":memory:":
        print("hybridrag: [backend] location ':memory:' lives only inside one process; give a folder or a URL "
              "(serve/eval/search migrate a --index snapshot into memory themselves)", file=sys.stderr)
        return 2
    snap = load_snapshot(index_dir, expected=expected_settings(config.build_config(), Embedder(config.embedder)),
                         checksums=config.index.verify_checksums)
    if ray and config.backend.remote:  # upserts from Ray tasks in parallel, none through this process
        from retrieval.engines.qdrant.ray_upload import migrate_on_ray

        info = migrate_on_ray(index_dir, config.backend, ray, replace=replace)
        print(f"{info['tasks']} Ray tasks wrote the collection in parallel", file=sys.stderr)
    else:
        if ray:
            print(f"hybridrag: {config.backend.location} is an engine folder (one process's): the build writes it "
                  "alone; give an engine URL for parallel upserts from the cluster", file=sys.stderr)
        engine = QdrantEngine(config.backend)
        try:
            info = engine.migrate(snap, replace=replace, progress=True)
        finally:
            engine.close()
    print(f"migrated {info['documents']} documents / {info['chunks']} chunks (generation {info['generation']}, "
          f"token vectors: {info['token_vectors']}) into {config.backend.describe()} in {info['seconds']} s "
          "(vectors reused, nothing re-embedded)")
    return 0
