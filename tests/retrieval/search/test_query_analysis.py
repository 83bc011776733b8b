"""Queries as people type them, on real text (issue 53): a folder of this machine's Debian documentation, read from
/usr/share/doc at test time (never copied into the repository), indexed by the real build with the real model.

- An identifier that occurs in exactly one file, its parts scattered in others: with ``[analyzer] identifiers`` BM25
  puts that file first; with the plain analysis it does not always.
- A quoted phrase that occurs in exactly one file, its words in many: the served default puts that file first with
  ``first_stage.phrases``, and ``require`` keeps only files that hold it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import grpc
import httpx
import pytest

from index_builder.build.builder import build_snapshot
from index_builder.documents.analysis import Analyzer
from index_builder.settings import AnalyzerConfig
from index_builder.types import Document
from retrieval.client import ClientOptions, RetrieverClient, RetryPolicy
from retrieval.config import ServerConfig, load_config
from retrieval.search.index import SearchIndex
from retrieval.search.pipeline import Pipeline
from retrieval.search.semantic_cache import SemanticCache
from retrieval.search.stages.phrases import MAX_PHRASES, parse_phrases
from retrieval.serving.server import BackgroundServer
from retrieval.serving.settings import HttpConfig

DOC = Path("/usr/share/doc")
FILES = 40
IDENTIFIER = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)+\b|\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b"
                        r"|\b[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+\b(?!\.\w)")
PHRASE = re.compile(r"(?:[A-Za-z]{3,} ){3}[A-Za-z]{3,}")


def _debian_docs() -> list[Document]:
    """The first ``FILES`` readable text files of 2-16 KB under /usr/share/doc that hold an identifier (sorted
    walk: the same files on the same machine)."""
    docs: list[Document] = []
    for root, dirs, names in os.walk(DOC):
        dirs.sort()
        for name in sorted(names):
            path = Path(root) / name
            if path.is_symlink() or name.endswith((".gz", ".html")) or name == "copyright" or \
                    not 2_000 <= path.stat().st_size <= 16_000:
                continue
            try:
                text = path.read_text("utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if IDENTIFIER.search(text):
                docs.append(Document(id=str(path.relative_to(DOC)), text=text))
            if len(docs) == FILES:
                return docs
    return docs


def _unique(docs: list[Document], pattern: re.Pattern[str], min_files: int) -> dict[str, str]:
    """Strings matching ``pattern`` that exactly one document holds (in any case), each of whose analysed words
    ``min_files`` other documents hold: query -> the document's id."""
    plain = Analyzer(AnalyzerConfig(identifiers=False))
    lower = {d.id: " ".join(d.text.lower().split()) for d in docs}
    words = {d.id: set(plain(re.sub(r"[._-]+", " ", d.text))) for d in docs}
    out = {}
    for d in docs:
        for found in sorted(set(pattern.findall(d.text))):
            key = " ".join(found.lstrip("-").lower().split())
            parts = plain(re.sub(r"[._-]+", " ", found))
            if len(parts) < 2 or sum(key in t for t in lower.values()) != 1:
                continue
            if all(sum(p in w for i, w in words.items() if i != d.id) >= min_files for p in parts):
                out[found] = d.id
    return out


@pytest.fixture(scope="module")
def debian(tmp_path_factory, embedder):
    """(documents, {identifiers: bool -> index root}): one build per analysis (the second reuses the encodings)."""
    if not DOC.is_dir():
        pytest.skip("no /usr/share/doc on this machine: the real-text folder is read from it")
    docs = _debian_docs()
    if len(docs) < FILES:
        pytest.skip(f"only {len(docs)} text files with identifiers under /usr/share/doc; the test needs {FILES}")
    roots = {}
    for identifiers in (False, True):
        root = tmp_path_factory.mktemp(f"debian-{identifiers}")
        if identifiers:
            shutil.copytree(roots[False], root, dirs_exist_ok=True)
        config = load_config(environ={}, overrides={"analyzer": {"identifiers": identifiers}})
        build_snapshot(docs, root, config.build_config(), embedder)
        roots[identifiers] = root
    return docs, roots


def _index(debian, embedder, identifiers: bool) -> SearchIndex:
    config = load_config(environ={}, overrides={"analyzer": {"identifiers": identifiers}})
    return SearchIndex.load(debian[1][identifiers], config, embedder)


