"""The ``hybridrag`` command line's arguments: one function per subcommand, each naming the ``cmd_*`` of
:mod:`hybridrag.commands` that runs it."""

from __future__ import annotations

import argparse
from typing import Any

from hybridrag.commands.build import cmd_build, cmd_index_rebuild, cmd_index_tokens, cmd_migrate
from hybridrag.commands.checkout import checkout_module, checkout_only, cmd_bench
from hybridrag.commands.quickstart import cmd_quickstart
from hybridrag.commands.remote import cmd_ask, cmd_query
from hybridrag.commands.search import cmd_eval, cmd_search
from hybridrag.commands.serve import cmd_engine, cmd_front, cmd_serve
from hybridrag.commands.sync import cmd_sync
from index_builder.documents.folder import DEFAULT_MAX_FILE_MB


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML configuration file (see README: Configuration)")
    p.add_argument("--threads", type=int, default=0,
                   help="ONNX Runtime intra-op threads and faiss OpenMP threads (0 = library default)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def add_folder_args(p: argparse.ArgumentParser) -> None:
    """The folder's and the ownership flags of ``build --corpus DIR`` and ``sync DIR`` (:mod:`hybridrag.commands.sync`)."""
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


def add_sync(sub: Any) -> None:
    """``sync DIR``: a running server brought in step with a folder."""
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
    add_folder_args(p)
    add_common(p)
    p.set_defaults(func=cmd_sync)


def add_build(sub: Any) -> None:
    """``build``: a snapshot from a folder, a BEIR dataset or a JSONL file."""
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
    add_folder_args(p)
    add_common(p)
    p.set_defaults(func=cmd_build)


def add_search(sub: Any) -> None:
    """``search``: queries answered from a snapshot in this process."""
    p = sub.add_parser("search", help="answer queries from an index")
    p.add_argument("--index", required=True)
    p.add_argument("query", nargs="+")
    p.add_argument("-k", type=int, default=5)
    p.add_argument("--tenant", default="")
    p.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE", help="metadata equality filter")
    p.add_argument("--stages", default="",
                   help="comma-separated subset of bm25,dense,late_interaction,cross_encoder (default: as configured)")
    p.add_argument("--json", action="store_true", help="one JSON object per query")
    add_common(p)
    p.set_defaults(func=cmd_search)


def add_eval(sub: Any) -> None:
    """``eval``: BEIR evaluation per stage."""
    p = sub.add_parser("eval", help="BEIR evaluation: nDCG@10, Recall@100, HNSW recall, QPS per stage")
    p.add_argument("--dataset", required=True, help="BEIR dataset folder (corpus, queries.jsonl, qrels/)")
    p.add_argument("--index", help="index root; built there if it has no CURRENT (default: a temporary folder)")
    p.add_argument("--split", default="test")
    p.add_argument("--json", help="write the figures as JSON here")
    p.add_argument("--run-dir", help="write one TREC run file per stage here")
    p.add_argument("--limit", type=int, default=0, help="only the first N queries")
    p.add_argument("--rerank", default="", help="comma-separated subset of late_interaction,cross_encoder,cascade "
                                                "to evaluate (default: every one the index and config allow)")
    p.add_argument("--by-type", action="store_true", help="also per query type (queries.jsonl's metadata.type, the "
                   "query-type suite of bench.querytypes): each stage's nDCG@10, success@1, success@3, MRR@10, and the "
                   "served stage's gap to the best single stage of each type")
    p.add_argument("--quiet", action="store_true")
    add_common(p)
    p.set_defaults(func=cmd_eval)


def add_models_and_train(sub: Any) -> None:
    """``models`` (export, quantize) and ``train`` (the checkout's, torch imported only when it runs)."""
    from index_builder.models.export import add_parser as add_models_parser

    add_models_parser(sub)
    if checkout_module("training") is None:
        checkout_only("train", "train the cross-encoder or late-interaction model")(sub)
    else:
        from training.cli import add_parser as add_train_parser  # it imports torch only when the command runs
        add_train_parser(sub)


def add_serve(sub: Any) -> None:
    """``serve``: the gRPC door and, with ``--http-port``, the HTTP door."""
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
    add_common(p)
    p.set_defaults(func=cmd_serve)


def add_migrate(sub: Any) -> None:
    """``migrate``: a snapshot copied into the configured engine."""
    p = sub.add_parser("migrate", help="copy a built snapshot into the configured engine backend ([backend] kind = "
                                       "\"qdrant\"), reusing its vectors")
    p.add_argument("--index", required=True, help="index root (CURRENT -> snapshot)")
    p.add_argument("--replace", action="store_true", help="overwrite an existing collection of that name")
    add_common(p)
    p.set_defaults(func=cmd_migrate)


def add_front(sub: Any) -> None:
    """``front``: nginx before the replicas."""
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
    add_common(p)
    p.set_defaults(func=cmd_front)


def add_engine(sub: Any) -> None:
    """``engine``: the development Qdrant host."""
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
    add_common(p)
    p.set_defaults(func=cmd_engine)


def add_query(sub: Any) -> None:
    """``query``: Retrieve on a running server."""
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


def add_ask(sub: Any) -> None:
    """``ask``: Generate on a running server."""
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


def add_index(sub: Any) -> None:
    """``index tokens`` and ``index rebuild``."""
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
    add_common(q)
    q.set_defaults(func=cmd_index_tokens)
    r = isub.add_parser("rebuild", help="build a new snapshot from the document store (a running server also "
                                        "rebuilds by itself, or on the Rebuild call)")
    r.add_argument("--index", required=True, help="index root")
    r.add_argument("--store", required=True, help="document store (SQLite)")
    r.add_argument("--quiet", action="store_true")
    add_common(r)
    r.set_defaults(func=cmd_index_rebuild)


def add_bench(sub: Any) -> None:
    """``bench NAME``: each benchmark parses its own options."""
    if checkout_module("bench") is None:
        checkout_only("bench", "benchmarks and tuning studies")(sub)
    else:
        from bench import SCRIPTS
        p = sub.add_parser("bench", help="benchmarks and tuning studies (from the repository checkout; bench/README.md)")
        bsub = p.add_subparsers(dest="bench_command", required=True)
        for name, (module, what) in SCRIPTS.items():  # each parses its own options: hybridrag bench NAME --help
            q = bsub.add_parser(name, add_help=False, help=f"{what} (python -m {module})")
            q.set_defaults(func=cmd_bench, verbose=False, bench_args=[])


def add_quickstart(sub: Any) -> None:
    """``quickstart``: the sample corpus, end to end."""
    p = sub.add_parser("quickstart", help="build the sample corpus index, answer sample queries, generate an answer")
    p.add_argument("--out", default="indexes/sample")
    p.add_argument("--no-generate", action="store_true", help="skip the generated answer (embedded llama.cpp)")
    add_common(p)
    p.set_defaults(func=cmd_quickstart)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridrag", description="Hybrid BM25 + dense retrieval service")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (add_build, add_sync, add_search, add_eval, add_models_and_train, add_serve, add_migrate, add_front,
                add_engine, add_query, add_ask, add_index, add_bench, add_quickstart):  # in --help's order
        add(sub)
    return parser
