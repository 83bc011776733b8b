"""``hybridrag`` command line: build, eval, search, serve, query, ask, quickstart, bench NAME.

The edge of the program: only here are arguments parsed, config files and the environment read, and logging set.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hybridrag.folder_sync import cmd_sync
from index_builder.documents.folder import DEFAULT_MAX_FILE_MB
from index_builder.errors import HybridRagError

log = logging.getLogger("hybridrag")

SAMPLE_DIR = Path(__file__).resolve().parent.parent / "data" / "sample"


def _config(args: argparse.Namespace, overrides: dict[str, Any] | None = None):
    from retrieval.config import load_config

    return load_config(getattr(args, "config", None), overrides=overrides)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML configuration file (see README: Configuration)")
    p.add_argument("--threads", type=int, default=0,
                   help="ONNX Runtime intra-op threads and faiss OpenMP threads (0 = library default)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def _add_folder_args(p: argparse.ArgumentParser) -> None:
    """The folder's and the ownership flags of ``build --corpus DIR`` and ``sync DIR`` (:mod:`hybridrag.folder_sync`)."""
    g = p.add_argument_group("a folder of files (--corpus DIR without corpus.jsonl)")
    g.add_argument("--include", action="append", default=[], metavar="GLOB",
                   help="read only files matching (relative path, or file name for a pattern without '/'); repeatable")
    g.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="skip files matching; repeatable")
    g.add_argument("--tenant", default="", help="every document's tenant")
    g.add_argument("--tenant-from-folder", action="store_true", help="the first folder of a file's path is its tenant")
    g.add_argument("--tenant-map", metavar="FILE", help="JSON or TOML: {glob: tenant}, the first match wins")
    g.add_argument("--max-file-mb", type=float, default=DEFAULT_MAX_FILE_MB, help="skip larger files")
    g.add_argument("--source", default="", help="the name recorded on every document (default: the folder's name); "
                                                 "a sync deletes only documents it wrote")
    g.add_argument("--strict", action="store_true", help="fail on the first file that cannot be read")
    g.add_argument("--follow-links-outside", action="store_true", help="read symbolic links whose target is outside "
                   "the folder (default: skipped with the reason; a link such as docs/users.txt -> /etc/passwd would "
                   "put that file in the index, served to every caller the index serves)")
    g = p.add_argument_group("who owns what (sync, build --store)")
    g.add_argument("--state-dir", help="where each source's secret and folder are kept (default: "
                                       "$XDG_STATE_HOME/hybridrag/sync or ~/.local/state/hybridrag/sync)")
    g.add_argument("--adopt", action="store_true", help="take over this source's documents at this folder's ids "
                   "(state lost or on another machine, or written before marks existed); deletes none")
    g.add_argument("--id-prefix", default="", help="prepended to every id (two folders holding the same paths)")


def _add_sync_parser(sub: Any) -> None:
    p = sub.add_parser("sync", help="bring a running server (serve --store) in step with a folder of files: upserts "
                                    "new and changed files, deletes removed ones it wrote (gRPC)")
    p.add_argument("folder")
    p.add_argument("--server", default="127.0.0.1:50051", help="the gRPC address of 'hybridrag serve --store'")
    p.add_argument("--api-key-file", metavar="FILE", help="read the API key from FILE (default: $HYBRIDRAG_API_KEY)")
    p.add_argument("--api-key", default="", help="the API key itself: visible in ps, prefer the two above")
    p.add_argument("--tls-ca", help="PEM file to trust for a TLS server")
    p.add_argument("--watch", type=float, default=0.0, metavar="SECONDS", help="keep polling the folder every SECONDS "
                   "and sync what changed; outlives server restarts (Ctrl-C or SIGTERM stops it after the round in flight)")
    p.add_argument("--retry-for", type=float, default=60.0, metavar="SECONDS",
                   help="without --watch: how long to retry a server that does not answer")
    _add_folder_args(p)
    _add_common(p)
    p.set_defaults(func=cmd_sync)


def _thread_overrides(args: argparse.Namespace) -> dict[str, Any]:
    if not args.threads:
        return {}
    import faiss

    faiss.omp_set_num_threads(args.threads)
    rt = {"runtime": {"intra_op_threads": args.threads}}
    return {"embedder": rt, "late_interaction": rt, "cross_encoder": rt}