def test_an_identifier_in_one_file_is_bm25s_first_hit(debian, embedder):
    probes = _unique(debian[0], IDENTIFIER, min_files=1)
    if len(probes) < 5:
        pytest.skip(f"only {len(probes)} identifiers that one file holds in this machine's documentation")
    first = {}
    for identifiers in (False, True):
        index = _index(debian, embedder, identifiers)
        first[identifiers] = [q for q, d in probes.items()
                              if index.documents[int(index.bm25.search(q, 1).doc[0])].id == d]
    # the plain analysis splits each identifier into its words, so a file with the words scattered can win
    assert len(first[False]) < len(probes)
    assert len(first[True]) >= 0.95 * len(probes), sorted(set(probes) - set(first[True]))
    assert set(first[False]) <= set(first[True])


def test_a_quoted_phrase_puts_the_one_file_that_holds_it_first(debian, embedder, config):
    index = _index(debian, embedder, False)
    per_file: dict[str, int] = {}
    probes = {}
    for q, d in _unique(debian[0], PHRASE, min_files=3).items():  # two phrases a file at most, 30 in all
        if per_file.setdefault(d, 0) < 2 and len(probes) < 30:
            per_file[d] += 1
            probes[q] = d
    if len(probes) < 5:
        pytest.skip(f"only {len(probes)} phrases that one file holds in this machine's documentation")
    top = {}
    for mode in ("off", "boost", "require"):
        settings = load_config(environ={}, overrides={"first_stage": {"phrases": mode}})
        pipe = Pipeline(index, embedder, settings)
        try:
            top[mode] = {q: [index.documents[d].id for d in pipe.search(f'"{q}"', 3, use_cache=False).hits.doc]
                         for q in probes}
        finally:
            pipe.close()
    hit = {mode: sum(r[:1] == [probes[q]] for q, r in top[mode].items()) for mode in top}
    assert hit["boost"] == len(probes) and hit["require"] == len(probes)
    assert all(len(r) == 1 for r in top["require"].values())  # only the one file holds the phrase
    assert hit["off"] <= hit["boost"]


def test_quoted_queries_keep_the_doors_limits(pipeline):
    """Quotes change nothing of what a door refuses: over ``max_query_chars`` is a 400 / INVALID_ARGUMENT; at the
    limit, quotes however many (balanced or not) are answered, and at most MAX_PHRASES phrases are read."""
    limit = pipeline.config.first_stage.max_query_chars
    many = ('"bee dance" ' * limit)[:limit]
    assert len(parse_phrases(many)) <= MAX_PHRASES and parse_phrases('"' * limit) == []
    server = BackgroundServer(pipeline, ServerConfig(port=0), http=HttpConfig(port=0))
    try:
        url = server.http_url + "/v1/retrieve"
        for query in (many, '"' * limit, '"bees' * (limit // 5), '"how do bees dance"'):
            r = httpx.post(url, json={"query": query, "top_k": 3}, timeout=120)
            assert r.status_code == 200, r.text[:300]
        r = httpx.post(url, json={"query": '"' * (limit + 1), "top_k": 3}, timeout=60)
        assert r.status_code == 400 and f"at most {limit} are allowed" in r.json()["error"]["message"]
        with RetrieverClient(server.target, ClientOptions(retry=RetryPolicy(attempts=1), timeout=120)) as c:
            assert c.retrieve('"how do bees dance"', 3).passages
            with pytest.raises(grpc.RpcError) as e:
                c.retrieve('"bees"' * (limit // 6 + 1), 3)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "are allowed" in e.value.details()
    finally:
        server.stop()


def test_a_quoted_query_is_not_answered_from_the_unquoted_ones_cache(sample_index, embedder, config):
    """The semantic cache would take the two for one query (same words, near-identical embeddings); the phrases
    are part of its scope."""
    pipe = Pipeline(sample_index, embedder, config, cache=SemanticCache(config.cache))
    try:
        pipe.search("how do honey bees dance", 5)
        assert pipe.search("how do honey bees dance ", 5).cache_hit  # a near repeat is answered from the cache
        assert not pipe.search('how do "honey bees dance"', 5).cache_hit
    finally:
        pipe.close()
