"""Issue 51, serving side: a name UTF-8 cannot encode (a lone surrogate, as a Latin-1 file name decoded with
surrogateescape leaves it) is refused by every writer that checks (a JSONL build, the store, both doors' Upsert),
and one that somehow is stored anyway (a snapshot built before the check, a row written into the store's file by
another tool) is answered escaped, never a 500 (it was INTERNAL on both doors for every Retrieve that included it);
ListDocuments applies Retrieve's filter limits (998 filters answered 500). A real ``hybridrag serve`` process."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import grpc
import httpx
import pytest

from hybridrag.cli import main
from index_builder.build.builder import build_snapshot
from index_builder.types import Document
from retrieval.api import retriever_pb2 as pb
from retrieval.client import ClientOptions, RetrieverClient, RetryPolicy
from retrieval.errors import InvalidRequest
from retrieval.live.store import DocumentStore
from tests.helpers import SAMPLE, ServeProcess

NO_RETRY = ClientOptions(retry=RetryPolicy(attempts=1), timeout=120)
SNAPSHOT_TEXT = "The Zygomorph cafe serves quinoa pancakes with cardamom syrup at dawn."
STORE_TEXT = "A xylophone recital by the marimba quartet takes place in the planted cafe tonight."


def _lines(n: int = 12) -> list[str]:
    return SAMPLE.joinpath("corpus.jsonl").read_text(encoding="utf-8").splitlines()[:n]


def test_a_jsonl_build_refuses_the_line_or_skips_it(tmp_path, capsys):
    """``hybridrag build --corpus file.jsonl`` (and ``--store``): the line is a one-line error naming file, line and
    id (exit 2, nothing written to the store), or skipped with ``--skip-bad``. Before: built, or crashed mid-batch."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join([*_lines(), json.dumps({"_id": "caf\udce9", "text": SNAPSHOT_TEXT})]) + "\n")
    store = tmp_path / "store.db"
    for extra in ([], ["--store", str(store)]):
        assert main(["build", "--corpus", str(corpus), "--out", str(tmp_path / "idx"), "--quiet", *extra]) == 2
        err = capsys.readouterr().err
        assert f"{corpus}:13:" in err and "'caf\\udce9' holds a lone surrogate" in err and "Traceback" not in err
    assert DocumentStore(store).count() == 0  # refused before the first batch
    assert main(["build", "--corpus", str(corpus), "--out", str(tmp_path / "idx"), "--store", str(store), "--quiet",
                 "--skip-bad"]) == 0
    assert "skipped 1 bad line(s)" in capsys.readouterr().err
    assert DocumentStore(store).count() == 12


@pytest.fixture(scope="module")
def planted(tmp_path_factory, config, embedder):
    """A served snapshot holding an id with a lone surrogate (built from a Python caller's Documents, as a folder
    walk handed them before names were checked) and a store holding a row whose id is not UTF-8 at all (written
    into its file, after the snapshot: replayed into the live buffer at start)."""
    root: Path = tmp_path_factory.mktemp("planted")
    store = DocumentStore(root / "store.db")
    store.upsert([*(json.loads(line) for line in _lines()),  # and an id listed after the planted one
                  {"_id": "store-zz", "text": "Zebras graze the savanna.", "tenant": "acme"}])
    seq, docs = store.snapshot()
    store.close()
    bad = Document(id="caf\udce9", title="Cafe menu", text=SNAPSHOT_TEXT, tenant="acme",
                   metadata={"source": "caf\udce9"})
    build_snapshot([*docs, bad], root / "index", config.build_config(), embedder, covered_seq=seq)
    db = sqlite3.connect(root / "store.db")
    db.execute("INSERT INTO documents (id, tenant, title, text, metadata, seq) VALUES (CAST(? AS TEXT), 'acme', "
               "CAST(? AS TEXT), ?, CAST(? AS TEXT), ?)",
               (b"store-caf\xe9", b"T\xe9", STORE_TEXT, b'{"source": "caf\xe9"}', seq + 1))
    db.execute("INSERT INTO changes (seq, op, id, tenant) VALUES (?, 'upsert', CAST(? AS TEXT), 'acme')",
               (seq + 1, b"store-caf\xe9"))
    db.commit()
    db.close()
    server = ServeProcess(["--index", str(root / "index"), "--store", str(root / "store.db"), "--http-port", "0"],
                          clean_env=True, env={"HYBRIDRAG_GENERATION__EMBEDDED__ENABLED": "false"})
    (url,) = re.findall(r"HTTP on (http://\S+)", server.text())
    yield server, url, root
    assert server.stop() == 0