def cmd_build(args: argparse.Namespace) -> int:
    from hybridrag.folder_sync import build_folder
    from index_builder.build.builder import build_snapshot
    from index_builder.documents.corpus import CorpusReport, iter_corpus, read_corpus, resolve_corpus_path
    from index_builder.documents.folder import is_folder_corpus
    from index_builder.errors import CorpusError

    config = _config(args, _thread_overrides(args))
    t = time.perf_counter()
    seq = 0
    folder_summary: Any = None
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
        stream: Any = docs
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
        return _migrate(Path(args.out), config, replace=True, ray=getattr(args, "ray", None))
    return 0


def cmd_index_tokens(args: argparse.Namespace) -> int:
    from index_builder.build.builder import rebuild_token_vectors
    from index_builder.models.encoders import Embedder
    from index_builder.models.token_encoders import make_token_encoder

    config = _config(args, _thread_overrides(args))
    tc = config.late_interaction
    encoder = None if args.convert_only else make_token_encoder(tc, Embedder(config.embedder))
    summary = rebuild_token_vectors(Path(args.index), encoder, tc.storage, out=Path(args.out) if args.out else None,
                                    keep_snapshots=config.build.keep_snapshots, progress=not args.quiet)
    print(summary.line() + "; stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in summary.timings.items()))
    return 0


def cmd_index_rebuild(args: argparse.Namespace) -> int:
    from index_builder.build.builder import build_snapshot
    from retrieval.live.store import DocumentStore

    config = _config(args, _thread_overrides(args))
    store = DocumentStore(args.store)
    seq, docs = store.snapshot()
    store.close()
    if not docs:
        print(f"hybridrag index rebuild: the store {args.store} holds no documents", file=sys.stderr)
        return 2
    summary = build_snapshot(docs, Path(args.index), config.build_config(), progress=not args.quiet, covered_seq=seq)
    print(summary.line() + f"; covers sequence {seq}")
    return 0


def _open_pipeline(index_dir: Path | None, config):
    from retrieval.app import open_pipeline

    return open_pipeline(index_dir, config)


def cmd_migrate(args: argparse.Namespace) -> int:
    config = _config(args)
    if config.backend.kind == "local":
        print("hybridrag migrate: the configuration's [backend] kind is 'local'; set kind = \"qdrant\" and its "
              "location", file=sys.stderr)
        return 2
    return _migrate(Path(args.index), config, replace=args.replace)


def _migrate(index_dir: Path, config, *, replace: bool, ray: str | None = None) -> int:
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


def cmd_search(args: argparse.Namespace) -> int:
    from retrieval.search.filters import Filter

    config = _config(args, _thread_overrides(args))
    pipeline = _open_pipeline(Path(args.index), config)
    meta = dict(kv.split("=", 1) for kv in args.filter)
    for query in args.query:
        res = pipeline.search(query, args.k, filter=Filter.of(args.tenant, meta),
                              stages=args.stages.split(",") if args.stages else None)
        if args.json:
            print(json.dumps(_result_json(pipeline, query, res)))
            continue
        timings = ", ".join(f"{k} {v:.1f}" for k, v in res.timings_ms.items())
        print(f"\n{query}\n  ({timings} ms{'; degraded: ' + str(res.skipped) if res.degraded else ''})")
        for rank, (d, s, c) in enumerate(zip(res.hits.doc, res.hits.scores, res.hits.chunk, strict=False), 1):
            doc = pipeline.index.documents[d]
            text = " ".join(pipeline.index.passage(int(c)).split())
            print(f"  {rank:2d}. {doc.id:<14} {s:.4f}  {doc.title[:40]!r}: {text[:90]}...")
    pipeline.close()
    return 0


def _result_json(pipeline, query: str, res) -> dict[str, Any]:
    idx = pipeline.index
    return {"query": query, "generation": res.generation, "degraded": res.degraded, "skipped": res.skipped,
            "timings_ms": {k: round(v, 3) for k, v in res.timings_ms.items()},
            "hits": [{"id": idx.documents[d].id, "score": float(s), "chunk": int(c),
                      "title": idx.documents[d].title, "text": idx.passage(int(c))}
                     for d, s, c in zip(res.hits.doc, res.hits.scores, res.hits.chunk, strict=False)]}


def cmd_eval(args: argparse.Namespace) -> int:
    from retrieval.evaluate import RERANK_VARIANTS, failures, hnsw_recall, judged_queries, run_stages, summarize, write_trec

    config = _config(args, _thread_overrides(args))
    dataset = Path(args.dataset)
    queries, qrels = judged_queries(dataset, args.split, args.limit)
    tmp = None
    index_dir = Path(args.index) if args.index else None
    if index_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="hybridrag-eval-")
        index_dir = Path(tmp.name)
    build_info = None
    if not (index_dir / "CURRENT").exists():
        from index_builder.build.builder import build_snapshot
        from index_builder.documents.corpus import read_corpus

        docs, _ = read_corpus(dataset)
        summary = build_snapshot(docs, index_dir, config.build_config(), progress=not args.quiet)
        print(summary.line(), file=sys.stderr)
        build_info = {"seconds": round(summary.seconds, 1), "chunks": summary.chunks,
                      "bytes": summary.bytes_on_disk, "timings": {k: round(v, 1) for k, v in summary.timings.items()}}
    pipeline = _open_pipeline(index_dir, config)
    # warm-up: first calls pay for lazy initialisation
    for text in list(queries.values())[:5]:
        try:
            pipeline.search(text, 10)
        except Exception:  # noqa: BLE001 -- the evaluation itself reports refused queries
            pass
    rerank = tuple(args.rerank.split(",")) if args.rerank else RERANK_VARIANTS
    stages = run_stages(pipeline, queries, depth=100, rerank=rerank)
    summary_stages = summarize(stages, qrels)
    out: dict[str, Any] = {"dataset": dataset.name, "split": args.split, "queries": len(queries),
                           "stages": summary_stages, "index": str(index_dir), "generation": pipeline.index.generation,
                           "embedder": pipeline.embedder.describe(), "threads": args.threads or "default",
                           "config": {"fusion": vars(config.fusion), "dense": vars(config.dense),
                                      "chunking": vars(config.chunking), "analyzer": vars(config.analyzer),
                                      "bm25": vars(config.bm25), "hnsw": vars(config.hnsw),
                                      "rerank": vars(config.rerank)},
                           "token_vectors": pipeline.index.token_encoder,
                           "cross_encoder": pipeline.cross_encoder.describe() if pipeline.cross_encoder else None}
    failed = failures(stages)
    out["failed_queries"] = failed
    if "dense" in stages:
        out["hnsw_recall@100"] = hnsw_recall(stages["dense"].hits, stages["dense_exact"].hits)
    if build_info:
        out["build"] = build_info
    print(f"{dataset.name} ({args.split}, {len(queries)} queries)")
    print(f"{'stage':<17} {'nDCG@10':>8} {'R@100':>7} {'QPS':>8} {'p50 ms':>7} {'p99 ms':>7} {'failed':>6}")
    for name, m in summary_stages.items():
        print(f"{name:<17} {m['ndcg@10']:>8.4f} {m['recall@100']:>7.4f} {m['qps']:>8.1f} {m['p50_ms']:>7.2f} "
              f"{m['p99_ms']:>7.2f} {m['failed']:>6}")
    if "hnsw_recall@100" in out:
        print(f"HNSW recall@100 vs exact: {out['hnsw_recall@100']:.4f} (ef_search={config.dense.ef_search})")
    if failed:
        first_id, first = next(iter(failed.items()))
        print(f"{len(failed)} of {len(queries)} queries failed in some stage (counted as 0; listed under "
              f"failed_queries in --json); first: {first_id}: {next(iter(first.values()))}")
    if args.run_dir:
        run_dir = Path(args.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        for name, st in stages.items():
            write_trec(run_dir / f"{name}.trec", st.run, f"hybridrag-{name}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    pipeline.close()
    if tmp is not None:
        tmp.cleanup()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio

    from retrieval.app import serve
    from retrieval.processes import serve_processes
    from retrieval.serving.auth import load_api_keys

    overrides = _thread_overrides(args)
    if args.port is not None:
        overrides["server"] = {"port": args.port}
    if args.host:
        overrides.setdefault("server", {})["host"] = args.host
    if args.processes is not None:
        overrides.setdefault("server", {})["processes"] = args.processes
    if args.metrics_port is not None:
        overrides["metrics"] = {"port": args.metrics_port}
    if args.http_port is not None:
        overrides["http"] = {"port": args.http_port}
    if args.host:
        overrides.setdefault("http", {})["host"] = args.host
    config = _config(args, overrides)
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    if args.log_json:
        from retrieval.observability.logs import JsonLogFormatter

        for handler in root.handlers:
            handler.setFormatter(JsonLogFormatter())
    keys = load_api_keys(config.server.api_keys_file, os.environ.get("HYBRIDRAG_API_KEYS", ""))
    if not args.index and config.backend.kind == "local":
        print("hybridrag serve: give --index DIR (or configure an engine backend: [backend] kind = \"qdrant\")",
              file=sys.stderr)
        return 2
    index, store = Path(args.index) if args.index else None, Path(args.store) if args.store else None
    if config.server.processes > 1:  # a supervisor over N processes on one port (retrieval/processes.py)
        return serve_processes(index, config, keys, store, log_json=args.log_json)
    asyncio.run(serve(index, config, keys, store))
    return 0


def cmd_front(args: argparse.Namespace) -> int:
    import signal
    import tempfile

    from retrieval.serving.front import FrontError, render, start_front

    front: dict[str, Any] = {}
    for flag, key in (("grpc_backend", "grpc_backends"), ("http_backend", "http_backends")):
        if getattr(args, flag):
            front[key] = getattr(args, flag)
    for key in ("host", "port", "http_port", "max_in_flight"):
        if getattr(args, key) is not None:
            front[key] = getattr(args, key)
    try:
        config = _config(args, {"front": front} if front else None).front
    except ValueError as e:  # ConfigError is one
        print(f"hybridrag front: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="hybridrag-front-") as tmp:
        if args.print_config:
            print(render(config, Path(tmp)), end="")
            return 0
        try:
            proc = start_front(config, Path(tmp))
        except FrontError as e:
            print(f"hybridrag front: {e}", file=sys.stderr)
            return 2
        doors = f"gRPC on {config.host}:{config.port}" + (
            f", HTTP on {config.host}:{config.http_port}" if config.http_port != -1 else "")
        print(f"hybridrag front (nginx, pid {proc.pid}): {doors}; {config.max_in_flight} reads and "
              f"{config.max_writes_in_flight} writes in flight, over {', '.join(config.grpc_backends)}",
              file=sys.stderr, flush=True)
        stopping: list[int] = []

        def stop(signum: int, _frame: Any) -> None:  # only signals here: the main thread is inside proc.wait()
            stopping.append(signum)
            if proc.poll() is None:  # the first: nginx's graceful stop (calls in flight finish); a second: at once
                proc.send_signal(signal.SIGQUIT if len(stopping) == 1 else signal.SIGTERM)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        code = proc.wait()
        if proc.stderr is not None and not stopping:
            sys.stderr.write(proc.stderr.read())
        return 0 if stopping else (code or 1)


def cmd_engine(args: argparse.Namespace) -> int:
    from retrieval.engines.qdrant.host import HostLimits, serve_host

    logging.getLogger().setLevel(logging.INFO)
    try:
        limits = HostLimits(header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
                            max_connections=args.max_connections, max_body_mb=args.max_body_mb,
                            allowed_hosts=tuple(args.allowed_host))
        serve_host(args.location, args.host, args.port, limits)
    except ValueError as e:
        print(f"hybridrag engine: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    import grpc

    from retrieval.client import ClientOptions, RetrieverClient

    opts = ClientOptions(api_key=os.environ.get("HYBRIDRAG_API_KEY", ""), tls_ca=args.tls_ca or "", timeout=args.timeout)
    meta = dict(kv.split("=", 1) for kv in args.filter)
    with RetrieverClient(args.target, opts) as client:
        for query in args.query:
            try:
                r = client.retrieve(query, args.top_k, tenant=args.tenant, filters=meta,
                                    stages=args.stages.split(",") if args.stages else None)
            except grpc.RpcError as e:
                print(f"hybridrag query: {e.code().name}: {e.details()}", file=sys.stderr)
                return 1
            if args.json:
                from google.protobuf.json_format import MessageToDict

                print(json.dumps(MessageToDict(r, preserving_proto_field_name=True)))
                continue
            timings = ", ".join(f"{k} {v:.1f}" for k, v in r.timings_ms.items())
            flag = "; degraded: " + "; ".join(f"{s.stage}: {s.reason}" for s in r.skipped) if r.degraded else ""
            print(f"\n{query}\n  (generation {r.index_generation}, {timings} ms{flag})")
            for rank, p in enumerate(r.passages, 1):
                text = " ".join(p.text.split())
                print(f"  {rank:2d}. {p.doc_id:<14} {p.score:.4f}  {p.title[:40]!r}: {text[:90]}...")
    return 0


def cmd_ask(args: argparse.Namespace) -> int:
    """Generate: print the sources at once, then the answer as it streams, then the stats."""
    import grpc

    from retrieval.client import ClientOptions, RetrieverClient

    opts = ClientOptions(api_key=os.environ.get("HYBRIDRAG_API_KEY", ""), tls_ca=args.tls_ca or "", timeout=args.timeout)
    meta = dict(kv.split("=", 1) for kv in args.filter)
    with RetrieverClient(args.target, opts) as client:
        try:
            for msg in client.generate(args.question, args.top_k, max_tokens=args.max_tokens, tenant=args.tenant,
                                       filters=meta, bypass_cache=args.no_cache, timeout=args.timeout):
                kind = msg.WhichOneof("event")
                if kind == "passages":
                    hit = " (semantic cache)" if msg.passages.cache_hit else ""
                    print(f"sources{hit}:")
                    for rank, p in enumerate(msg.passages.passages, 1):
                        print(f"  [{rank}] {p.doc_id}  {p.title[:70]}")
                    print()
                elif kind == "token":
                    print(msg.token, end="", flush=True)
                else:
                    s = msg.stats
                    print(f"\n\n({s.model}{', cached answer' if s.cache_hit else ''}: retrieval {s.retrieval_ms:.0f} ms, "
                          f"first token {s.time_to_first_token_ms:.0f} ms, generation {s.generation_ms:.0f} ms, "
                          f"{s.tokens_in} tokens in, {s.tokens_out} out, finish {s.finish_reason or '-'})")
        except grpc.RpcError as e:
            print(f"\nhybridrag ask: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    return 0


CHECKOUT_ONLY = ("the wheel ships the service (index_builder, rerank, retrieval, hybridrag); bench/ and training/ "
                 "live in the repository: clone it and run 'bash scripts/setup.sh --bench' there (pip install -e "
                 "'.[bench]')")


def _checkout_only(name: str, what: str) -> Callable[[Any], None]:
    """The subcommand ``name`` where its package (``bench``, ``training``) is not installed (a wheel, not the
    checkout's editable install): it takes any arguments and says, in one line, what to install."""

    def add(sub: Any) -> None:
        p = sub.add_parser(name, add_help=False, help=f"{what} (needs the repository checkout)")
        p.set_defaults(func=cmd_checkout_only, verbose=False, bench_args=[])

    return add


def cmd_checkout_only(args: argparse.Namespace) -> int:
    print(f"hybridrag {args.command}: needs the repository checkout: {CHECKOUT_ONLY}", file=sys.stderr)
    return 2


def checkout_module(name: str) -> Any:
    """``bench`` or ``training`` (the repository's, never in the wheel), imported; None outside a checkout. An
    editable install maps only the product's packages, so when the import fails the checkout is looked for where
    this package lives: its root holds them (as the reader processes and the Ray runtime find it)."""
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:  # it is there, and something it imports is missing: say so as it is
            raise
    root = Path(__file__).resolve().parent.parent
    if not (root / name / "__init__.py").is_file():
        return None
    sys.path.append(str(root))
    return importlib.import_module(name)


def cmd_bench(args: argparse.Namespace) -> int:
    """A benchmark or tuning study (``bench.SCRIPTS``): its own options follow ``bench NAME``."""
    import importlib

    from bench import SCRIPTS

    module = importlib.import_module(SCRIPTS[args.bench_command][0])
    if args.bench_command == "load":
        return module.main(args.bench_args, prog="hybridrag bench load")
    return module.main(args.bench_args)


def cmd_quickstart(args: argparse.Namespace) -> int:
    """Build the bundled sample corpus's index, answer a few of its queries, then generate one answer with the
    embedded llama.cpp server (when it is installed)."""
    out = Path(args.out)
    build = argparse.Namespace(config=args.config, threads=args.threads, corpus=str(SAMPLE_DIR / "corpus.jsonl"),
                               out=str(out), skip_bad=False, quiet=True, verbose=args.verbose, store=None)
    cmd_build(build)
    from retrieval.evaluate import load_queries

    queries = list(load_queries(SAMPLE_DIR).values())[:3]
    search = argparse.Namespace(config=args.config, threads=args.threads, index=str(out), query=queries, k=3,
                                tenant="", filter=[], stages="", json=False, verbose=args.verbose)
    status = cmd_search(search)
    if status == 0 and not args.no_generate:
        status = _quickstart_answer(out, _config(args), queries[0])
    return status


def _quickstart_answer(index_dir: Path, config, question: str) -> int:
    import asyncio

    from index_builder.errors import HybridRagError
    from retrieval.generation.generator import Passages, Stats, Token, open_generator

    pipeline = _open_pipeline(index_dir, config)
    try:
        setup = open_generator(pipeline, config.generation, pipeline.cache)
    except HybridRagError as e:
        print(f"\n(no answer generated: {e})")
        pipeline.close()
        return 0

    async def main() -> None:
        try:
            print(f"\nGenerate: {question}  [{setup.describe()}]")
            async for event in setup.generator.generate(question, k=3, max_tokens=64):
                if isinstance(event, Passages):
                    print("  sources: " + ", ".join(event.result.doc_ids()))
                    print("  ", end="")
                elif isinstance(event, Token):
                    print(event.text, end="", flush=True)
                elif isinstance(event, Stats):
                    print(f"\n  ({event.model}: first token {event.time_to_first_token_ms:.0f} ms, "
                          f"{event.tokens_out} tokens in {event.generation_ms:.0f} ms)")
        finally:
            await setup.aclose()

    try:
        asyncio.run(main())
    finally:
        pipeline.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridrag", description="Hybrid BM25 + dense retrieval service")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="build an index snapshot from a corpus: a folder of files (markdown, "
                                     "reStructuredText, HTML, text, PDF), a BEIR dataset folder or a JSONL file")
    p.add_argument("--corpus", required=True, help="a folder of files, a BEIR dataset folder (corpus.jsonl), or a "
                                                   "JSONL corpus file")
    p.add_argument("--out", required=True, help="index root folder (snapshots/ and CURRENT are written there)")
    p.add_argument("--skip-bad", action="store_true", help="skip malformed lines and report how many")
    p.add_argument("--store", help="also write the documents to this document store (SQLite) and build from it, "
                                   "for a server that accepts writes (serve --store)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="encode on a Ray cluster ('local' starts one here, 'auto' joins the one this machine runs, "
                        "or HOST:PORT): chunking in tasks, encoder actors writing the checkpoint segments "
                        "([build.ray]; needs the ray extra)")
    _add_folder_args(p)
    _add_common(p)
    p.set_defaults(func=cmd_build)
    _add_sync_parser(sub)

    p = sub.add_parser("search", help="answer queries from an index")
    p.add_argument("--index", required=True)
    p.add_argument("query", nargs="+")
    p.add_argument("-k", type=int, default=5)
    p.add_argument("--tenant", default="")
    p.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE", help="metadata equality filter")
    p.add_argument("--stages", default="",
                   help="comma-separated subset of bm25,dense,late_interaction,cross_encoder (default: as configured)")
    p.add_argument("--json", action="store_true", help="one JSON object per query")
    _add_common(p)
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("eval", help="BEIR evaluation: nDCG@10, Recall@100, HNSW recall, QPS per stage")
    p.add_argument("--dataset", required=True, help="BEIR dataset folder (corpus, queries.jsonl, qrels/)")
    p.add_argument("--index", help="index root; built there if it has no CURRENT (default: a temporary folder)")
    p.add_argument("--split", default="test")
    p.add_argument("--json", help="write the figures as JSON here")
    p.add_argument("--run-dir", help="write one TREC run file per stage here")
    p.add_argument("--limit", type=int, default=0, help="only the first N queries")
    p.add_argument("--rerank", default="", help="comma-separated subset of late_interaction,cross_encoder,cascade "
                                                "to evaluate (default: every one the index and config allow)")
    p.add_argument("--quiet", action="store_true")
    _add_common(p)
    p.set_defaults(func=cmd_eval)

    from index_builder.models.export import add_parser as add_models_parser

    add_models_parser(sub)

    if checkout_module("training") is None:
        _checkout_only("train", "train the cross-encoder or late-interaction model")(sub)
    else:
        from training.cli import add_parser as add_train_parser  # it imports torch only when the command runs

        add_train_parser(sub)

    p = sub.add_parser("serve", help="serve an index over gRPC (hybridrag.v1.Retriever, health, reflection) and, "
                                     "with --http-port, over HTTP (REST + SSE, OpenAI-compatible, playground)")
    p.add_argument("--index", help="index root (CURRENT -> snapshot); with [backend] kind = \"qdrant\" the "
                   "collection is served (a location ':memory:' migrates this snapshot into it first)")
    p.add_argument("--port", type=int, help="listen port (default: [server] port, 50051; 0 = any free port)")
    p.add_argument("--host", help="listen address of both doors (default: [server] / [http] host, 127.0.0.1)")
    p.add_argument("--http-port", type=int, help="the HTTP door's port (default: [http] port, -1 = off; 0 = any free "
                   "port, logged)")
    p.add_argument("--metrics-port", type=int, help="Prometheus /metrics port (default: [metrics] port, 9464; "
                   "0 = any free port, -1 = off)")
    p.add_argument("--processes", type=int, help="server processes on one port over the same memory-mapped snapshot "
                   "(SO_REUSEPORT; default: [server] processes, 1); a read-only snapshot or an engine backend")
    p.add_argument("--log-json", action="store_true", help="structured logs: one JSON object per line")
    p.add_argument("--store", help="document store (SQLite) for Upsert/Delete; writes after the snapshot are replayed")
    _add_common(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("migrate", help="copy a built snapshot into the configured engine backend ([backend] kind = "
                                       "\"qdrant\"), reusing its vectors")
    p.add_argument("--index", required=True, help="index root (CURRENT -> snapshot)")
    p.add_argument("--replace", action="store_true", help="overwrite an existing collection of that name")
    _add_common(p)
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("front", help="nginx before the replicas: refuses what is past the in-flight limits in native "
                                     "code (RESOURCE_EXHAUSTED / 429 within milliseconds under a burst); [front]")
    p.add_argument("--grpc-backend", action="append", metavar="HOST:PORT",
                   help="a replica's gRPC door (repeat for several; default: [front] grpc_backends, 127.0.0.1:50051)")
    p.add_argument("--http-backend", action="append", metavar="HOST:PORT", help="a replica's HTTP door (repeat)")
    p.add_argument("--host", help="listen address (default: [front] host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="the front's gRPC port (default: [front] port, 50050)")
    p.add_argument("--http-port", type=int, help="the front's HTTP port (default: [front] http_port, -1 = off)")
    p.add_argument("--max-in-flight", type=int, help="reads in flight through the front, all replicas together "
                   "(default: [front] max_in_flight, 64 = one server's default)")
    p.add_argument("--print-config", action="store_true", help="print the nginx configuration and exit")
    _add_common(p)
    p.set_defaults(func=cmd_front)

    p = sub.add_parser("engine", help="a development Qdrant host: Qdrant's local engine over its REST API, so "
                                      "several replicas can share one engine where no Qdrant server is installed "
                                      "(no authentication: keep it on loopback)")
    p.add_argument("--location", required=True, help="folder for the engine's data (':memory:' = none)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback; any other warns: "
                   "anyone who reaches the port reads and writes every collection)")
    p.add_argument("--port", type=int, default=6333, help="port (0 = any free one, printed)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a name the Host header may carry besides IP addresses and localhost (repeatable; "
                        "'*' = any, which gives up the DNS-rebinding check)")
    p.add_argument("--max-connections", type=int, default=256,
                   help="connections and requests at once; a request past it is answered 503 (default 256)")
    p.add_argument("--max-body-mb", type=int, default=64, help="largest request body (default 64 MiB; 413 past it)")
    p.add_argument("--header-timeout-s", type=float, default=10.0,
                   help="a connection's request line and headers must arrive within this (default 10 s)")
    p.add_argument("--body-timeout-s", type=float, default=10.0,
                   help="a body must keep arriving at 1 KiB/s on average, checked after this (default 10 s)")
    _add_common(p)
    p.set_defaults(func=cmd_engine)

    p = sub.add_parser("query", help="ask a running server (API key from HYBRIDRAG_API_KEY)")
    p.add_argument("--target", default="127.0.0.1:50051", help="HOST:PORT")
    p.add_argument("query", nargs="+")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--tenant", default="")
    p.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--stages", default="")
    p.add_argument("--tls-ca", help="PEM file to trust (TLS); default plaintext")
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--json", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("ask", help="ask a running server for an answer (Generate: sources, streamed answer, stats)")
    p.add_argument("--target", default="127.0.0.1:50051", help="HOST:PORT")
    p.add_argument("question")
    p.add_argument("--top-k", type=int, default=0, help="context passages (0 = the server's default)")
    p.add_argument("--max-tokens", type=int, default=0, help="answer length (0 = the server's default)")
    p.add_argument("--tenant", default="")
    p.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--no-cache", action="store_true", help="bypass the semantic cache")
    p.add_argument("--tls-ca", help="PEM file to trust (TLS); default plaintext")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("index", help="maintain an index")
    isub = p.add_subparsers(dest="index_command", required=True)
    q = isub.add_parser("tokens", help="recompute the late-interaction token vectors of the current snapshot with the "
                                       "configured [late_interaction] model and storage (the dense side is kept)")
    q.add_argument("--index", required=True, help="index root")
    q.add_argument("--out", help="write the new snapshot under this root instead (default: --index)")
    q.add_argument("--convert-only", action="store_true",
                   help="no model: re-store the snapshot's own token vectors in the configured storage (float16 or "
                        "int8 to any storage, e.g. the compact pool3+bins; a compact store cannot be converted)")
    q.add_argument("--quiet", action="store_true")
    _add_common(q)
    q.set_defaults(func=cmd_index_tokens)
    r = isub.add_parser("rebuild", help="build a new snapshot from the document store (a running server also "
                                        "rebuilds by itself, or on the Rebuild call)")
    r.add_argument("--index", required=True, help="index root")
    r.add_argument("--store", required=True, help="document store (SQLite)")
    r.add_argument("--quiet", action="store_true")
    _add_common(r)
    r.set_defaults(func=cmd_index_rebuild)

    if checkout_module("bench") is None:
        _checkout_only("bench", "benchmarks and tuning studies")(sub)
    else:
        from bench import SCRIPTS

        p = sub.add_parser("bench", help="benchmarks and tuning studies (from the repository checkout; bench/README.md)")
        bsub = p.add_subparsers(dest="bench_command", required=True)
        for name, (module, what) in SCRIPTS.items():  # each parses its own options: hybridrag bench NAME --help
            q = bsub.add_parser(name, add_help=False, help=f"{what} (python -m {module})")
            q.set_defaults(func=cmd_bench, verbose=False, bench_args=[])

    p = sub.add_parser("quickstart", help="build the sample corpus index, answer sample queries, generate an answer")
    p.add_argument("--out", default="indexes/sample")
    p.add_argument("--no-generate", action="store_true", help="skip the generated answer (embedded llama.cpp)")
    _add_common(p)
    p.set_defaults(func=cmd_quickstart)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not hasattr(args, "bench_args"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if hasattr(args, "bench_args"):  # a benchmark parses its own options
        args.bench_args = extra
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import bm25s  # noqa: F401  (it sets its own logger to DEBUG when imported: import first, then quieten)

    logging.getLogger("bm25s").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return args.func(args)
    except HybridRagError as e:
        print(f"hybridrag {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
