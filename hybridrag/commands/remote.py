"""``query`` and ``ask``: a running server asked over gRPC (the API key from ``HYBRIDRAG_API_KEY``)."""

from __future__ import annotations

import argparse
import json
import os
import sys


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
