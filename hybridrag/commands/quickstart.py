"""``quickstart``: the sample corpus built, three of its queries answered, one answer generated."""

from __future__ import annotations

import argparse
from pathlib import Path

from hybridrag.commands.build import cmd_build
from hybridrag.commands.common import config_from, open_pipeline
from hybridrag.commands.search import cmd_search

SAMPLE_DIR = Path(__file__).resolve().parents[2] / "data" / "sample"


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
        status = _quickstart_answer(out, config_from(args), queries[0])
    return status


def _quickstart_answer(index_dir: Path, config, question: str) -> int:
    import asyncio

    from index_builder.errors import HybridRagError
    from retrieval.generation.generator import Passages, Stats, Token, open_generator

    pipeline = open_pipeline(index_dir, config)
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
