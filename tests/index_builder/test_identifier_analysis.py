"""``[analyzer] identifiers``: a joined identifier is kept whole beside its parts, text without one is analysed as
before, and the manifest records the option: a server analyses queries as its index was built, and warns when that is not
the configured analysis (issue 53)."""

from __future__ import annotations

import pytest

from index_builder.build.builder import build_snapshot
from index_builder.documents.analysis import Analyzer
from index_builder.errors import SnapshotError
from index_builder.settings import AnalyzerConfig
from retrieval.config import load_config
from retrieval.search.index import SearchIndex

PLAIN = Analyzer(AnalyzerConfig(identifiers=False))
IDENT = Analyzer(AnalyzerConfig(identifiers=True))


@pytest.mark.parametrize(("typed", "whole"), [
    ("--preserve-root", "preserve-root"),
    ("ERR_CONNECTION_RESET", "err_connection_reset"), ("USE_CURL_FOR_IMAP_SEND", "use_curl_for_imap_send"),
    ("opts.worker_threads", "opts.worker_threads"), ("git-cat-file", "git-cat-file"),
])
def test_an_identifier_is_kept_whole_and_its_parts_still_match(typed, whole):
    terms = IDENT(f"See {typed}, then retry.")
    assert whole in terms
    # every part as the plain analysis gives it for the words written apart: a partial query still matches
    parts = PLAIN(typed.replace(".", " ").replace("_", " ").replace("-", " "))
    assert parts and set(parts) <= set(terms)
    # typed with or without its dashes, or in another case, the query holds the same whole term
    assert whole in IDENT(typed.upper()) and whole in IDENT(typed.lstrip("-"))


def test_text_without_identifiers_is_analysed_as_before():
    """Dotted names too: Lucene keeps ``os.path.join`` one term, and split they cost the default pipeline."""
    text = ("The cats' running quickly, don't they? Version v2.14.6 costs 3.5 dollars; ede8d89bb1 is a commit; "
            "call os.path.join.")
    assert IDENT(text) == PLAIN(text)
    assert "v2.14.6" in IDENT(text) and "3.5" in IDENT(text)  # versions and decimals stay one term
    assert "os.path.join" in IDENT(text)
    assert IDENT.batch([text, "ERR_X"]) == [IDENT(text), IDENT("ERR_X")]


def test_what_the_plain_analysis_matched_still_matches():
    text = "Install ca-certificates.crt, set opts.worker_threads and run git-cat-file --batch-check."
    plain, ident = PLAIN(text), IDENT(text)
    assert {t for t in plain if "." not in t} <= set(ident)
    assert {"certificates.crt", "opts.worker"} <= set(ident)  # the plain analysis's dotted terms, kept whole


def test_wholes_are_bounded_and_unstemmed():
    assert "running-shoes" in IDENT("running-shoes") and "run" in IDENT("running-shoes")
    long = "_".join(["segment"] * 20)  # longer than MAX_WHOLE: the parts only
    assert all("_" not in t for t in IDENT(long))
    assert IDENT("____ --- ...") == []


def test_the_manifest_names_the_option_and_an_old_manifest_reads_as_off():
    assert PLAIN.settings()["tokenizer"] == "lucene-standard-like"  # what every snapshot built before records
    assert Analyzer.from_settings(PLAIN.settings()).config == AnalyzerConfig(identifiers=False)
    assert Analyzer.from_settings(IDENT.settings()).config.identifiers is True
    old = {"tokenizer": "lucene-standard-like", "lowercase": True, "stopwords": "lucene", "stemmer": "porter"}
    assert Analyzer.from_settings(old)("ERR_CONNECTION_RESET") == ["err", "connect", "reset"]


def test_a_server_serves_an_index_with_the_analysis_it_was_built_with(tmp_path, sample_docs, config, embedder, caplog):
    """An index built before the option (or with it off) still serves under the default configuration, its queries
    analysed as it was built, with a warning naming both; never a refusal that would stop every existing index."""
    off = load_config(environ={}, overrides={"analyzer": {"identifiers": False}})
    on = load_config(environ={}, overrides={"analyzer": {"identifiers": True}})
    build_snapshot(sample_docs[:20], tmp_path, on.build_config(), embedder)
    with caplog.at_level("WARNING", logger="hybridrag.index"):
        index = SearchIndex.load(tmp_path, off, embedder)
    assert index.bm25.analyzer.config.identifiers  # the snapshot's analysis, not the configuration's
    assert "tokenizer 'lucene-standard-like+identifiers', the configuration asks for 'lucene-standard-like'" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hybridrag.index"):
        index = SearchIndex.load(tmp_path, on, embedder)
    assert index.bm25.analyzer.config.identifiers and "tokenizer" not in caplog.text
    other = load_config(environ={}, overrides={"analyzer": {"stemmer": "none"}})
    with pytest.raises(SnapshotError, match="analyzer.stemmer"):  # the rest of the analysis is still checked
        SearchIndex.load(tmp_path, other, embedder)