def test_writers_refuse_it(planted):
    server, url, root = planted
    # the store, from a Python caller
    with pytest.raises(InvalidRequest, match=r"document 0 \('caf\\udce9'\).*lone surrogate"):
        DocumentStore(root / "store.db").upsert([{"_id": "caf\udce9", "text": "x", "tenant": "acme"}])
    # gRPC Upsert: protobuf clients cannot send it; raw bytes that are not UTF-8 in the id are INVALID_ARGUMENT
    raw = pb.UpsertRequest(documents=[pb.Document(id="cafX", text="some text", tenant="acme")]).SerializeToString()
    with grpc.insecure_channel(server.target) as channel:
        call = channel.unary_unary("/hybridrag.v1.Retriever/Upsert")
        with pytest.raises(grpc.RpcError) as e:
            call(raw.replace(b"cafX", b"caf\xe9"), timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # HTTP POST /v1/documents: the JSON escape, and the raw byte
    for body in (b'{"documents": [{"id": "caf\\udce9", "text": "x", "tenant": "acme"}]}',
                 b'{"documents": [{"id": "caf\xe9", "text": "x", "tenant": "acme"}]}'):
        r = httpx.post(url + "/v1/documents", content=body, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 400, r.text
    assert "Traceback" not in server.text()


def test_a_stored_id_that_somehow_holds_one_is_answered_escaped(planted):
    server, url, _ = planted
    cases = [("quinoa pancakes with cardamom syrup", "caf\\udce9", "Cafe menu", {"source": "caf\\udce9"}),
             ("xylophone recital by the marimba quartet", "store-caf\\udce9", "T\ufffd", {"source": "caf\\udce9"})]
    with RetrieverClient(server.target, NO_RETRY) as c:
        for query, doc_id, title, metadata in cases:
            for tenant in ("", "acme"):
                g = c.retrieve(query, 3, tenant=tenant, bypass_cache=True, highlights=True)
                first = g.passages[0]
                assert (first.doc_id, first.title, dict(first.metadata)) == (doc_id, title, metadata)
                r = httpx.post(url + "/v1/retrieve", json={"query": query, "top_k": 3, "tenant": tenant,
                                                           "highlights": True}, timeout=60)
                assert r.status_code == 200 and r.json()["passages"][0]["doc_id"] == doc_id, r.text
        listed = [d.id for d in c.list_documents(tenant="acme").documents]
        assert listed[-2:] == ["store-caf\\udce9", "store-zz"]
        one_by_one, after = [], ""
        for _ in range(40):  # paging one document at a time moves past it (its escaped id passed back as 'after')
            page = c.list_documents(tenant="acme", after=after, limit=1)
            one_by_one += [d.id for d in page.documents]
            if not (after := page.next_after):
                break
        assert one_by_one == listed
        page = c.list_documents(tenant="acme", filters={"source": "nothing"})
        assert not page.documents
    r = httpx.get(url + "/v1/documents", params={"tenant": "acme"}, timeout=60)
    assert r.status_code == 200 and [d["id"] for d in r.json()["documents"]] == listed
    assert "Traceback" not in server.text() and "failed" not in server.text()


@pytest.mark.parametrize(("filters", "message"), [
    ({f"k{i}": "v" for i in range(998)}, "at most 16 metadata filters are allowed, got 998"),
    ({f"k{i}": "v" for i in range(17)}, "at most 16 metadata filters are allowed, got 17"),
    ({"source": "v" * 1001}, "has a value of 1001 characters; at most 1000"),
    ({"source": "a\x00b"}, "control character"),
    ({"sou\x01rce": "v"}, "metadata key"),
    ({"": "v"}, "metadata filter keys must be non-empty"),
])
def test_listing_applies_the_request_limits(planted, filters, message):
    """Issue 51: 998 filters answered 500 (SQLite's expression depth), with a traceback logged per call; now
    Retrieve's limits (16 filters, values of 1,000 characters, no control characters) on both doors."""
    server, url, _ = planted
    mark = server.mark()
    with RetrieverClient(server.target, NO_RETRY) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.list_documents(tenant="acme", filters=filters)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in e.value.details()
    r = httpx.get(url + "/v1/documents", params=[("tenant", "acme")] + [("filter", f"{k}={v}") for k, v in filters.items()],
                  timeout=60)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    assert not [line for line in server.since(mark) if "Traceback" in line or "failed" in line]
